"""django-mongodb-backend, with an unreachable server reported as Django's
``OperationalError``.

The backend wraps the errors of queries and writes in ``django.db.DatabaseError``
but lets pymongo's own exceptions escape from the first connection (the
server-version check that follows connecting) and from introspection (the
lock's check that its collection exists). Code that handles an unreachable
database the Django way (the skipped tick of docs/architecture.md, The lock;
``makemigrations``' history check) would see a traceback instead.
"""

from django.db import OperationalError
from django_mongodb_backend.base import DatabaseWrapper as MongoDatabaseWrapper
from django_mongodb_backend.introspection import DatabaseIntrospection as MongoDatabaseIntrospection
from pymongo.errors import PyMongoError


def _unreachable(exc: PyMongoError) -> OperationalError:
    # A server-selection timeout appends the whole topology description.
    summary = str(exc).split(", Timeout:", 1)[0].split(" Topology Description:", 1)[0]
    return OperationalError(f"cannot reach MongoDB: {summary}")


class DatabaseIntrospection(MongoDatabaseIntrospection):
    def table_names(self, cursor=None, include_views=False) -> list[str]:
        try:
            return super().table_names(cursor, include_views)
        except PyMongoError as exc:
            raise _unreachable(exc) from exc


class DatabaseWrapper(MongoDatabaseWrapper):
    introspection_class = DatabaseIntrospection

    def init_connection_state(self) -> None:
        try:
            super().init_connection_state()
        except PyMongoError as exc:
            raise _unreachable(exc) from exc
