"""The Codeforces API client: the only module that knows its URLs and field names.

``CodeforcesClient.contest_list()`` returns validated ``ContestRecord`` values or
raises ``CodeforcesError`` with a message a person can act on.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from django.conf import settings

from contests.text import safe_text, without_userinfo

if TYPE_CHECKING:
    import requests

logger = logging.getLogger(__name__)

USER_AGENT = "cf-contest-sync/1.0 (+Django; hourly contest.list sync)"
KNOWN_PHASES = frozenset({"BEFORE", "CODING", "PENDING_SYSTEM_TEST", "SYSTEM_TEST", "FINISHED"})
KNOWN_TYPES = frozenset({"CF", "IOI", "ICPC"})
CALL_LIMIT = "call limit exceeded"
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
CHUNK_BYTES = 65536
# At most this many JSON values (numbers, strings, arrays, objects) in an answer: the real
# list of July 2023 has about 16,000 (1,758 contests), so this leaves room for decades of
# contests while bounding what decoding can allocate (a value costs up to ~200 bytes).
MAX_VALUES = 200_000
# Invalid entries, and unknown phases or types, described by a few examples and a count.
EXAMPLES = 3
# Characters of an outside value quoted in the message about one entry.
VALUE_LIMIT = 100
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")

# What the database can store, the same on every backend. Contest.contest_id is a
# PositiveIntegerField: 32 bits on PostgreSQL and MySQL (SQLite would take 64).
MAX_CONTEST_ID = 2**31 - 1
# The longest contest in the real list lasts 16 days; a century stays far inside
# what a DurationField holds (about 292 years as microseconds in a 64-bit integer).
MAX_DURATION = timedelta(days=36525)
# Start times from 1970 up to the year 3000: later ones are typos, and values near
# datetime's limit overflow when shown in a time zone east of UTC.
MAX_START = datetime(3000, 1, 1, tzinfo=UTC)


class CodeforcesError(Exception):
    """The contest list could not be fetched or is not usable; nothing was written."""


@dataclass(frozen=True)
class ContestRecord:
    contest_id: int
    name: str
    type: str
    phase: str
    frozen: bool
    start_time: datetime | None
    duration: timedelta


@dataclass
class ContestList:
    records: list[ContestRecord]
    invalid: int = 0
    attempts: int = 1

    @property
    def fetched(self) -> int:
        return len(self.records) + self.invalid


class CodeforcesClient:
    def __init__(
        self,
        *,
        base_url: str | None = None,
        timeout: tuple[float, float] | None = None,
        max_attempts: int | None = None,
        backoff: float | None = None,
        max_bytes: int | None = None,
        total_timeout: float | None = None,
    ) -> None:
        self.base_url = (base_url or settings.CODEFORCES_API_URL).rstrip("/")
        self.timeout = timeout or settings.CODEFORCES_TIMEOUT
        self.max_attempts = max(1, max_attempts or settings.CODEFORCES_MAX_ATTEMPTS)
        self.backoff = settings.CODEFORCES_BACKOFF if backoff is None else backoff
        self.max_bytes = max_bytes or settings.CODEFORCES_MAX_BYTES
        self.total_timeout = total_timeout or settings.CODEFORCES_TOTAL_TIMEOUT

    def contest_list(self) -> ContestList:
        """``contest.list?gym=false``, validated. At most ``max_attempts`` requests,
        all of them, and the waits between them, within ``total_timeout`` seconds."""
        url = f"{self.base_url}/contest.list"
        # What messages and logs name: the URL without its user name and password.
        shown = without_userinfo(url)
        deadline = Deadline(self.total_timeout, url=shown)
        attempt = 0
        while True:
            attempt += 1
            last = attempt >= self.max_attempts
            try:
                payload = self._get_json(url, {"gym": "false"}, shown=shown, deadline=deadline)
            except _Retryable as exc:
                if last:
                    raise CodeforcesError(f"{exc} ({attempt} attempts)") from exc.__cause__
                problem, retry_after = str(exc), exc.retry_after
            else:
                comment = payload.get("comment") if isinstance(payload, dict) else None
                status = payload.get("status") if isinstance(payload, dict) else None
                limited = isinstance(comment, str) and CALL_LIMIT in comment.lower()
                if last or not (status == "FAILED" and limited):
                    result = parse_contest_list(payload)
                    result.attempts = attempt
                    return result
                problem, retry_after = f"Codeforces API at {shown}: call limit exceeded", None
            delay = self.backoff * 2 ** (attempt - 1) if retry_after is None else retry_after
            logger.warning("%s; retrying in %.1f s", problem, delay)
            deadline.sleep(delay)

    def _get_json(self, url: str, params: dict, *, shown: str, deadline: Deadline) -> object:
        """One request. Raises ``_Retryable`` for what another attempt may cure. Messages
        name ``shown``, never ``url``."""
        # requests (and urllib3) are imported only when a fetch happens: a copy that
        # skips a claimed tick never needs them (docs/benchmarks.md, the skip part).
        import requests

        with requests.Session() as session:
            session.headers["User-Agent"] = USER_AGENT
            session.headers["Accept"] = "application/json"
            timeout = deadline.cap(self.timeout)
            try:
                # Redirects are not followed: a 3xx could send the sync to any host.
                response = session.get(
                    url, params=params, timeout=timeout, stream=True, allow_redirects=False
                )
            except (requests.exceptions.Timeout, requests.exceptions.ConnectionError) as exc:
                deadline.check()  # the capped timeout ran out with the deadline
                if not _timed_out(exc):
                    raise _Retryable(
                        f"cannot connect to the Codeforces API at {shown}: {_reason(exc)}"
                    ) from exc
                raise _Retryable(f"Codeforces API at {shown} did not answer within {timeout[1]:g} s") from exc
            except requests.exceptions.RequestException as exc:
                raise CodeforcesError(
                    f"request to the Codeforces API at {shown} failed: {_reason(exc)}"
                ) from exc
            with response:
                if response.is_redirect:
                    location = without_userinfo(response.headers["Location"])
                    raise CodeforcesError(
                        f"Codeforces API at {shown} answered HTTP {response.status_code} redirecting to "
                        f"{safe_text(location, limit=300, quote=True)}; redirects are not followed "
                        "(check CODEFORCES_API_URL)"
                    )
                if response.status_code in RETRY_STATUSES:
                    raise _Retryable(
                        f"Codeforces API at {shown} answered HTTP {response.status_code} "
                        f"{safe_text(response.reason or '', limit=VALUE_LIMIT)}".rstrip(),
                        retry_after=_retry_after(response),
                    )
                body = self._read_capped(response, shown, deadline=deadline)
        # An upper bound of the values the body holds, counted before decoding it: 20 MB of
        # tiny entries ([0,0,…]) would take 0.2 to 0.6 GB as Python objects (docs/security.md).
        values = body.count(b",") + body.count(b"[") + body.count(b"{")
        if values > MAX_VALUES:
            raise CodeforcesError(
                f"Codeforces API answered HTTP {response.status_code} with {len(body):,} bytes holding up "
                f"to {values:,} JSON values, more than the {MAX_VALUES:,} a contest list may have; "
                "not decoded"
            )
        try:
            payload = json.loads(body)
        except ValueError as exc:
            raise CodeforcesError(
                f"Codeforces API answered HTTP {response.status_code} with a body that is not JSON "
                f"({len(body)} bytes: {exc})"
            ) from exc
        except RecursionError as exc:
            raise CodeforcesError(
                f"Codeforces API answered HTTP {response.status_code} with JSON nested too deeply "
                f"to parse ({len(body)} bytes)"
            ) from exc
        if response.status_code != 200 and not (
            isinstance(payload, dict) and payload.get("status") == "FAILED"
        ):
            raise CodeforcesError(f"Codeforces API answered HTTP {response.status_code}")
        return payload

    def _read_capped(self, response: requests.Response, url: str, *, deadline: Deadline) -> bytes:
        declared = response.headers.get("Content-Length")
        if declared and declared.isdigit() and int(declared) > self.max_bytes:
            raise CodeforcesError(
                f"Codeforces API response is {int(declared):,} bytes, over the "
                f"{self.max_bytes:,}-byte cap (CODEFORCES_MAX_BYTES)"
            )
        from urllib3.exceptions import HTTPError  # imported with the fetch, as in _get_json

        chunks, size = [], 0
        try:
            # read1() returns what one read of the socket gave, so a server that
            # trickles its answer meets the deadline check between reads; read()
            # and iter_content() would wait for a whole chunk first.
            while chunk := response.raw.read1(CHUNK_BYTES, decode_content=True):
                size += len(chunk)
                if size > self.max_bytes:
                    raise CodeforcesError(
                        f"Codeforces API response exceeded the {self.max_bytes:,}-byte cap "
                        "(CODEFORCES_MAX_BYTES)"
                    )
                chunks.append(chunk)
                deadline.check()
        except (HTTPError, OSError) as exc:
            deadline.check()
            raise CodeforcesError(
                f"reading the Codeforces API response from {url} failed: {_reason(exc)}"
            ) from exc
        return b"".join(chunks)


class Deadline:
    """One deadline over a whole fetch: no request, wait or read goes past it."""

    def __init__(self, seconds: float, *, url: str) -> None:
        self.seconds = seconds
        self.url = url
        self.ends = time.monotonic() + seconds

    def left(self) -> float:
        return self.ends - time.monotonic()

    def check(self) -> None:
        if self.left() <= 0:
            raise CodeforcesError(
                f"Codeforces API at {self.url} did not answer within {self.seconds:g} s "
                "(total deadline CODEFORCES_TOTAL_TIMEOUT)"
            )

    def cap(self, timeout: tuple[float, float]) -> tuple[float, float]:
        """(connect, read) timeouts cut to the time left."""
        self.check()
        left = self.left()
        return min(timeout[0], left), min(timeout[1], left)

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, min(seconds, self.left())))
        self.check()


class _Retryable(Exception):
    """One attempt failed in a way the next may not: no connection, a timeout, 429 or 5xx."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def _retry_after(response: requests.Response) -> float | None:
    """A ``Retry-After`` given in seconds (the HTTP-date form falls back to the backoff)."""
    value = response.headers.get("Retry-After", "").strip()
    return float(value) if value.isdigit() else None


