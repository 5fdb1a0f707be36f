"""Every difference between the database backends, in one place: bounded waits on a lock row, a
missing table or a locked row told by its error, and outside text made safe to log and store
(docs/architecture.md, "The rules": 11)."""

from __future__ import annotations

import re
import reprlib
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import TypeVar

from django.db import DatabaseError, Error, OperationalError, ProgrammingError, connections, transaction
from django.db.models import BigIntegerField, Func, QuerySet
from django.db.models.expressions import RawSQL
from django.db.models.sql import UpdateQuery

# --- bounded waits: NOWAIT, SKIP LOCKED, server timeouts ---------------------------------

T = TypeVar("T")

# PostgreSQL's SQLSTATEs: "could not obtain lock on row" (NOWAIT, lock_timeout), "relation does not
# exist", "cannot execute … in a read-only transaction".
LOCK_NOT_AVAILABLE, UNDEFINED_TABLE, READ_ONLY_SQL_TRANSACTION = "55P03", "42P01", "25006"


def _sqlstate(exc: BaseException) -> str | None:
    return getattr(exc.__cause__, "sqlstate", None)


def missing_table(exc: BaseException) -> bool:
    """Whether a database error says a table does not exist (by its text on SQLite)."""
    if not isinstance(exc, ProgrammingError | OperationalError):
        return False
    return _sqlstate(exc) == UNDEFINED_TABLE or "no such table" in str(exc).lower()


def row_locked(exc: BaseException) -> bool:
    """Whether a database error says the statement met a row another transaction has locked."""
    return _sqlstate(exc) == LOCK_NOT_AVAILABLE


def unlocked(rows: QuerySet, *, using: str, skip: bool) -> QuerySet:
    """``rows`` as a filter that never waits for a locked row (``skip``: ``FOR UPDATE SKIP LOCKED``,
    else ``NOWAIT``), in autocommit too, where Django's ``select_for_update()`` is refused."""
    features = connections[using].features
    if not (features.has_select_for_update_skip_locked and features.has_select_for_update_nowait):
        return rows
    sql, params = rows.values("pk").query.get_compiler(using=using).as_sql()  # Django's SQL, its params apart
    return rows.filter(pk__in=RawSQL(f"{sql} FOR UPDATE {'SKIP LOCKED' if skip else 'NOWAIT'}", params))  # noqa: S611


def update_returning(rows: QuerySet, values: dict, read: QuerySet) -> dict | None:
    """``rows.update(**values)`` and the first row of ``read`` (a ``values()`` of the updated row), or
    None when nothing matched: one ``UPDATE … RETURNING`` on PostgreSQL and SQLite."""
    connection = connections[rows.db]
    if (
        connection.vendor not in ("postgresql", "sqlite")
        or not connection.features.can_return_columns_from_insert
    ):
        return read.first() if rows.update(**values) else None
    update = rows.query.chain(UpdateQuery)
    update.add_update_values(values)
    update.annotations = {}
    sql, params = update.get_compiler(rows.db).as_sql()
    select = read.query.get_compiler(rows.db)
    select.setup_query()
    returning = [compiled for _, compiled, _ in select.select]
    sql = f"{sql} RETURNING {', '.join(column for column, _ in returning)}"
    params = (*params, *(value for _, more in returning for value in more))
    with transaction.mark_for_rollback_on_error(using=rows.db), connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    names = (*read.query.extra_select, *read.query.values_select, *read.query.annotation_select)
    return dict(zip(names, next(select.results_iter(results=[[row]])), strict=True))


