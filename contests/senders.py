"""The mail server connections of one ``send_reminders`` run (docs/reminders.md, "A big round").

The run builds each message once, in its own thread, and hands it to a connection; each
connection only talks SMTP. One connection (the default) sends in the run's thread; more each
have a thread of their own and take the messages of the group being sent from one queue, so a
connection that waits for its server's answer never holds the others up, and none idles while
another has work. A connection is opened when its first message comes: a run with nothing to
send touches no mail server. Before each message the connection asks whether the run still
holds it (its lease, and the reminder's claim: ``_Claim.holds`` in contests/reminders.py).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Iterable

from django.core.mail import EmailMessage
from django.core.mail.backends.base import BaseEmailBackend
from django.db import connections

from contests.mail import (
    Flattened,
    Handover,
    Outcome,
    StagedSMTPBackend,
    flatten,
    hand_over,
    reminder_backend,
    reminder_backend_class,
    stage_outcome,
)
from contests.models import Reminder
from contests.text import error_text


def send_reminder(*, reminder: Reminder, message, backend: BaseEmailBackend) -> Handover:
    """Hand ``reminder``'s built message to ``backend`` (open); what became of it."""
    return hand_over(message, backend=backend)


class _Connection:
    """One mail server connection, opened when its first message comes."""

    def __init__(self, number: int, backend: BaseEmailBackend | None) -> None:
        self.number = number
        self.backend = backend
        self.opened = False
        self.connected = False  # it was opened at least once
        self.error = ""  # why it stopped
        self.unreachable = False  # it could not be opened

    def send(self, group, reminder: Reminder, message) -> Handover | None:
        """Send one message and tell ``group`` what became of it; None when the connection
        could not be opened (the message was not sent)."""
        if not self.opened:
            self.backend = self.backend or reminder_backend()
            try:
                self.backend.open()
            except OSError as exc:  # refused, DNS, TLS, login: before anything was sent
                self.unreachable = True
                self.error = f"the mail server is unreachable: {error_text(exc)}"
                return None
            self.opened = self.connected = True
        try:
            handover = send_reminder(reminder=reminder, message=message, backend=self.backend)
        except BaseException as exc:
            # Interrupted mid-send (SIGTERM in the run's thread, a bug): the stage says whether it went out.
            group.done(reminder, Handover(stage_outcome(self.backend), f"interrupted: {error_text(exc)}"))
            raise
        group.done(reminder, handover)
        if handover.connection_lost:
            self.error = f"the mail server connection failed: {handover.error}"
        return handover

    def close(self) -> None:
        if self.opened:
            with contextlib.suppress(OSError):  # the connection is gone already; all is recorded
                self.backend.close()
            self.opened = False


