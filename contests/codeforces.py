"""The Codeforces API client: the only module that knows its URLs and field names.

``CodeforcesClient.contest_list()`` returns validated ``ContestRecord`` values or
raises ``CodeforcesError`` with a message a person can act on.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import requests
from django.conf import settings
from requests.adapters import HTTPAdapter
from urllib3.exceptions import ConnectTimeoutError, ReadTimeoutError
from urllib3.util.retry import Retry

logger = logging.getLogger(__name__)

USER_AGENT = "cf-contest-sync/1.0 (+Django; hourly contest.list sync)"
KNOWN_PHASES = frozenset({"BEFORE", "CODING", "PENDING_SYSTEM_TEST", "SYSTEM_TEST", "FINISHED"})
KNOWN_TYPES = frozenset({"CF", "IOI", "ICPC"})
CALL_LIMIT = "call limit exceeded"
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


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
    problems: list[str] = field(default_factory=list)

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
    ) -> None:
        self.base_url = (base_url or settings.CODEFORCES_API_URL).rstrip("/")
        self.timeout = timeout or settings.CODEFORCES_TIMEOUT
        self.max_attempts = max(1, max_attempts or settings.CODEFORCES_MAX_ATTEMPTS)
        self.backoff = settings.CODEFORCES_BACKOFF if backoff is None else backoff
        self.max_bytes = max_bytes or settings.CODEFORCES_MAX_BYTES

    def contest_list(self) -> ContestList:
        """``contest.list?gym=false``, validated. At most ``max_attempts`` requests."""
        url = f"{self.base_url}/contest.list"
        attempts = 0
        while True:
            payload, used = self._get_json(url, {"gym": "false"}, budget=self.max_attempts - attempts)
            attempts += used
            status = payload.get("status") if isinstance(payload, dict) else None
            comment = str(payload.get("comment", "")) if isinstance(payload, dict) else ""
            if status == "FAILED" and CALL_LIMIT in comment.lower() and attempts < self.max_attempts:
                delay = self.backoff * 2 ** (attempts - 1)
                logger.warning("Codeforces: call limit exceeded; retrying in %.1f s", delay)
                time.sleep(delay)
                continue
            result = parse_contest_list(payload)
            result.attempts = attempts
            return result

    def _get_json(self, url: str, params: dict, *, budget: int) -> tuple[object, int]:
        retry = Retry(
            total=budget - 1,
            connect=budget - 1,
            read=budget - 1,
            status=budget - 1,
            other=0,
            allowed_methods={"GET"},
            status_forcelist=RETRY_STATUSES,
            backoff_factor=self.backoff,
            respect_retry_after_header=True,
            raise_on_status=False,
        )
        with requests.Session() as session:
            session.headers["User-Agent"] = USER_AGENT
            session.headers["Accept"] = "application/json"
            session.mount("http://", HTTPAdapter(max_retries=retry))
            session.mount("https://", HTTPAdapter(max_retries=retry))
            try:
                # Redirects are not followed: a 3xx could send the sync to any host.
                response = session.get(
                    url, params=params, timeout=self.timeout, stream=True, allow_redirects=False
                )
            except requests.exceptions.RetryError as exc:
                raise CodeforcesError(
                    f"Codeforces API at {url} kept failing after {budget} attempts: {_reason(exc)}"
                ) from exc
            except (requests.exceptions.Timeout, requests.exceptions.ConnectionError) as exc:
                if not _timed_out(exc):
                    raise CodeforcesError(
                        f"cannot connect to the Codeforces API at {url} ({budget} attempts): {_reason(exc)}"
                    ) from exc
                raise CodeforcesError(
                    f"Codeforces API at {url} did not answer within {self.timeout[1]:g} s ({budget} attempts)"
                ) from exc
            except requests.exceptions.RequestException as exc:
                raise CodeforcesError(f"request to the Codeforces API at {url} failed: {exc}") from exc
            with response:
                if response.is_redirect:
                    raise CodeforcesError(
                        f"Codeforces API at {url} answered HTTP {response.status_code} redirecting to "
                        f"{response.headers['Location'][:300]!r}; redirects are not followed "
                        "(check CODEFORCES_API_URL)"
                    )
                used = len(response.raw.retries.history) + 1 if response.raw.retries else 1
                body = self._read_capped(response, url)
        if response.status_code in RETRY_STATUSES:
            raise CodeforcesError(
                f"Codeforces API at {url} answered HTTP {response.status_code} "
                f"{response.reason or ''} after {used} attempts".replace("  ", " ")
            )
        try:
            payload = json.loads(body)
        except ValueError as exc:
            raise CodeforcesError(
                f"Codeforces API answered HTTP {response.status_code} with a body that is not JSON "
                f"({len(body)} bytes: {exc})"
            ) from exc
        if response.status_code != 200 and not (
            isinstance(payload, dict) and payload.get("status") == "FAILED"
        ):
            raise CodeforcesError(f"Codeforces API answered HTTP {response.status_code}")
        return payload, used

    def _read_capped(self, response: requests.Response, url: str) -> bytes:
        declared = response.headers.get("Content-Length")
        if declared and declared.isdigit() and int(declared) > self.max_bytes:
            raise CodeforcesError(
                f"Codeforces API response is {int(declared):,} bytes, over the "
                f"{self.max_bytes:,}-byte cap (CODEFORCES_MAX_BYTES)"
            )
        chunks, size = [], 0
        try:
            for chunk in response.iter_content(chunk_size=65536):
                size += len(chunk)
                if size > self.max_bytes:
                    raise CodeforcesError(
                        f"Codeforces API response exceeded the {self.max_bytes:,}-byte cap "
                        "(CODEFORCES_MAX_BYTES)"
                    )
                chunks.append(chunk)
        except requests.exceptions.RequestException as exc:
            raise CodeforcesError(
                f"reading the Codeforces API response from {url} failed: {_reason(exc)}"
            ) from exc
        return b"".join(chunks)


def parse_contest_list(payload: object) -> ContestList:
    """Validate a ``contest.list`` answer. Bad entries are skipped and counted;
    an answer that is unusable as a whole raises ``CodeforcesError``."""
    if not isinstance(payload, dict):
        raise CodeforcesError(f"Codeforces API answer is a {type(payload).__name__}, not a JSON object")
    if payload.get("status") != "OK":
        comment = payload.get("comment") or "no comment"
        raise CodeforcesError(f"Codeforces API answered status {payload.get('status')!r}: {comment}")
    entries = payload.get("result")
    if not isinstance(entries, list):
        raise CodeforcesError(
            f"Codeforces API 'result' is a {type(entries).__name__}, not a list of contests"
        )
    records, problems, seen = [], [], set()
    unknown: set[tuple[str, str]] = set()
    for index, entry in enumerate(entries):
        try:
            record = _contest(entry)
        except ValueError as exc:
            problems.append(f"entry {index}: {exc}")
            continue
        if record.contest_id in seen:
            problems.append(f"entry {index}: duplicate id {record.contest_id}")
            continue
        seen.add(record.contest_id)
        records.append(record)
        if record.phase not in KNOWN_PHASES:
            unknown.add(("phase", record.phase))
        if record.type not in KNOWN_TYPES:
            unknown.add(("type", record.type))
    for kind, value in sorted(unknown):
        logger.warning("Codeforces: unknown contest %s %r kept as is", kind, value)
    invalid = len(problems)
    if problems:
        logger.warning("Codeforces: skipped %d invalid entries; first: %s", invalid, problems[0])
    if entries and invalid * 2 > len(entries):
        raise CodeforcesError(
            f"Codeforces API answer is mostly invalid: {invalid} of {len(entries)} entries "
            f"rejected (first: {problems[0]}); nothing was written"
        )
    return ContestList(records=records, invalid=invalid, problems=problems)


def _contest(entry: object) -> ContestRecord:
    if not isinstance(entry, dict):
        raise ValueError(f"not an object but {type(entry).__name__}")
    contest_id = entry.get("id")
    if not _is_int(contest_id) or contest_id <= 0:
        raise ValueError(f"id {contest_id!r} is not a positive integer")
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"contest {contest_id}: name {name!r} is not a non-empty string")
    for key in ("phase", "type"):
        if not isinstance(entry.get(key), str) or not entry[key]:
            raise ValueError(f"contest {contest_id}: {key} {entry.get(key)!r} is not a string")
    frozen = entry.get("frozen", False)
    if not isinstance(frozen, bool):
        raise ValueError(f"contest {contest_id}: frozen {frozen!r} is not a boolean")
    duration = entry.get("durationSeconds")
    if not _is_int(duration) or duration < 0:
        raise ValueError(f"contest {contest_id}: durationSeconds {duration!r} is not a non-negative integer")
    start = entry.get("startTimeSeconds")
    if start is not None and not _is_int(start):
        raise ValueError(f"contest {contest_id}: startTimeSeconds {start!r} is not an integer")
    try:
        start_time = datetime.fromtimestamp(start, tz=UTC) if start is not None else None
    except (OverflowError, OSError, ValueError) as exc:
        raise ValueError(f"contest {contest_id}: startTimeSeconds {start!r} is out of range") from exc
    return ContestRecord(
        contest_id=contest_id,
        name=name.strip()[:500],
        type=entry["type"][:20],
        phase=entry["phase"][:40],
        frozen=frozen,
        start_time=start_time,
        duration=timedelta(seconds=duration),
    )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _timed_out(exc: BaseException) -> bool:
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
    text = str(reason)
    if "] " in text:  # "[Errno 111] Connection refused" inside urllib3's wrapper text
        text = text.rsplit("] ", 1)[1].rstrip("')\"")
    return " ".join(text.split())[:300]
