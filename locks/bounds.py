"""Bounded waits on a lock row (docs/architecture.md, "The rules": 11).

No statement of the lock waits on a locked ``SyncLock`` row without a bound, and on
PostgreSQL a transaction that holds one (a fenced write) cannot outlive its lease by more
than its TTL: the server ends it, its write rolls back and another host takes the tick over.
SQLite has one write lock for the whole file; its busy timeout (``timeout`` in the database
``OPTIONS``) bounds every wait for it, and nothing can end a frozen writer's transaction but
its process ending. MongoDB locks no rows here (``atomic()`` does nothing).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from django.db import OperationalError, connections, transaction
from django.db.models import QuerySet

T = TypeVar("T")

# PostgreSQL's SQLSTATE for "could not obtain lock on row" (NOWAIT, lock_timeout).
LOCK_NOT_AVAILABLE = "55P03"


def row_locked(exc: BaseException) -> bool:
    """Whether a database error says the statement met a row another transaction has locked."""
    return getattr(exc.__cause__, "sqlstate", None) == LOCK_NOT_AVAILABLE


def unlocked(rows: QuerySet, *, using: str, skip: bool) -> QuerySet:
    """``rows`` as a filter that never waits for a row another transaction has locked, where
    the database locks rows: ``skip``, such a row is left out (``FOR UPDATE SKIP LOCKED``);
    otherwise the statement fails at once (``FOR UPDATE NOWAIT``: ``row_locked``). For an
    UPDATE inside ``transaction.atomic()``. Elsewhere ``rows`` unchanged."""
    features = connections[using].features
    if not (features.has_select_for_update_skip_locked and features.has_select_for_update_nowait):
        return rows
    locking = rows.select_for_update(skip_locked=skip, nowait=not skip)
    return rows.filter(pk__in=locking.values("pk"))


def bound_transaction(*, using: str, seconds: float) -> None:
    """On PostgreSQL, have the server end the current transaction when one of its statements,
    a wait of one for a lock, or a pause between two of them (a frozen process: SIGSTOP, a
    paused VM, a partition) lasts longer than ``seconds``. For this transaction only."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return
    milliseconds = str(max(1, round(seconds * 1000)))
    # No ORM way to set a server setting: set_config(name, value, true) is SET LOCAL, which
    # lasts until this transaction ends. (transaction_timeout, a bound on the whole
    # transaction, needs PostgreSQL 17.)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT set_config('statement_timeout', %s, true), set_config('lock_timeout', %s, true), "
            "set_config('idle_in_transaction_session_timeout', %s, true)",
            [milliseconds] * 3,
        )


class RowLocked(RuntimeError):
    """A lock row stayed locked by another transaction (a write in progress) for as long as
    the caller may wait."""


def without_waiting(operation: Callable[[], T], *, using: str, within: float, what: str) -> T:
    """``operation()``, its statements built with ``unlocked(..., skip=False)``: in a
    transaction of its own where the database locks rows, tried again with a short backoff
    while it meets a locked row, for at most ``within`` seconds (0: once); then
    ``RowLocked``, naming ``what``. Elsewhere simply ``operation()``."""
    if not connections[using].features.has_select_for_update_nowait:
        return operation()
    deadline = time.monotonic() + within
    pause = 0.05
    while True:
        try:
            with transaction.atomic(using=using):
                return operation()
        except OperationalError as exc:
            if not row_locked(exc):
                raise
            if time.monotonic() + pause > deadline:
                waited = f" for {within:g} s" if within else ""
                raise RowLocked(f"{what}: the lock row is locked by a write in progress{waited}") from exc
        time.sleep(pause)
        pause = min(pause * 2, 1.0)