class Post:
    """``count`` connections for one run (``backend``: that one backend instead, for one).
    ``send(group, messages)`` hands each message of a group to one of them; ``close()`` ends them."""

    def __init__(self, run, *, count: int, backend: BaseEmailBackend | None = None) -> None:
        self.run = run
        self.connections = [_Connection(number, backend) for number in range(1, count + 1)]
        backend_class = type(backend) if backend is not None else reminder_backend_class()
        # Django's SMTP backend: each message is flattened once, in the run's thread.
        self.flattens = issubclass(backend_class, StagedSMTPBackend)
        self.failed = False  # every connection failed: the run sends nothing more
        self._threads: list[_Worker] = []
        self._cond = threading.Condition()
        self._todo: deque = deque()
        self._busy = 0  # messages a connection's thread is sending now
        self._halt: BaseException | None = None  # what stopped a connection's thread (LockLost, a bug)
        self._closing = False

    def build(self, message: EmailMessage) -> EmailMessage | Flattened:
        """``message`` as the connections send it (``ValueError``: it cannot be sent)."""
        return flatten(message) if self.flattens else message

    @property
    def errors(self) -> list[_Connection]:
        return [connection for connection in self.connections if connection.error]

    def unsent_reason(self) -> str:
        errors = self.errors
        return f"not sent yet: {errors[0].error}" if errors else ""

    def send(self, group, messages: Iterable[tuple[Reminder, object]]) -> None:
        """Send ``messages`` (each reminder of ``group`` with its message, built as they are
        asked for); return when each has an outcome or cannot be sent now: the run is stopping
        (raises), or every connection failed (``failed``). What was not sent stays untried."""
        if len(self.connections) == 1:
            self._send_here(group, messages)
        else:
            self._send_in_threads(group, messages)

    def _send_here(self, group, messages) -> None:
        connection = self.connections[0]
        # Built already, with the rest of the batch (contests/reminders.py, _build).
        for reminder, message in list(messages):
            self.run.check()  # in memory: the heartbeat's verdict, a SIGTERM
            if not group.claim.holds(reminder.pk):
                continue
            handover = connection.send(group, reminder, message)
            if handover is None or handover.connection_lost:
                self.failed = True
                return

    # --- several connections, each in its own thread ------------------------------------

    def _send_in_threads(self, group, messages) -> None:
        if not self._threads:
            self._threads = [_Worker(self, connection) for connection in self.connections]
            for worker in self._threads:
                worker.start()
        try:
            for item in messages:
                with self._cond:
                    if self._halt is not None or not self._live():
                        break
                    self._todo.append((group, *item))
                    self._cond.notify()
                # Building a message is the run's one piece of pure CPU work: let the connections
                # whose answers have come take the GIL now, not a switch interval (5 ms) later.
                time.sleep(0)
            with self._cond:
                while (self._todo or self._busy) and self._live() and self._halt is None:
                    self._cond.wait()
        except BaseException:  # SIGTERM (SystemExit) in this thread: each connection finishes its message
            self.run.stopping.set()
            self._settle()
            raise
        self._settle()
        if self._halt is not None:
            raise self._halt
        if not self._live():
            self.failed = True

    def _live(self) -> bool:
        return any(worker.alive for worker in self._threads)

    def _settle(self) -> None:
        """Until no connection is sending; what is still queued stays untried."""
        with self._cond:
            while self._busy:
                self._cond.wait()
            self._todo.clear()

    def _take(self):
        """The next message for a connection's thread, or None once the run closes."""
        with self._cond:
            while not self._closing and (not self._todo or self._halt is not None):
                self._cond.wait()
            if self._closing:
                return None
            self._busy += 1
            return self._todo.popleft()

    def _done(self, item, *, again: bool = False, halt: BaseException | None = None) -> None:
        with self._cond:
            self._busy -= 1
            if again:  # never sent: another connection may send it
                self._todo.appendleft(item)
            if halt is not None and self._halt is None:
                self._halt = halt
            self._cond.notify_all()

    def close(self) -> None:
        """Close every connection (and end their threads)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        for worker in self._threads:
            # An event, not Thread.join(): a join cut short by a signal can leave the thread
            # looking finished on Python 3.11, and the process would exit under it. Each thread
            # stops within one message once the run stops or its lease is lost.
            worker.finished.wait()
        for connection in self.connections:
            connection.close()


class _Worker(threading.Thread):
    """The thread of one connection: takes messages from the queue until the run closes
    or the connection fails."""

    def __init__(self, post: Post, connection: _Connection) -> None:
        super().__init__(name=f"reminders-{connection.number}", daemon=True)
        self.post, self.connection = post, connection
        self.alive = True
        self.finished = threading.Event()

    def run(self) -> None:
        post, connection = self.post, self.connection
        try:
            while (item := post._take()) is not None:
                group, reminder, message = item
                try:
                    post.run.check()
                    handover = (
                        connection.send(group, reminder, message) if group.claim.holds(reminder.pk) else None
                    )
                except BaseException as exc:  # LockLost, _Stopped, a database error renewing, a bug
                    post._done(item, halt=exc)
                    continue
                if connection.error:  # it could not be opened, or failed: the others take over
                    self.alive = False
                    unsent = handover is None or handover.outcome is Outcome.UNSENT
                    post._done(item, again=unsent)
                    return
                post._done(item)
        finally:
            self.alive = False
            with post._cond:
                post._cond.notify_all()
            connection.close()
            connections.close_all()  # this thread's own database connections (claim renewals)
            self.finished.set()
