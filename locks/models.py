import logging
from datetime import datetime, timedelta
from functools import reduce
from operator import or_
from typing import NamedTuple

from django.db import IntegrityError, ProgrammingError, connections, models, transaction
from django.db.models import Case, DateTimeField, ExpressionWrapper, F, Max, Q, Value, When
from django.db.models.functions import Now
from django.utils import timezone


class Answer(NamedTuple):
    """What an outcome means to every interface (``ANSWERS``)."""

    exit_code: int  # run_job and its aliases, cron
    http_status: int  # the trigger
    level: int  # the run's log line
    recorded: str = ""  # what JobRun.status and the log line say, when not the outcome itself
    reported: str = ""  # what the trigger says, when not what is recorded


class Outcome(models.TextChoices):
    """What a run came to: the one outcome vocabulary (stored: ``RECORDED``; answers: ``ANSWERS``)."""

    RUNNING = "running", "running"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    UNKNOWN = "unknown", "unknown (COMMIT unanswered)"
    LOST_LOCK = "lost_lock", "lost lock"
    RELEASED = "released", "force-released"
    ABANDONED = "abandoned", "abandoned"
    SKIPPED = "skipped", "skipped"
    # Never stored: each is recorded and logged as the one its row names.
    SUCCEEDED_THEN_FAILED = "succeeded_then_failed", "succeeded (its fenced write committed), then failed"
    TICK_AHEAD = "tick_ahead", "skipped: tick too far ahead"  # nothing stored: most likely this host's clock
    UNREACHABLE = "unreachable", "skipped: database unreachable"  # costs no attempt; asked again
    REFUSED = "refused", "skipped: the scheduler's tick refused as too far ahead"
    FAILED_EXPECTED = "failed_expected", "failed as its job expects"  # an outside system
    FAILED_DATABASE = "failed_database", "failed: database error"
    BROKE = "broke", "the scheduler's ask raised, or its process died"
    # The ledger's states of a slot (locks.status), with succeeded, running, failed and unknown.
    MISSED, PAUSED, PENDING = ("missed", "missed"), ("paused", "paused"), ("pending", "pending")

    @property
    def answer(self) -> Answer:
        return ANSWERS[self]

    @property
    def recorded(self) -> "Outcome":
        """The outcome a run that came to this one records and logs."""
        return Outcome(ANSWERS[self].recorded or self) if self in ANSWERS else self

    @property
    def reported(self) -> "Outcome":
        """The outcome the trigger answers for this one (lost_lock is a failure to a caller)."""
        return Outcome(ANSWERS[self].reported or self.recorded)


# What each outcome a run can come to means to every interface, in one place.
ANSWERS = {
    Outcome.SUCCEEDED: Answer(0, 200, logging.INFO),
    Outcome.SUCCEEDED_THEN_FAILED: Answer(0, 200, logging.ERROR, Outcome.SUCCEEDED),
    Outcome.SKIPPED: Answer(0, 409, logging.INFO),
    Outcome.TICK_AHEAD: Answer(0, 409, logging.WARNING, Outcome.SKIPPED),
    Outcome.UNREACHABLE: Answer(0, 503, logging.WARNING, Outcome.SKIPPED),
    Outcome.REFUSED: Answer(0, 409, logging.INFO, Outcome.SKIPPED),
    Outcome.FAILED: Answer(1, 500, logging.ERROR),  # a bug (its traceback is kept) or a block rolled back
    Outcome.FAILED_EXPECTED: Answer(1, 502, logging.ERROR, Outcome.FAILED),
    Outcome.FAILED_DATABASE: Answer(1, 503, logging.ERROR, Outcome.FAILED),
    Outcome.LOST_LOCK: Answer(1, 500, logging.ERROR, reported=Outcome.FAILED),  # the run keeps the detail
    Outcome.UNKNOWN: Answer(1, 503, logging.ERROR),  # the COMMIT got no answer: the next run resolves it
    Outcome.BROKE: Answer(1, 500, logging.ERROR),
}
# What JobRun.status and SyncLock.last_status may hold: the first eight ("skipped" too, never stored).
RECORDED = [(o.value, o.label) for o in Outcome][:8]

# The states of a lease, judged by the database clock, each one filter (docs/architecture.md,
# "Lease states"): held is in force, heartbeat overdue or not; expired, its holder stopped without releasing.
FREE, HELD, EXPIRED, OVERDUE = "free", "held", "expired", "heartbeat overdue"

