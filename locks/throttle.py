"""A rate limit shared by every process and host: at most one claim per key per window.

Why the database through the ORM, and not Django's cache framework:
- a per-process cache (locmem) would let every gunicorn worker and every host
  grant its own request, so N copies would run a job's outside calls N times;
- ``DatabaseCache.add()`` reads the row and then writes it, so two hosts that both
  see an expired entry both succeed (a race on PostgreSQL), it uses the host's
  clock, swallows database errors (an outage would look like "rate limited"),
  speaks raw SQL that MongoDB lacks, and needs ``createcachetable``;
- a conditional UPDATE and a unique INSERT are the same compare-and-set the job
  lock uses (docs/architecture.md, The lock): atomic on every backend, timed by the database
  clock, and a database error surfaces as such.
Only authenticated requests reach the limit, so the table holds one row per
scheduler address and needs no cleanup.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta

from django.db import IntegrityError, router, transaction
from django.db.models.functions import Now

from locks.models import Throttle, now_plus


@dataclass(frozen=True)
class Claim:
    allowed: bool
    retry_after: int = 0  # whole seconds until the key can be claimed again


def throttle_claim(*, key: str, window: timedelta) -> Claim:
    """Claim ``key`` for ``window`` if nobody claimed it within the last ``window``.

    Raises ``DatabaseError`` when the database cannot be used.
    """
    until = now_plus(window)
    if Throttle.objects.filter(key=key, until__lte=Now()).update(until=until):
        return Claim(allowed=True)
    try:
        with transaction.atomic(using=router.db_for_write(Throttle)):
            Throttle.objects.create(key=key, until=until)
    except IntegrityError:
        pass  # the key exists and its window is still open
    else:
        return Claim(allowed=True)
    row = Throttle.objects.filter(key=key).annotate(db_now=Now()).values_list("until", "db_now").first()
    remaining = (row[0] - row[1]).total_seconds() if row else 0.0
    return Claim(allowed=False, retry_after=max(1, math.ceil(remaining)))