def parse_contest_list(payload: object) -> ContestList:
    """Validate a ``contest.list`` answer. Bad entries are skipped and counted, the first
    few described; an answer that is unusable as a whole raises ``CodeforcesError``.
    Outside text in messages is quoted and cut (``locks.db.safe_text``)."""
    if not isinstance(payload, dict):
        raise CodeforcesError(f"Codeforces API answer is a {type(payload).__name__}, not a JSON object")
    if payload.get("status") != "OK":
        comment = safe_text(payload.get("comment") or "no comment")
        status = safe_text(payload.get("status"), limit=VALUE_LIMIT, quote=True)
        raise CodeforcesError(f"Codeforces API answered status {status}: {comment}")
    entries = payload.get("result")
    if not isinstance(entries, list):
        raise CodeforcesError(
            f"Codeforces API 'result' is a {type(entries).__name__}, not a list of contests"
        )
    records, seen, problems, invalid = [], set(), [], 0
    unknown = {"phase": _Unknown(), "type": _Unknown()}
    for index, entry in enumerate(entries):
        try:
            record = _contest(entry)
            if record.contest_id in seen:
                raise ValueError(f"duplicate id {record.contest_id}")
        except ValueError as exc:
            invalid += 1
            if len(problems) < EXAMPLES:  # one message per entry would cost more than the answer
                problems.append(f"entry {index}: {exc}")
            continue
        seen.add(record.contest_id)
        records.append(record)
        if record.phase not in KNOWN_PHASES:
            unknown["phase"].add(record.phase)
        if record.type not in KNOWN_TYPES:
            unknown["type"].add(record.type)
    for kind, values in unknown.items():
        if values.contests:
            logger.warning("Codeforces: unknown contest %s %s kept as is", kind, values)
    first = "; ".join(problems)
    if invalid:
        logger.warning("Codeforces: skipped %d invalid entries; first: %s", invalid, first)
    if entries and invalid * 2 > len(entries):
        raise CodeforcesError(
            f"Codeforces API answer is mostly invalid: {invalid} of {len(entries)} entries "
            f"rejected (first: {first}); nothing was written"
        )
    return ContestList(records=records, invalid=invalid)