RELEASED_Q = Q(locked_until__isnull=True)
EXPIRED_Q = Q(locked_until__lt=Now())
IN_FORCE_Q = Q(locked_until__gte=Now())
# Two beats missed (more than 2/3 of the TTL since, as locked_until = heartbeat_at + ttl):
# now - heartbeat_at > 2 * (locked_until - now).
OVERDUE_Q = IN_FORCE_Q & Q(heartbeat_at__lt=Now() - (F("locked_until") - Now()) - (F("locked_until") - Now()))
STUCK_Q = EXPIRED_Q | OVERDUE_Q
# An operator's pause, on SyncLock (locks.operator); while paused_at is set no run acquires.
PAUSE_FIELDS = ("paused_by", "paused_at", "paused_note")


def now_plus(delta: timedelta) -> ExpressionWrapper:
    """The database's now plus ``delta`` (negative: in the past), for a filter or an update."""
    return ExpressionWrapper(Now() + Value(delta), output_field=DateTimeField())


def database_now() -> datetime:
    """The database's clock, in one query (an aggregate answers even when the table is empty)."""
    return SyncLock.objects.aggregate(now=Max(Now(), default=Now()))["now"]


class SyncLockQuerySet(models.QuerySet):
    def for_job(self, job: str) -> "SyncLockQuerySet":
        return self.filter(job_name=job)

    def free(self) -> "SyncLockQuerySet":
        """Leases a contender may take: never taken, released, or expired."""
        return self.filter(RELEASED_Q | EXPIRED_Q)

    def held(self) -> "SyncLockQuerySet":
        return self.filter(IN_FORCE_Q)

    def expired(self) -> "SyncLockQuerySet":
        return self.filter(EXPIRED_Q)

    def overdue(self) -> "SyncLockQuerySet":
        return self.filter(OVERDUE_Q)

    def stuck(self) -> "SyncLockQuerySet":
        """Expired or heartbeat overdue: what an operator may need to look at."""
        return self.filter(STUCK_Q)

    def with_state(self) -> "SyncLockQuerySet":
        """Annotate ``state`` (FREE, HELD, EXPIRED or OVERDUE) and ``db_now``."""
        return self.annotate(
            db_now=Now(),
            state=models.Case(
                models.When(RELEASED_Q, then=models.Value(FREE)),
                models.When(EXPIRED_Q, then=models.Value(EXPIRED)),
                models.When(OVERDUE_Q, then=models.Value(OVERDUE)),
                default=models.Value(HELD),
                output_field=models.CharField(),
            ),
        )


