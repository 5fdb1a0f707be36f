"""The database's clock, by which every lease and slot decision is judged."""

from datetime import datetime

from django.db.models import Max
from django.db.models.functions import Now

from locks.models import SyncLock


def database_now() -> datetime:
    """The database's clock, in one query. An aggregate answers with one row even
    when the table is empty, so this works before any job has run."""
    return SyncLock.objects.aggregate(now=Max(Now(), default=Now()))["now"]
