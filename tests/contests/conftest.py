import copy
import time

import pytest

from tests.standin import load_fixture

_FIXTURE = load_fixture()


@pytest.fixture
def payload() -> dict:
    """A fresh copy of the real 1,758-contest answer."""
    return copy.deepcopy(_FIXTURE)


def shift_to_now(payload: dict) -> dict:
    """Move every start time so the capture's 'now' (July 2023) becomes the real now:
    its BEFORE contests are upcoming again, its finished ones stay in the past."""
    captured_at = max(c["startTimeSeconds"] + c["relativeTimeSeconds"] for c in payload["result"])
    offset = int(time.time()) - captured_at
    for contest in payload["result"]:
        contest["startTimeSeconds"] += offset
    return payload


def upcoming_ids(payload: dict) -> list[int]:
    now = time.time()
    return [c["id"] for c in payload["result"] if c["startTimeSeconds"] > now]