class SyncLock(models.Model):
    """One row per job: the lease and the last run's summary (written by ``lease`` and ``operator`` only)."""

    job_name = models.CharField("job", max_length=100, unique=True)
    holder = models.CharField(
        max_length=255,
        blank=True,
        default="",
        help_text="host:pid:suffix of the process that took the lease last.",
    )
    token = models.PositiveBigIntegerField(
        "fencing token",
        default=0,
        help_text="Grows by one on every acquisition and force release.",
    )
    acquired_at = models.DateTimeField(null=True, blank=True)
    locked_until = models.DateTimeField(
        null=True,
        blank=True,
        help_text="The lease ends here (database clock). Empty when released.",
    )
    heartbeat_at = models.DateTimeField(
        "last heartbeat", null=True, blank=True, help_text="Last renewal by the holder."
    )
    tick = models.DateTimeField(null=True, blank=True, help_text="The last scheduled slot that was claimed.")
    tick_done = models.BooleanField(
        "tick done",
        default=False,
        help_text="The run of the claimed tick succeeded; it is never run again. "
        "While false, a later run may claim the same tick again (a retry).",
    )
    committed_token = models.PositiveBigIntegerField(
        "committed token",
        null=True,
        blank=True,
        help_text="The fencing token of the last lease whose fenced write committed: how a run whose "
        "COMMIT answer was lost, or a holder that died after committing, is known to have succeeded.",
    )
    tick_attempts = models.PositiveIntegerField(
        "attempts of the tick",
        default=0,
        help_text="Runs that took the lease for the claimed tick, on every host; a tick gets at most "
        "1 + its retry delays. Back to 1 when a new tick is claimed.",
    )
    retry_at = models.DateTimeField(
        "next attempt not before",
        null=True,
        blank=True,
        help_text="After a failed attempt of the claimed tick, the next one may start from here "
        "(database clock). Empty: no wait.",
    )
    last_started_at = models.DateTimeField(null=True, blank=True)
    last_finished_at = models.DateTimeField(null=True, blank=True)
    last_status = models.CharField(max_length=20, choices=RECORDED, blank=True)
    last_error = models.TextField(blank=True)
    # An operator's pause (docs/architecture.md, "Operating the jobs").
    paused_at = models.DateTimeField(
        "paused at", null=True, blank=True, help_text="Paused since (database clock); empty: not paused."
    )
    paused_by = models.CharField(
        "paused by",
        max_length=200,
        blank=True,
        default="",
        help_text="Who paused it: admin:<user> or cli:<user>.",
    )
    paused_note = models.TextField(
        "pause note", blank=True, default="", help_text="Why, in the operator's words."
    )
    # Run now (locks.operator.run_now).
    run_requested_at = models.DateTimeField(
        "run requested at",
        null=True,
        blank=True,
        help_text="An operator asked for a run now (database clock); empty once that run has started and ended.",
    )
    run_requested_by = models.CharField(
        "run requested by",
        max_length=200,
        blank=True,
        default="",
        db_default="",
        help_text="Who asked: admin:<user>.",
    )

    # The database history the last lease was granted in (rule 16); empty but on PostgreSQL.
    timeline = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="The database's WAL timeline when the last lease was granted."
    )
    system_id = models.PositiveBigIntegerField(
        "database system id", null=True, blank=True, help_text="The cluster it was granted on."
    )
    # The last failover a lease found (rule 16).
    failover_note = models.TextField("last failover", blank=True, default="", db_default="")
    failover_through = models.DateTimeField(
        null=True, blank=True, help_text="Slots at or before this may have run on the old primary too."
    )

    created_at = models.DateTimeField(
        "first seen",
        default=timezone.now,
        help_text="When the row was created (the job's first run, pause or check): check_jobs judges its slots from here.",
    )

    objects = SyncLockQuerySet.as_manager()

    class Meta:
        verbose_name = "job lock"
        ordering = ["job_name"]
        permissions = [
            ("force_release_synclock", "Can force-release a job lock"),
            ("pause_synclock", "Can pause and resume a job"),
            ("run_synclock", "Can run a job now"),
        ]

    def __str__(self) -> str:
        return self.job_name


class JobRunQuerySet(models.QuerySet):
    def for_job(self, job: str) -> "JobRunQuerySet":
        return self.filter(job_name=job)

    def succeeded(self) -> "JobRunQuerySet":
        return self.filter(status=Outcome.SUCCEEDED)

    def unsettled(self, *, before, committed) -> "JobRunQuerySet":
        """Runs of tokens before ``before`` still ``running``, or ``unknown`` from the last committed
        token ``committed`` on: what a new lease settles (rule 15)."""
        unknown = Q(status=Outcome.UNKNOWN, token__gte=committed)
        return self.filter(Q(status=Outcome.RUNNING) | unknown, token__lt=before)


class JobRun(models.Model):
    """One row per attempt that got the lease."""

    job_name = models.CharField("job", max_length=100)
    tick = models.DateTimeField(null=True, blank=True, help_text="Empty for forced runs.")
    attempt = models.PositiveIntegerField(
        null=True, blank=True, help_text="Its number among the attempts of its tick; empty for forced runs."
    )
    holder = models.CharField(max_length=255)
    token = models.PositiveBigIntegerField("fencing token")
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=20, choices=RECORDED, default=Outcome.RUNNING)
    stats = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)
    requested_by = models.CharField(
        "requested by",
        max_length=200,
        blank=True,
        default="",
        help_text="Who started it: admin:<user>, cli, cron, scheduler or trigger.",
    )
    traceback = models.TextField(
        blank=True, default="", help_text="An unexpected exception's traceback (its end, if it was longer)."
    )
    timeline = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="The database's WAL timeline its lease was granted on (PostgreSQL)."
    )
    system_id = models.PositiveBigIntegerField("database system id", null=True, blank=True)
    failover = models.TextField(
        blank=True,
        default="",
        db_default="",
        help_text="A failover this run met: it was lost with the old primary, or it is the first run "
        "after one (its slot may have run on the old primary too).",
    )

    objects = JobRunQuerySet.as_manager()

    class Meta:
        verbose_name = "job run"
        ordering = ["-started_at"]
        indexes = [
            models.Index(fields=["job_name", "-started_at"], name="jobrun_job_started"),
            # For the claim (``unsettled``), a job's last success and its ledger: no scan of its history.
            models.Index(fields=["job_name", "status", "token"], name="jobrun_job_status_token"),
            models.Index(fields=["job_name", "status", "finished_at"], name="jobrun_job_status_finished"),
            models.Index(fields=["job_name", "tick"], name="jobrun_job_tick"),
        ]

    def __str__(self) -> str:
        token = f"{self.timeline}/{self.token}" if self.timeline is not None else self.token
        return f"{self.job_name} #{token} ({self.status})"


