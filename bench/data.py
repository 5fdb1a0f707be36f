"""Contest lists for the benchmark: the real 1,758-contest answer, and copies of it
with fresh ids at 10 and 100 times its size."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "codeforces-contest-list-2023-07.json"
# Copy k of a contest gets id + k * ID_STRIDE: above every real id in the fixture.
ID_STRIDE = 10_000


@cache
def real_contests() -> tuple[dict, ...]:
    payload = json.loads(FIXTURE.read_text())
    return tuple(payload["result"])


def contest_list(scale: int) -> list[dict]:
    """``scale`` copies of the real list; copy 0 is the real one, the others get fresh ids
    and a name suffix so that every row differs."""
    real = real_contests()
    if max(entry["id"] for entry in real) >= ID_STRIDE:
        raise ValueError(f"the fixture has ids over {ID_STRIDE}; raise ID_STRIDE")
    entries = list(real)
    for copy in range(1, scale):
        entries.extend(
            {**entry, "id": entry["id"] + copy * ID_STRIDE, "name": f"{entry['name']} #{copy}"}
            for entry in real
        )
    return entries


def contest_list_body(scale: int) -> bytes:
    """The HTTP body of ``contest.list`` as Codeforces sends it."""
    return json.dumps({"status": "OK", "result": contest_list(scale)}).encode()