def bound_transaction(*, using: str, seconds: float) -> None:
    """On PostgreSQL, the server ends the current transaction when a statement, a lock wait or a
    pause between two statements lasts longer than ``seconds`` (transaction_timeout needs 17)."""
    _set_local(using, ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout"), seconds)


# How long a transaction of the lease's own may pause between two statements on PostgreSQL.
LEASE_IDLE = 5.0


@contextmanager
def lease_transaction(*, using: str) -> Iterator[None]:
    """``transaction.atomic()`` for the lease's own writes, ended by the server once idle longer than
    ``LEASE_IDLE`` (PostgreSQL); a caller's transaction keeps its settings."""
    own = not connections[using].in_atomic_block
    with transaction.atomic(using=using):
        if own:
            _set_local(using, ("idle_in_transaction_session_timeout",), LEASE_IDLE)
        yield


def mongodb_transactions(*, using: str) -> bool | None:
    """On MongoDB, whether the server runs multi-document transactions (a replica set); else None."""
    connection = connections[using]
    return connection.features._supports_transactions if connection.vendor == "mongodb" else None


@contextmanager
def write_transaction(*, using: str, durable: bool = False) -> Iterator[None]:
    """Django's ``atomic``; on a MongoDB replica set inside django-mongodb-backend's own transaction,
    which commits after it (an aborted one is a ``DatabaseError``; docs/mongodb.md)."""
    if not mongodb_transactions(using=using):
        with transaction.atomic(using=using, durable=durable):
            yield
        return
    from django_mongodb_backend.transaction import atomic
    from pymongo.errors import PyMongoError

    try:
        with atomic(using=using):
            with transaction.atomic(using=using, durable=durable):
                yield
                rolled_back = transaction.get_rollback(using=using)
            if rolled_back:  # set_rollback(True): commit nothing
                connections[using].rollback_mongo()
    except PyMongoError as exc:  # the COMMIT's own errors are pymongo's
        raise DatabaseError(f"the MongoDB transaction was aborted: {exc}") from exc


def bound_lock_wait(*, using: str, seconds: float) -> None:
    """On PostgreSQL, a statement of this transaction that waits for a lock fails after ``seconds``."""
    _set_local(using, ("lock_timeout",), seconds)


def _set_local(using: str, names: tuple[str, ...], seconds: float) -> None:
    """SET LOCAL each server setting of ``names`` to ``seconds``, on PostgreSQL."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return
    milliseconds = str(max(1, round(seconds * 1000)))
    calls = ", ".join("set_config(%s, %s, true)" for _name in names)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {calls}", [value for name in names for value in (name, milliseconds)])


def transaction_aborted(*, using: str) -> bool:
    """Whether PostgreSQL aborted the current transaction (a statement failed, even one caught)."""
    connection = connections[using]
    if connection.vendor != "postgresql" or connection.connection is None:
        return False
    from psycopg import pq  # imported only on PostgreSQL

    return connection.connection.info.transaction_status == pq.TransactionStatus.INERROR


class RowLocked(RuntimeError):
    """A lock row stayed locked by a write in progress for as long as the caller may wait."""


def without_waiting(operation: Callable[[], T], *, using: str, within: float, what: str) -> T:
    """``operation()`` (built with ``unlocked(..., skip=False)``) tried again while it meets a locked
    row for at most ``within`` seconds, then ``RowLocked``; in a caller's transaction, in a savepoint."""
    connection = connections[using]
    if not connection.features.has_select_for_update_nowait:
        return operation()
    deadline = time.monotonic() + within
    pause = 0.05
    while True:
        try:
            with transaction.atomic(using=using) if connection.in_atomic_block else nullcontext():
                return operation()
        except OperationalError as exc:
            if not row_locked(exc):
                raise
            if time.monotonic() + pause > deadline:
                waited = f" for {within:g} s" if within else ""
                raise RowLocked(f"{what}: the lock row is locked by a write in progress{waited}") from exc
        time.sleep(pause)
        pause = min(pause * 2, 1.0)


# --- one database history (docs/architecture.md, "The rules": 16) ---

STANDBY = "the database is a standby in recovery"
# What libpq and the server say of a standby: target_session_attrs=read-write refused it, or a
# function only a primary has (pg_current_wal_lsn()) was called on it.
STANDBY_TEXTS = ("session is read-only", "is in hot standby mode", "recovery is in progress")
# The server's WARNING when a COMMIT's wait for its synchronous standby is cancelled: it committed
# here, and may be missing on the standby a failover promotes.
SYNC_WAIT_CANCELLED = "canceling wait for synchronous replication"


def standby(exc: BaseException) -> bool:
    """Whether a database error says the server is a standby in recovery (read-only)."""
    return _sqlstate(exc) == READ_ONLY_SQL_TRANSACTION or any(text in str(exc) for text in STANDBY_TEXTS)


# The SQL naming the server's history, by lock-row field: its WAL timeline, which grows at every promotion
# (a standby raises: ``standby``), and the cluster's system identifier, the same on its standbys.
HISTORY = {
    "timeline": "('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint",
    "system_id": "(pg_control_system()).system_identifier",
}


def history(*, using: str) -> dict:
    """The expressions of ``HISTORY`` on PostgreSQL; elsewhere none."""
    if connections[using].vendor != "postgresql":
        return {}
    return {field: Func(template=sql, output_field=BigIntegerField()) for field, sql in HISTORY.items()}


def replication_settings(*, using: str) -> dict | None:
    """``synchronous_commit`` and ``synchronous_standby_names`` of a PostgreSQL server, else None."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return None
    names = ("synchronous_commit", "synchronous_standby_names")
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting(%s), current_setting(%s)", names)
            return dict(zip(names, cursor.fetchone(), strict=True))
    except Error:
        return None


def watch_notices(sender, connection, **kwargs) -> None:
    """``connection_created`` receiver: keep a PostgreSQL connection's last ``SYNC_WAIT_CANCELLED``."""
    if connection.vendor != "postgresql":
        return
    connection.sync_wait_cancelled = ""

    def notice(diagnostic) -> None:
        if SYNC_WAIT_CANCELLED in (diagnostic.message_primary or ""):
            detail = diagnostic.message_detail or ""
            connection.sync_wait_cancelled = safe_text(f"{diagnostic.message_primary} {detail}".strip())

    connection.connection.add_notice_handler(notice)


def sync_wait_cancelled(*, using: str, forget: bool = False) -> str:
    """The server's ``SYNC_WAIT_CANCELLED`` WARNING on this connection, or ""; ``forget``: listen afresh."""
    connection = connections[using]
    said = getattr(connection, "sync_wait_cancelled", "")
    if forget:
        connection.sync_wait_cancelled = ""
    return said


# --- error and outside text, bounded to one line ---------------------------------------

# Characters of outside text kept in a log line, a stored error or a JSON answer.
LIMIT = 500
# Characters of a traceback kept on its JobRun: its end, where the exception is raised.
TRACEBACK_LIMIT = 10_000

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = LIMIT
_WHITESPACE = re.compile(r"\s+")


def safe_text(value: object, *, limit: int = LIMIT) -> str:
    """``value`` with non-printable characters escaped, cut to ``limit`` characters and "… (N more)";
    not a string: a bounded ``repr()``."""
    if not isinstance(value, str):
        return _repr.repr(value)
    head, more = value[:limit], len(value) - limit
    shown = "".join(char if char.isprintable() else repr(char)[1:-1] for char in head)
    return f"{shown}… ({more} more)" if more > 0 else shown


def error_text(exc: BaseException) -> str:
    """ "OperationalError: no such table: x": one line, escaped, at most ``LIMIT`` characters of its text;
    one without text names its cause's (django-mongodb-backend raises a bare ``DatabaseError`` from pymongo's)."""
    text = safe_text(_WHITESPACE.sub(" ", str(exc)).strip())
    if not text and exc.__cause__ is not None:
        text = error_text(exc.__cause__)
    return f"{type(exc).__name__}: {text or 'no details'}"


def traceback_text(exc: BaseException) -> str:
    """``exc``'s formatted traceback, control characters escaped; when longer than ``TRACEBACK_LIMIT``,
    its end after a line saying how much was cut."""
    text = "".join(traceback.format_exception(exc))
    text = "\n".join(safe_text(line, limit=len(line)) for line in text.splitlines())
    if len(text) <= TRACEBACK_LIMIT:
        return text
    cut = len(text) - TRACEBACK_LIMIT
    tail = text[cut:]
    return f"… ({cut} characters cut)\n{tail[tail.find(chr(10)) + 1 :]}"  # from its first whole line