class Throttle(models.Model):
    """One row per rate-limited key of the HTTP trigger, written only by ``locks.views``: the first
    claim a unique insert of the key (the primary key), every later one a conditional UPDATE."""

    key = models.CharField(
        max_length=200, primary_key=True, help_text="What is limited, e.g. send_digest:203.0.113.7."
    )
    until = models.DateTimeField(
        help_text="The next request for this key is refused before this (database clock)."
    )

    class Meta:
        verbose_name = "rate limit"

    def __str__(self) -> str:
        return self.key


class JobPause(models.Model):
    """One row per pause of a job, closed when it is resumed: the pause history the tick ledger reads
    (a slot whose chance passed entirely inside a pause is ``paused``). Written by ``locks.operator``."""

    job_name = models.CharField("job", max_length=100)
    paused_at = models.DateTimeField("paused at")
    paused_by = models.CharField("paused by", max_length=200)
    note = models.TextField(blank=True, default="")
    resumed_at = models.DateTimeField("resumed at", null=True, blank=True, help_text="Empty: still paused.")
    resumed_by = models.CharField("resumed by", max_length=200, blank=True, default="")

    class Meta:
        verbose_name = "job pause"
        ordering = ["-paused_at"]
        indexes = [models.Index(fields=["job_name", "-paused_at"], name="jobpause_job_paused")]

    def __str__(self) -> str:
        return f"{self.job_name} paused {self.paused_at:%Y-%m-%d %H:%M}"


class TaskOutbox(models.Model):
    """One row per slot of a task job whose backend is outside the database, written in the slot's
    fenced transaction; ``locks.tasks.dispatch`` sends it, ``locks.once`` marks its task done."""

    job_name = models.CharField("job", max_length=100)
    tick = models.DateTimeField(null=True, blank=True, help_text="Empty for forced runs.")
    token = models.PositiveBigIntegerField("fencing token", help_text="The attempt that wrote it last.")
    claimed_at = models.DateTimeField(null=True, blank=True, help_text="When a dispatcher took it to send.")
    task_id = models.CharField(max_length=255, blank=True, default="", help_text="Empty: not sent yet.")
    done_at = models.DateTimeField(null=True, blank=True, help_text="When its task's body committed.")

    class Meta:
        verbose_name = "task outbox row"
        constraints = [models.UniqueConstraint(fields=["job_name", "tick"], name="taskoutbox_job_tick")]

    def __str__(self) -> str:
        return f"{self.job_name} {self.tick} (token {self.token})"


# The tick's word while a copy of run_scheduler has claimed it and its ask has not ended.
CLAIMED = "claimed"
# The (database alias, table) pairs whose Tick table this process has seen (ORM path).
TICK_TABLES_SEEN: set[tuple[str, str]] = set()
# The database's now, and now plus %s seconds, in the SQL of the backends whose claim is one statement.
CLAIM_NOW = {
    "postgresql": ("STATEMENT_TIMESTAMP()", "STATEMENT_TIMESTAMP() + make_interval(secs => %s)"),
    "sqlite": (
        "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')",
        "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW', %s)",
    ),
}


