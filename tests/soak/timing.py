"""The soak's clock, in one place: the job's schedule and lease, and how long a run takes.

Read by the replicas' settings (``tests.soak.settings``), the nemesis (which aims faults at
the moments a run is under way) and the checker (which judges slots by the period). No
Django imports: the settings module imports this while the settings are being built.
"""

JOB = "soak"
PERIOD = 10  # seconds between slots
SCHEDULE = "* * * * * */10"  # croniter's sixth field is seconds: every 10 s
TTL = 4  # the lease, seconds; the heartbeat renews it every third
MAX_RUN_TIME = 30
RETRY_DELAYS = [2, 4]  # a failed slot is asked again 2 s, then 4 s later (by run_scheduler)
GRACE = 5  # LOCKS_SCHEDULER_GRACE: what a running job gets after SIGTERM
# A run: the job's work before it writes (a fetch), then its fenced write, which holds the
# lock row (and, on PostgreSQL, its row lock) this long before it commits.
WORK_SECONDS = 0.5
WRITE_SECONDS = 1.0
RUN_SECONDS = WORK_SECONDS + WRITE_SECONDS
# A slot with a live replica and a reachable database for at least this long of its period
# had a chance to run; with less (every replica down, the database out) the ``latest``
# catch-up policy may miss it.
MIN_CHANCE = RUN_SECONDS + 1.0

# The reminders part (``--reminders``): ``send_reminders`` on the soak job's slots, under a
# lease as short as its; an SMTP timeout short enough for a lost reply to cost a run 2 s; a
# claim that outlives the longest pause (TTL + 2 periods), so that only a dead run's claims
# expire while the soak lasts (contests.E005 wants it above three times EMAIL_TIMEOUT too).
REMINDERS_JOB = "send_reminders"
EMAIL_TIMEOUT = 2
REMINDER_CLAIM_TTL = 30
# Due through the soak, evenly spread: about 15 a run, so that a run sends for a second and
# a half (REPLY_DELAY each) and a kill aimed at it finds messages sent and not yet recorded.
REMINDERS_PER_MINUTE = 90
REPLY_DELAY = 0.1  # the stand-in's latency before each 250: a run's sending takes a while
