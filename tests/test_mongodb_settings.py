"""MongoDB support that can be checked without a MongoDB server.

The settings a ``mongodb://`` or ``mongodb+srv://`` URL selects, the MongoDB
migration modules being complete, what an unreachable cluster does to a tick,
and that the lock and sync code use only operations the backend has. The
contract tests against a real server are in ``tests/test_mongodb.py``.
"""

from __future__ import annotations

import ast
import json
import re
import socket
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.test.utils import CaptureQueriesContext

from config.database import CONNECT_TIMEOUT, database_from_url
from tests.conftest import ROOT, manage, project_env

MONGODB_ENGINE = "config.mongodb"
OBJECT_ID = "django_mongodb_backend.fields.ObjectIdAutoField"


def closed_port() -> int:
    """A loopback port nothing listens on: connections to it are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def parse(url: str) -> dict:
    return database_from_url(url, base_dir=ROOT)


def run_python(script: str, *, database_url: str) -> subprocess.CompletedProcess:
    """``script`` in a new process whose settings come from ``database_url``."""
    env = project_env(DATABASE_URL=database_url, DJANGO_SETTINGS_MODULE="config.settings")
    return subprocess.run(
        [sys.executable, "-c", "import django\ndjango.setup()\n" + script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


# --- DATABASE_URL → DATABASES["default"] -------------------------------------

URL_FORMS = [
    pytest.param("mongodb://localhost:27017/contests", id="standalone"),
    pytest.param(
        "mongodb://sync:p%40ss@db1.example.net:27017,db2.example.net:27018/contests"
        "?replicaSet=rs0&authSource=admin",
        id="replica-set",
    ),
    # .invalid never resolves: the settings must not look the SRV record up.
    pytest.param("mongodb+srv://sync:pass@cluster0.example.invalid/contests?retryWrites=true", id="srv"),
]


@pytest.mark.parametrize("url", URL_FORMS)
def test_a_mongodb_url_selects_the_backend_with_bounded_timeouts(url):
    config = parse(url)

    assert config["ENGINE"] == MONGODB_ENGINE
    assert config["HOST"] == url  # the backend and pymongo parse it themselves
    assert config["NAME"] == "contests"
    options = config["OPTIONS"]
    assert options["serverSelectionTimeoutMS"] == CONNECT_TIMEOUT * 1000 <= 5000
    assert options["connectTimeoutMS"] == CONNECT_TIMEOUT * 1000 <= 5000
    assert options["w"] == "majority"
    assert 0 < options["wTimeoutMS"] <= 5000
    assert options["socketTimeoutMS"] > 0


def test_options_in_the_url_win_over_the_defaults():
    config = parse("mongodb://localhost/contests?serverselectiontimeoutms=1500&W=majority&appName=mine")

    assert "serverSelectionTimeoutMS" not in config["OPTIONS"]
    assert "w" not in config["OPTIONS"]
    assert "appname" not in config["OPTIONS"]
    assert config["OPTIONS"]["connectTimeoutMS"] == 5000


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mongodb://localhost:27017/", "must name the database"),
        ("mongodb://localhost:27017", "must name the database"),
        ("mongodb+srv://cluster0.example.invalid/?retryWrites=true", "must name the database"),
        ("mongodb://localhost/contests?w=1", "w=1: the job lock needs majority write concern"),
        ("mongodb://localhost:port/contests", "not a valid MongoDB connection string"),
        (
            "mongodb://localhost/contests?serverSelectionTimeoutMS=soon",
            "not a valid MongoDB connection string",
        ),
        ("mongodb+srv://cluster0.example.invalid:27017/contests", "exactly one host name and no port"),
        ("mongodb+srv://a.example.invalid,b.example.invalid/contests", "exactly one host name and no port"),
        ("mongo://localhost/contests", "scheme 'mongo' is not supported"),
    ],
)
def test_a_bad_mongodb_url_is_refused_with_a_clear_message(url, message):
    with pytest.raises(ImproperlyConfigured) as excinfo:
        parse(url)

    assert message in str(excinfo.value)


# --- the whole settings module, per URL form (real processes) ----------------

SETTINGS_PROBE = textwrap.dedent(
    """
    import json
    from django.apps import apps
    from django.conf import settings
    from django.db import connections

    connection = connections["default"]

    print(json.dumps({
        "engine": settings.DATABASES["default"]["ENGINE"],
        "vendor": connection.vendor,
        "wrapper_bases": [f"{c.__module__}.{c.__qualname__}" for c in type(connection).__mro__],
        "default_auto_field": settings.DEFAULT_AUTO_FIELD,
        "migration_modules": settings.MIGRATION_MODULES,
        "app_configs": {
            c.label: f"{type(c).__module__}.{type(c).__qualname__}"
            for c in apps.get_app_configs()
        },
        "pk_fields": {
            m._meta.label: f"{type(m._meta.pk).__module__}.{type(m._meta.pk).__qualname__}"
            for m in apps.get_models()
        },
    }))
    """
)


def probe_settings(database_url: str) -> dict:
    done = run_python(SETTINGS_PROBE, database_url=database_url)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize(
    "url",
    ["mongodb://127.0.0.1:27017/contests", "mongodb+srv://cluster0.example.invalid/contests"],
)
def test_mongodb_settings_give_every_model_an_objectid_and_mongodb_migrations(url):
    found = probe_settings(url)

    assert found["engine"] == MONGODB_ENGINE
    assert found["vendor"] == "mongodb"
    assert "django_mongodb_backend.base.DatabaseWrapper" in found["wrapper_bases"]
    assert found["default_auto_field"] == OBJECT_ID
    assert found["migration_modules"] == {
        label: f"mongo_migrations.{label}"
        for label in ("admin", "auth", "contenttypes", "locks", "locks_alerts", "contests", "axes")
    }
    assert found["app_configs"]["admin"] == "config.mongodb.apps.MongoAdminConfig"
    assert found["app_configs"]["auth"] == "config.mongodb.apps.MongoAuthConfig"
    assert found["app_configs"]["contenttypes"] == "config.mongodb.apps.MongoContentTypesConfig"
    assert found["app_configs"]["axes"] == "config.mongodb.apps.MongoAxesConfig"  # it pins AutoField too
    # Sessions keep their own migrations: their key is a string, not an AutoField.
    auto_pks = {label: field for label, field in found["pk_fields"].items() if "AutoField" in field}
    assert {
        "locks.SyncLock",
        "locks.JobRun",
        "contests.Contest",
        "contests.Reminder",
        "auth.User",
        "axes.AccessAttempt",
        "axes.AccessLog",
    } <= set(auto_pks)
    assert set(auto_pks.values()) == {"django_mongodb_backend.fields.auto.ObjectIdAutoField"}


def test_the_client_the_backend_builds_has_the_bounds_and_majority_writes():
    """The real MongoClient, as the backend makes it from the settings (it
    connects lazily, so no server is needed to read its options)."""
    script = textwrap.dedent(
        """
        import json
        from django.db import connections

        wrapper = connections["default"]
        client = wrapper.get_new_connection(wrapper.get_connection_params())
        options = client.options
        print(json.dumps({
            "write_concern": client.write_concern.document,
            "server_selection_timeout": options.server_selection_timeout,
            "connect_timeout": options.pool_options.connect_timeout,
            "replica_set": options.replica_set_name,
            "read_preference": options.read_preference.mongos_mode,
            "database": wrapper.settings_dict["NAME"],
        }))
        client.close()
        """
    )
    url = f"mongodb://127.0.0.1:{closed_port()}/contests?replicaSet=rs0"

    done = run_python(script, database_url=url)

    assert done.returncode == 0, done.stderr
    client = json.loads(done.stdout)
    assert client["write_concern"] == {"w": "majority", "wtimeout": 5000}
    assert client["server_selection_timeout"] == client["connect_timeout"] == 5.0
    assert client["replica_set"] == "rs0"  # the URL still reaches pymongo whole
    assert client["read_preference"] == "primary"
    assert client["database"] == "contests"


@pytest.mark.parametrize(
    "url",
    ["sqlite:///var/settings-probe.sqlite3", "postgres://sync@127.0.0.1:5432/contests"],
)
def test_sql_settings_keep_the_apps_own_migrations(url):
    found = probe_settings(url)

    assert found["engine"] in {"django.db.backends.sqlite3", "django.db.backends.postgresql"}
    assert found["default_auto_field"] == "django.db.models.BigAutoField"
    assert found["migration_modules"] == {}
    assert found["app_configs"]["admin"] == "django.contrib.admin.apps.AdminConfig"
    assert found["pk_fields"]["locks.SyncLock"] == "django.db.models.fields.BigAutoField"
    assert found["pk_fields"]["auth.User"] == "django.db.models.fields.AutoField"
    assert not any("ObjectId" in field for field in found["pk_fields"].values())


# --- migrations ---------------------------------------------------------------


@pytest.mark.parametrize("backend", ["mongodb", "sqlite"])
def test_migrations_are_complete(backend, tmp_path):
    """``makemigrations --check`` finds nothing to add, with MongoDB settings
    (mongo_migrations/: ObjectId keys) and with SQL ones (the apps' own
    migrations, untouched). MongoDB needs no server here: the history check
    that wants one only warns."""
    url = {
        "mongodb": f"mongodb://127.0.0.1:{closed_port()}/contests?serverSelectionTimeoutMS=300",
        "sqlite": f"sqlite:///{tmp_path / 'check.sqlite3'}",
    }[backend]

    done = manage("makemigrations", "--check", "--dry-run", env=project_env(DATABASE_URL=url))

    assert done.returncode == 0, done.stdout + done.stderr
    assert "No changes detected" in done.stdout
    assert "Traceback" not in done.stderr


def test_mongodb_migrations_exist_only_under_mongo_migrations():
    files = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "mongo_migrations").glob("*/0*.py"))

    contrib = [f"mongo_migrations/{app}/0001_initial.py" for app in ("admin", "auth", "axes", "contenttypes")]
    # The project's apps: one MongoDB migration beside each SQL one, of the same name.
    # Each app's label and its package (locks.contrib.alerts is the app locks_alerts).
    apps = {"contests": "contests", "locks": "locks", "locks_alerts": "locks/contrib/alerts"}
    own = [
        f"mongo_migrations/{label}/{migration.name}"
        for label, package in apps.items()
        for migration in sorted((ROOT / package / "migrations").glob("0*.py"))
    ]
    assert files == sorted(contrib + own)
    for path in files:
        if path.endswith("/0001_initial.py"):  # later ones add fields, not tables
            assert "ObjectIdAutoField" in (ROOT / path).read_text(), path
    for package in apps.values():
        for migration in (ROOT / package / "migrations").glob("0*.py"):
            assert "django_mongodb_backend" not in migration.read_text(), migration


# --- an unreachable cluster ------------------------------------------------------


def test_an_unreachable_cluster_is_a_skipped_tick_with_one_warning(standin):
    """Lock semantic 8 on MongoDB, with the default 5 s timeouts: exit 0,
    one WARNING line naming the job and the cause, no traceback, no API call."""
    url = f"mongodb://127.0.0.1:{closed_port()}/contests"
    env = project_env(DATABASE_URL=url, CODEFORCES_API_URL=standin.url)

    done = manage("sync_contests", "--tick", "2026-01-01T10:00:00+00:00", env=env, timeout=60)

    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    warnings = [line for line in done.stderr.splitlines() if " WARNING " in line]
    assert len(warnings) == 1, done.stderr
    assert "job=sync_contests" in warnings[0]
    assert "outcome=skipped" in warnings[0]
    assert "database unreachable: OperationalError: cannot reach MongoDB" in warnings[0]
    assert "Connection refused" in warnings[0]
    assert standin.calls == 0


# --- portable operations -----------------------------------------------------------

CHECKED_MODULES = sorted(
    path
    for app in ("locks", "contests")
    for path in (ROOT / app).rglob("*.py")
    if "migrations" not in path.parts
)

# Operations django-mongodb-backend does not have (its "Known issues and
# limitations"), or that are SQL by nature.
UNSUPPORTED_METHODS = {
    "raw": "raw SQL",
    "extra": "raw SQL",
    "select_for_update": "a no-op on MongoDB",
    "prefetch_related": "not supported on MongoDB",
    "cursor": "raw SQL",
    "execute": "raw SQL",
    "executemany": "raw SQL",
}
UNSUPPORTED_NAMES = {"RawSQL": "raw SQL", "FilteredRelation": "not supported on MongoDB"}
# Uses that are right on MongoDB too, and why.
ALLOWED = {
    # Only where the connection has SKIP LOCKED and NOWAIT (SQL databases that lock rows), as the
    # ORM's own compiled SQL with FOR UPDATE … added (Django refuses select_for_update() in autocommit);
    # elsewhere the rows are returned unchanged: MongoDB locks no rows to wait for.
    ("locks/db.py", "unlocked", "RawSQL"),
    # set_config() of the server's timeouts, only when the vendor is PostgreSQL.
    ("locks/db.py", "_set_local", "cursor"),
    ("locks/db.py", "_set_local", "execute"),
    # The server's history (WAL timeline, system id) and replication settings: PostgreSQL only.
    ("locks/db.py", "replication_settings", "cursor"),
    ("locks/db.py", "replication_settings", "execute"),
    # acquire's claim returning the won row (UPDATE … RETURNING), only where the vendor is PostgreSQL
    # or SQLite; on MongoDB update_returning takes the ORM's update and then a read.
    ("locks/db.py", "update_returning", "cursor"),
    ("locks/db.py", "update_returning", "execute"),
    ("locks/db.py", "update_returning", "SQL text"),
    # The tick claim's one statement, only where the vendor is PostgreSQL or SQLite (CLAIM_NOW);
    # on MongoDB TickQuerySet.claim takes its ORM path (tests/test_mongodb.py runs it).
    ("locks/models.py", "_claim_in_one", "cursor"),
    ("locks/models.py", "_claim_in_one", "execute"),
    ("locks/models.py", "_claim_in_one", "SQL text"),
}
UNSUPPORTED_KEYWORDS = {
    "update_conflicts": "INSERT … ON CONFLICT",
    "ignore_conflicts": "INSERT … ON CONFLICT",
    "unique_fields": "INSERT … ON CONFLICT",
}
# Query expressions: MongoDB cannot insert them (only update with them).
EXPRESSIONS = {"Now", "F", "Value", "ExpressionWrapper", "Case", "When", "Coalesce", "Func", "now_plus"}
INSERTS = {"create", "get_or_create", "update_or_create", "bulk_create"}
SQL_TEXT = re.compile(r"\b(RETURNING|SELECT\s.*\sFROM|UPDATE\s+\S+\s+SET|INSERT\s+INTO|DELETE\s+FROM)\b")


def _is_expression(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and getattr(node.func, "id", None) in EXPRESSIONS


def _expression_names(function: ast.AST) -> set[str]:
    """Names a function binds to a query expression (``until = now_plus(window)``): inserting
    one of them inserts the expression."""
    return {
        target.id
        for node in ast.walk(function)
        if isinstance(node, ast.Assign) and any(_is_expression(inner) for inner in ast.walk(node.value))
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def _violations(source: str, relative: str, used: set | None = None) -> list[str]:
    """What ``source`` uses that MongoDB cannot run; ``used`` collects the ``ALLOWED`` entries it met."""
    used = set() if used is None else used
    tree = ast.parse(source, filename=relative)
    found = []
    bound: set[str] = set()

    def allowed(function: str, what: str) -> bool:
        if (relative, function, what) in ALLOWED:
            used.add((relative, function, what))
            return True
        return False

    def visit(node: ast.AST, function: str) -> None:
        nonlocal bound
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            function = node.name
            bound = _expression_names(node)
        where = f"{relative}:{getattr(node, 'lineno', '?')} in {function or 'module'}()"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            method = node.func.attr
            if method in UNSUPPORTED_METHODS and not allowed(function, method):
                found.append(f"{where}: .{method}() ({UNSUPPORTED_METHODS[method]})")
        if isinstance(node, ast.Name) and node.id in UNSUPPORTED_NAMES and not allowed(function, node.id):
            found.append(f"{where}: {node.id} ({UNSUPPORTED_NAMES[node.id]})")
        if isinstance(node, ast.keyword) and node.arg in UNSUPPORTED_KEYWORDS:
            found.append(f"{where}: {node.arg}= ({UNSUPPORTED_KEYWORDS[node.arg]})")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in INSERTS:
            for keyword in node.keywords:
                for inner in ast.walk(keyword.value):
                    if _is_expression(inner):
                        call = f".{node.func.attr}({keyword.arg}={inner.func.id}(…))"
                        found.append(f"{where}: {call} inserts an expression")
                    elif isinstance(inner, ast.Name) and inner.id in bound:
                        call = f".{node.func.attr}({keyword.arg}={inner.id})"
                        found.append(f"{where}: {call} inserts an expression (bound to {inner.id} above)")
        is_text = isinstance(node, ast.Constant) and isinstance(node.value, str)
        if is_text and SQL_TEXT.search(node.value) and not allowed(function, "SQL text"):
            found.append(f"{where}: SQL text {node.value!r}")
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Expr) and isinstance(child.value, ast.Constant):
                continue  # a docstring: prose may name SQL
            visit(child, function)

    visit(tree, "")
    return found


def test_the_checked_modules_include_the_lock_and_the_sync():
    names = {path.relative_to(ROOT).as_posix() for path in CHECKED_MODULES}

    assert {"locks/lease.py", "locks/operator.py", "locks/runner.py", "locks/status.py"} <= names
    assert {"locks/views.py"} <= names  # the trigger's rate limit, /healthz
    assert "locks/models.py" in names
    assert "contests/services.py" in names
    assert {"contests/models.py", "contests/jobs.py"} <= names
    assert {"contests/reminders.py", "contests/admin.py"} <= names


def test_lock_and_sync_code_use_only_operations_mongodb_has():
    used: set = set()
    violations = [
        line
        for path in CHECKED_MODULES
        for line in _violations(path.read_text(), path.relative_to(ROOT).as_posix(), used)
    ]

    assert violations == []
    assert ALLOWED - used == set()  # an allowance the code no longer needs goes too


def test_the_static_check_catches_what_it_looks_for():
    """The scanner itself can fail: each forbidden form in a sample is reported."""
    sample = textwrap.dedent(
        """
        def f(qs, connection, Model):
            qs.select_for_update()
            qs.raw("SELECT 1")
            connection.cursor()
            Model.objects.bulk_create([], update_conflicts=True)
            Model.objects.create(at=Now(), n=F("n") + 1)
            return "UPDATE t SET a = 1 RETURNING a"

        def _update_returning(connection):
            connection.cursor().execute("UPDATE t SET a = 1 RETURNING a")

        def throttle(Model, window):
            until = now_plus(window)
            plain = 1
            Model.objects.create(key="k", until=until, n=plain)
        """
    )

    found = _violations(sample, "locks/lease.py")

    assert len(found) == 11, found
    assert any("select_for_update" in line for line in found)
    assert any(".raw" in line for line in found)
    assert any(".cursor" in line for line in found)
    assert any("update_conflicts=" in line for line in found)
    assert sum("inserts an expression" in line for line in found) == 3
    assert any(".create(until=until) inserts an expression (bound to until above)" in line for line in found)
    assert sum("RETURNING" in line for line in found) == 2


def test_a_delete_through_a_join_is_refused_by_mongodb_and_the_prune_avoids_it():
    """On the real backend (no server needed: it refuses before sending
    anything), a delete through the join raises NotSupportedError, and
    prune_stale_reminders() takes its portable path instead: that one fails
    only because no server answers its read."""
    script = textwrap.dedent(
        """
        from django.db import DatabaseError, NotSupportedError, OperationalError, connection
        from contests.models import Reminder
        from contests.services import prune_stale_reminders
        try:  # the first connection attempt: its failure is not the point here
            connection.ensure_connection()
        except OperationalError as exc:
            print("connect:", exc)
        for label, call in [
            ("join delete", lambda: Reminder.objects.stale().delete()),
            ("prune", prune_stale_reminders),
            ("tables", connection.introspection.table_names),
        ]:
            try:
                call()
            except NotSupportedError as exc:
                print(f"{label}: NotSupportedError {exc}")
            except DatabaseError as exc:
                print(f"{label}: {type(exc).__name__} {exc.__cause__!r}")
        """
    )
    url = f"mongodb://127.0.0.1:{closed_port()}/contests?serverSelectionTimeoutMS=300"

    done = run_python(script, database_url=url)

    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("connect: cannot reach MongoDB"), lines
    assert lines[1].startswith("join delete: NotSupportedError Cannot use QuerySet.delete()"), lines
    assert lines[2].startswith("prune: DatabaseError ServerSelectionTimeoutError"), lines
    # The lock's first-use check (does its collection exist?) fails the Django way too.
    assert lines[3].startswith("tables: OperationalError ServerSelectionTimeoutError"), lines


@pytest.mark.django_db
def test_the_portable_prune_deletes_what_the_sql_delete_deletes(django_user_model):
    """The MongoDB form (read keys, delete by key) on SQL: same rows as the one
    DELETE through the join, which stays one statement on SQL."""
    from contests.models import Contest, Reminder
    from contests.services import delete_by_pk, prune_stale_reminders

    now = datetime(2026, 1, 1, 12, tzinfo=UTC)

    def contest(contest_id: int, *, start: datetime, phase: str = "BEFORE", removed: bool = False) -> Contest:
        return Contest.objects.create(
            contest_id=contest_id,
            name=f"Round {contest_id}",
            type="CF",
            phase=phase,
            start_time=start,
            duration=timedelta(hours=2),
            fingerprint="x",
            updated_at=now,
            removed_at=now if removed else None,
        )

    user = django_user_model.objects.create_user("reminded")
    contests = {
        "started": contest(1, start=now - timedelta(hours=1), phase="CODING"),
        "finished": contest(2, start=now - timedelta(days=2), phase="FINISHED"),
        "removed": contest(3, start=now + timedelta(days=1), removed=True),
        "upcoming": contest(4, start=now + timedelta(days=1)),
        "later": contest(5, start=now + timedelta(days=3)),
    }

    def remind_all() -> None:
        Reminder.objects.all().delete()
        for name, c in contests.items():
            Reminder.objects.create(user=user, contest=c, remind_at=now + timedelta(minutes=len(name)))

    remind_all()
    deleted_portably = delete_by_pk(Reminder.objects.stale(now=now))
    kept_portably = set(Reminder.objects.values_list("contest__contest_id", flat=True))

    remind_all()
    with CaptureQueriesContext(connection) as queries:
        deleted_by_sql = prune_stale_reminders(now=now)
    kept_by_sql = set(Reminder.objects.values_list("contest__contest_id", flat=True))

    assert deleted_portably == deleted_by_sql == 3
    assert kept_portably == kept_by_sql == {4, 5}
    statements = [q["sql"] for q in queries if not q["sql"].startswith(("BEGIN", "SAVEPOINT", "RELEASE"))]
    assert len(statements) == 1, statements
    assert statements[0].startswith("DELETE FROM")
