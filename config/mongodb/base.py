"""django-mongodb-backend, with an unreachable server reported as Django's
``OperationalError``.

The backend wraps errors of queries and writes in ``django.db.DatabaseError``
but lets pymongo's own exception escape from the first connection (the
server-version check that follows connecting). Code that handles an
unreachable database the Django way (the lock's skipped tick, lock semantic
8; ``makemigrations``' history check) would see a traceback instead.
"""

from django.db import OperationalError
from django_mongodb_backend.base import DatabaseWrapper as MongoDatabaseWrapper
from pymongo.errors import PyMongoError


class DatabaseWrapper(MongoDatabaseWrapper):
    def init_connection_state(self) -> None:
        try:
            super().init_connection_state()
        except PyMongoError as exc:
            raise OperationalError(f"cannot reach MongoDB: {_summary(exc)}") from exc


def _summary(exc: PyMongoError) -> str:
    # A server-selection timeout appends the whole topology description.
    return str(exc).split(", Timeout:", 1)[0].split(" Topology Description:", 1)[0]