class _Unknown:
    """The unknown values of one field: how many contests had one, a few examples."""

    def __init__(self) -> None:
        self.values: set[str] = set()
        self.contests = 0

    def add(self, value: str) -> None:
        self.contests += 1
        self.values.add(value)

    def __str__(self) -> str:
        examples = sorted(self.values)[:EXAMPLES]
        shown = ", ".join(safe_text(value, limit=VALUE_LIMIT, quote=True) for value in examples)
        more = len(self.values) - len(examples)
        plural = "s" if self.contests > 1 else ""
        return f"{shown}{f' and {more} more' if more else ''} ({self.contests} contest{plural})"


def _contest(entry: object) -> ContestRecord:
    """One entry as a record the database can store, or ValueError saying why not."""
    if not isinstance(entry, dict):
        raise ValueError(f"not an object but {type(entry).__name__}")
    contest_id = entry.get("id")
    if not _is_int(contest_id) or contest_id <= 0:
        raise ValueError(f"id {_shown(contest_id)} is not a positive integer")
    if contest_id > MAX_CONTEST_ID:
        raise ValueError(f"id {contest_id} is over the largest storable id {MAX_CONTEST_ID}")
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"contest {contest_id}: name {_shown(name)} is not a non-empty string")
    _check_text(name, key="name", contest_id=contest_id)
    for key in ("phase", "type"):
        if not isinstance(entry.get(key), str) or not entry[key]:
            raise ValueError(f"contest {contest_id}: {key} {_shown(entry.get(key))} is not a string")
        _check_text(entry[key], key=key, contest_id=contest_id)
    frozen = entry.get("frozen", False)
    if not isinstance(frozen, bool):
        raise ValueError(f"contest {contest_id}: frozen {_shown(frozen)} is not a boolean")
    duration = entry.get("durationSeconds")
    if not _is_int(duration) or duration < 0:
        raise ValueError(
            f"contest {contest_id}: durationSeconds {_shown(duration)} is not a non-negative integer"
        )
    if duration > MAX_DURATION.total_seconds():
        raise ValueError(f"contest {contest_id}: durationSeconds {duration} is over {MAX_DURATION.days} days")
    start = entry.get("startTimeSeconds")
    if start is not None and not _is_int(start):
        raise ValueError(f"contest {contest_id}: startTimeSeconds {_shown(start)} is not an integer")
    if start is not None and not 0 <= start < MAX_START.timestamp():
        raise ValueError(
            f"contest {contest_id}: startTimeSeconds {start} is out of range (1970 to {MAX_START.year})"
        )
    return ContestRecord(
        contest_id=contest_id,
        name=name.strip()[:500],
        type=entry["type"][:20],
        phase=entry["phase"][:40],
        frozen=frozen,
        start_time=datetime.fromtimestamp(start, tz=UTC) if start is not None else None,
        duration=timedelta(seconds=duration),
    )