class TickQuerySet(models.QuerySet):
    def claim(self, asks: list[tuple[str, datetime, timedelta]], *, holder: str) -> set[str]:
        """Claim each ``(job, tick, ttl)`` for ``holder`` until the database's now plus ``ttl``; the jobs
        whose tick it won (docs/architecture.md, "Claim before spawn")."""
        if not asks:
            return set()
        connection = connections[self.db]
        if connection.vendor in CLAIM_NOW:
            return self._claim_in_one(connection, asks, holder)
        # MongoDB would create the collection on insert, without the unique index that decides; a table
        # seen once stays (no listCollections on every wake).
        table = (connection.alias, self.model._meta.db_table)
        if table not in TICK_TABLES_SEEN:
            if table[1] not in connection.introspection.table_names():
                raise ProgrammingError(f"the table {table[1]} is missing: run `manage.py migrate`")
            TICK_TABLES_SEEN.add(table)
        won, claimable = set(), self.exclude(until=None)  # a tick closed for good: no copy wins it
        for job, tick, ttl in asks:
            mine = claimable.filter(Q(until__lte=Now()) | Q(holder=holder), job_name=job, tick=tick)
            first = Case(When(claims=0, then=Now()), default=F("created_at"))  # a new row's first claim
            claimed = {"holder": holder, "until": now_plus(ttl), "claims": F("claims") + 1, "status": CLAIMED}
            if mine.update(**claimed, created_at=first):
                won.add(job)
                continue
            try:  # a new tick's row in plain values (MongoDB cannot insert an expression): this holder's
                # until the slot's time plus ``ttl`` (if it stops here, the tick is not lost), then claimed
                with transaction.atomic(using=self.db):
                    self.create(
                        job_name=job, tick=tick, holder=holder, until=tick + ttl, claims=0, created_at=tick
                    )
            except IntegrityError:
                continue  # another copy's row: its claim stands
            if mine.update(**claimed, created_at=first):
                won.add(job)
        return won

    def _claim_in_one(self, connection, asks, holder: str) -> set[str]:
        now, plus = CLAIM_NOW[connection.vendor]
        table = connection.ops.quote_name(self.model._meta.db_table)
        values, rows = [], f"(%s, %s, %s, %s, {plus}, 1, {now})"
        for job, tick, ttl in asks:
            seconds = ttl.total_seconds()
            until = seconds if connection.vendor == "postgresql" else f"{seconds:+f} seconds"
            values += [job, connection.ops.adapt_datetimefield_value(tick), holder, CLAIMED, until]
        sql = (
            f"INSERT INTO {table} (job_name, tick, holder, status, until, claims, created_at) VALUES "
            f"{', '.join([rows] * len(asks))} ON CONFLICT (job_name, tick) DO UPDATE SET "
            "holder = excluded.holder, until = excluded.until, status = excluded.status, "
            f"claims = {table}.claims + 1 WHERE {table}.until IS NOT NULL "
            f"AND ({table}.until <= {now} OR {table}.holder = excluded.holder) RETURNING job_name"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, values)
            return {job for (job,) in cursor.fetchall()}

    def close(self, ends: list[tuple[str, datetime, str, bool]], *, holder: str) -> int:
        """After ``holder``'s asks ended, each ``(job, tick, status, again)``: its claim ends now when a
        copy may ask for it again, else for good (empty ``until``)."""
        if not ends:
            return 0
        keys = [(Q(job_name=job, tick=tick), status, again) for job, tick, status, again in ends]
        return self.filter(reduce(or_, (key for key, _status, _again in keys)), holder=holder).update(
            status=Case(*(When(key, then=Value(status)) for key, status, _again in keys)),
            until=Case(*(When(key, then=Now()) for key, _status, again in keys if again), default=None),
        )


class Tick(models.Model):
    """One row per slot of a job that a copy of ``run_scheduler`` claimed (docs/architecture.md,
    "Claim before spawn")."""

    job_name = models.CharField("job", max_length=100)
    tick = models.DateTimeField()
    holder = models.CharField(max_length=255, help_text="host:pid of the scheduler that claimed it last.")
    status = models.CharField(max_length=30, default=CLAIMED, help_text="claimed, or how its last ask ended.")
    until = models.DateTimeField(
        "claimed until",
        null=True,
        blank=True,
        help_text="Another copy may claim it from here (database clock); empty: no copy asks for it again.",
    )
    claims = models.PositiveIntegerField(default=1, help_text="How many times a copy claimed it.")
    # No db_default=Now(): MongoDB has no expression defaults (fields.E011); a claim sets the database's now.
    created_at = models.DateTimeField("first claimed", default=timezone.now)

    objects = TickQuerySet.as_manager()

    class Meta:
        verbose_name = "claimed tick"
        constraints = [models.UniqueConstraint(fields=["job_name", "tick"], name="tick_job_tick")]

    def __str__(self) -> str:
        return f"{self.job_name} {self.tick}"
