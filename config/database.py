"""Turn ``DATABASE_URL`` into a Django ``DATABASES["default"]`` entry.

One code path (the ORM) serves every backend; only connection options differ.
django-environ parses SQL URLs; this module adds the connection options, and
checks a MongoDB URL with pymongo's parser, imported only for such a URL.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from urllib.parse import unquote_plus, urlsplit

import environ
from django.core.exceptions import ImproperlyConfigured

from config.env import check_userinfo, url_error

# Seconds to wait for a connection before a tick is skipped (docs/architecture.md, The lock).
CONNECT_TIMEOUT = 5
# Seconds an SQLite writer waits for another process's write transaction
# (``?timeout=S`` in DATABASE_URL overrides it).
SQLITE_BUSY_TIMEOUT = 30
# Seconds a MongoDB operation may wait on a silent peer before it fails.
MONGODB_SOCKET_TIMEOUT = 30

SQL_SCHEMES = {"sqlite", "postgres", "postgresql", "pgsql", "postgis"}
MONGO_SCHEMES = {"mongodb", "mongodb+srv"}
MONGODB_ENGINE = "config.mongodb"


EXAMPLES = "use sqlite:///path, postgres://user@host/db or mongodb://host/db"


def database_from_url(url: str, *, base_dir: Path) -> dict:
    """No message shows any part of the URL's user name or password (``check_userinfo``,
    ``url_error``)."""
    check_userinfo("DATABASE_URL", url)
    scheme = urlsplit(url).scheme.lower()
    if scheme in MONGO_SCHEMES:
        return _mongodb(url)
    if scheme not in SQL_SCHEMES:
        # "user:password@host" has the "scheme" user: show it only when "://" follows it.
        shown = repr(scheme) if scheme and url.lower().startswith(f"{scheme}://") else "(none)"
        raise ImproperlyConfigured(f"DATABASE_URL scheme {shown} is not supported; {EXAMPLES}.")
    try:
        config = environ.Env.db_url_config(url)
    except ValueError as exc:  # a port that is not a number
        raise url_error(
            "DATABASE_URL", url, exc, environ.Env.db_url_config, hint=EXAMPLES, errors=(ValueError,)
        ) from None
    if config["ENGINE"] == "django.db.backends.sqlite3":
        return _sqlite(config, base_dir=base_dir)
    return _postgres(config)


def _sqlite(config: dict, *, base_dir: Path) -> dict:
    name = Path(config["NAME"] or "db.sqlite3")
    if not name.is_absolute():
        name = base_dir / name
    config["NAME"] = str(name)
    # ``?timeout=S`` in the URL sets the busy timeout (seconds); other options are not taken.
    given = (config.get("OPTIONS") or {}).get("timeout", SQLITE_BUSY_TIMEOUT)
    try:
        timeout = float(given)
    except ValueError:
        timeout = 0.0
    if not timeout > 0:  # also NaN
        raise ImproperlyConfigured(
            f"DATABASE_URL sets timeout={given}: the SQLite busy timeout is a positive number of seconds"
        )
    config["OPTIONS"] = {
        # BEGIN IMMEDIATE takes the write lock up front: two writers never
        # deadlock on a read-to-write upgrade, they queue on the busy timeout.
        "transaction_mode": "IMMEDIATE",
        "timeout": timeout,
        "init_command": (
            f"PRAGMA journal_mode=WAL;PRAGMA synchronous=NORMAL;PRAGMA busy_timeout={round(timeout * 1000)};"
        ),
    }
    config["TEST"] = {"NAME": str(name.with_name(f"test_{name.name}"))}
    return config


def _postgres(config: dict) -> dict:
    config["ENGINE"] = "django.db.backends.postgresql"
    options = config.setdefault("OPTIONS", {})
    options.setdefault("connect_timeout", CONNECT_TIMEOUT)
    # A peer that vanishes mid-query (network cut) is noticed in seconds,
    # not after the kernel's 15-minute retransmission limit.
    options.setdefault("keepalives", 1)
    options.setdefault("keepalives_idle", 5)
    options.setdefault("keepalives_interval", 2)
    options.setdefault("keepalives_count", 3)
    options.setdefault("tcp_user_timeout", 10_000)
    options.setdefault("application_name", "cf-contest-sync")
    # Only a primary: a standby in recovery is refused at connect, and a multi-host URL
    # (postgres://app@db1,db2/app) finds whichever is the primary now, after a failover too
    # (docs/faults.md, "Failover"). ``?target_session_attrs=any`` in the URL overrides it.
    options.setdefault("target_session_attrs", "read-write")
    return config


def _mongodb(url: str) -> dict:
    """The connection string goes to the backend unchanged (``HOST``): pymongo
    parses it when it connects. It is checked here first, offline (no SRV
    lookup), so a typo stops start-up with a clear message instead of a
    traceback on the first tick."""
    from pymongo.errors import ConfigurationError

    errors = (ConfigurationError, ValueError)  # pymongo's InvalidURI is the first
    try:
        parsed = _parse_mongodb_url(url)
    except errors as exc:
        raise url_error(
            "DATABASE_URL",
            url,
            exc,
            _parse_mongodb_url,
            hint="not a valid MongoDB connection string; e.g. mongodb://user:password@host:27017/contests",
            errors=errors,
        ) from None
    name, options = parsed
    if not name:
        raise ImproperlyConfigured(
            "A MongoDB DATABASE_URL must name the database: mongodb://host:27017/contests"
        )
    given = {key.lower(): value for key, value in options.items()}
    write_concern = str(given.get("w", "majority"))
    if write_concern != "majority":
        raise ImproperlyConfigured(
            f"DATABASE_URL sets w={write_concern}: the job lock needs majority write concern "
            "(a lease acknowledged by one replica-set member can be lost in a failover). "
            "Remove w= from the URL; majority is the default here."
        )
    timeout_ms = CONNECT_TIMEOUT * 1000
    defaults = {
        # An unreachable cluster is a skipped tick after 5 s, not a hang.
        "serverSelectionTimeoutMS": timeout_ms,
        "connectTimeoutMS": timeout_ms,
        # A peer that vanishes mid-operation is noticed, not waited for forever.
        "socketTimeoutMS": MONGODB_SOCKET_TIMEOUT * 1000,
        # Lock writes are acknowledged by a majority of a replica set, so a
        # failover cannot roll back a lease its holder was told it has. A
        # standalone server treats majority as its own acknowledgement.
        "w": "majority",
        # Without a bound, a majority write waits forever for lagging secondaries.
        "wTimeoutMS": timeout_ms,
        "appname": "cf-contest-sync",
    }
    return {
        # django_mongodb_backend, reporting an unreachable server the Django way.
        "ENGINE": MONGODB_ENGINE,
        "HOST": url,
        "NAME": name,
        # Options in the URL win; OPTIONS would override them (pymongo's rule).
        "OPTIONS": {key: value for key, value in defaults.items() if key.lower() not in given},
    }


def _parse_mongodb_url(url: str) -> tuple[str, Mapping]:
    """(database name, options) of a ``mongodb://`` or ``mongodb+srv://`` URL,
    validated by pymongo's own parser. An SRV URL is checked without the DNS
    lookup pymongo's ``parse_uri`` would make for it."""
    from pymongo import uri_parser
    from pymongo.errors import ConfigurationError

    scheme, _, rest = url.partition("://")
    if scheme.lower() == "mongodb":
        parsed = uri_parser.parse_uri(url)
        return parsed["database"] or "", parsed["options"]
    hosts_and_name, _, query = rest.partition("?")
    hosts, _, name = hosts_and_name.partition("/")
    nodes = uri_parser.split_hosts(hosts.rpartition("@")[2], default_port=None)
    if len(nodes) != 1 or nodes[0][1] is not None:
        raise ConfigurationError("a mongodb+srv:// URL names exactly one host name and no port")
    options = uri_parser.split_options(query) if query else {}
    return unquote_plus(name).split(".", 1)[0], options


def is_mongodb(config: dict) -> bool:
    return config["ENGINE"] in {MONGODB_ENGINE, "django_mongodb_backend"}


# What django-mongodb-backend needs besides the connection ("Configuring a
# project"), applied by settings only when MongoDB is selected: every model
# gets an ObjectId primary key, so the apps whose SQL migrations create
# integer ids (Django's contrib apps and ours) get MongoDB migrations of
# their own in mongo_migrations/.
MONGODB_AUTO_FIELD = "django_mongodb_backend.fields.ObjectIdAutoField"
MONGODB_APP_CONFIGS = {
    "django.contrib.admin": "config.mongodb.apps.MongoAdminConfig",
    "django.contrib.auth": "config.mongodb.apps.MongoAuthConfig",
    "django.contrib.contenttypes": "config.mongodb.apps.MongoContentTypesConfig",
    "axes": "config.mongodb.apps.MongoAxesConfig",
}
MONGODB_MIGRATION_MODULES = {
    label: f"mongo_migrations.{label}"
    for label in ("admin", "auth", "contenttypes", "locks", "locks_alerts", "contests", "axes")
}