def _check_text(value: str, *, key: str, contest_id: int) -> None:
    # PostgreSQL refuses NUL in text; a lone surrogate (JSON allows "\ud800") is
    # not UTF-8 at all, so no database driver can send it.
    if "\x00" in value:
        raise ValueError(f"contest {contest_id}: {key} contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"contest {contest_id}: {key} is not valid Unicode ({exc.reason} at position {exc.start})"
        ) from None


def _shown(value: object) -> str:
    return safe_text(value, limit=VALUE_LIMIT, quote=True)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _timed_out(exc: BaseException) -> bool:
    import requests
    from urllib3.exceptions import ConnectTimeoutError, ReadTimeoutError

    if isinstance(exc, requests.exceptions.Timeout):
        return True
    reason: object = exc.args[0] if exc.args else None
    reason = getattr(reason, "reason", reason)
    # NewConnectionError subclasses ConnectTimeoutError: a refusal is not a timeout.
    return isinstance(reason, ReadTimeoutError) or type(reason) is ConnectTimeoutError


def _reason(exc: BaseException) -> str:
    """The innermost useful cause: 'Connection refused', not a wall of pool internals."""
    reason: object = exc
    for _depth in range(5):
        inner = getattr(reason, "reason", None)
        if inner is None and getattr(reason, "args", None) and isinstance(reason.args[0], BaseException):
            inner = reason.args[0]
        if inner is None:
            break
        reason = inner
    # A URL in the text (requests names the one it could not use) loses its credentials.
    text = _URL.sub(lambda match: without_userinfo(match[0]), str(reason))
    if "] " in text:  # "[Errno 111] Connection refused" inside urllib3's wrapper text
        text = text.rsplit("] ", 1)[1].rstrip("')\"")
    return safe_text(" ".join(text.split()), limit=300)
