"""A MongoDB-wire server for the MongoDB suite when no ``MONGODB_URI`` is given: SecantusDB
(``secantusdb`` in requirements-dev.txt, pinned), a MongoDB-compatible server written in Python
over WiredTiger that presents itself as a one-node replica set named ``secantus``.

It is not MongoDB: docs/mongodb.md says what that means. The server runs in a process of its
own (``python -m tests.mongo_server --port N``) with three of its bugs worked around below, in
that process only, one function per bug; the product's code is the code that runs on ``mongod``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import wraps
from pathlib import Path

SECANTUS_VERSION = "0.7.0b3"
REPLICA_SET = "secantus"  # the name SecantusDB gives its one-node replica set
START_TIMEOUT = 60  # seconds for the server to answer ``hello``


def _naive(value: dt.datetime) -> dt.datetime:
    return value.astimezone(dt.UTC).replace(tzinfo=None)


def fix_now_is_timezone_aware() -> None:
    """``$$NOW`` is an aware datetime while the dates the server stores and reads back are naive
    (UTC): the server compares the two as different types, so ``locked_until < $$NOW`` is never
    true and a lease never expires. mongod's ``$$NOW`` is a plain Date: bind it naive (UTC)."""
    from secantus import aggregate, commands

    resolve_let_vars = commands._resolve_let_vars

    @wraps(resolve_let_vars)
    def naive_let_vars(let):
        bound = resolve_let_vars(let)
        bound["NOW"] = _naive(bound["NOW"])
        return bound

    commands._resolve_let_vars = naive_let_vars

    apply_pipeline = aggregate.apply_pipeline

    @wraps(apply_pipeline)
    def with_naive_now(docs, pipeline, ctx=None, **kwargs):
        ctx = ctx or aggregate.PipelineContext()
        if isinstance(ctx.vars.get("NOW"), dt.datetime):
            ctx.vars["NOW"] = _naive(ctx.vars["NOW"])
        else:
            ctx.vars["NOW"] = _naive(dt.datetime.now(dt.UTC))
        return apply_pipeline(docs, pipeline, ctx, **kwargs)

    aggregate.apply_pipeline = commands.apply_pipeline = with_naive_now


def fix_update_creates_a_missing_collection() -> None:
    """An ``update`` with no upsert creates the collection it names when it is missing; mongod
    matches nothing and creates nothing. The lock relies on that to refuse an unmigrated database
    (its collection would otherwise appear without the unique index on the job name)."""
    from secantus import commands

    update = commands._HANDLERS["update"]

    @wraps(update)
    def update_existing(doc, ctx):
        statements = doc.get("updates") or []
        upserts = any(isinstance(s, dict) and s.get("upsert") for s in statements)
        name = doc.get("update")
        if isinstance(name, str) and not upserts and not ctx.storage.collection_exists(ctx.db_name, name):
            return {"n": 0, "nModified": 0, "ok": 1.0}
        return update(doc, ctx)

    commands._HANDLERS["update"] = update_existing


def fix_nested_project_inclusion() -> None:
    """A ``$project`` stage's nested inclusion (``{"contest": {"contest_id": 1}}``, how the
    backend reads a ``select_related`` row) is stored as the literal ``{"contest_id": 1}`` instead
    of the field's value. mongod reads a nested field the same as its dotted path: pass it so."""
    from secantus import aggregate

    def dotted(spec, prefix=""):
        flat = {}
        for key, value in spec.items():
            nested = isinstance(value, dict) and value and not any(k.startswith("$") for k in value)
            if nested:
                flat.update(dotted(value, f"{prefix}{key}."))
            else:
                flat[f"{prefix}{key}"] = value
        return flat

    project_one = aggregate._project_one

    @wraps(project_one)
    def project_dotted(doc, spec, vars):
        return project_one(doc, dotted(spec), vars)

    aggregate._project_one = project_dotted


def fix_abandoned_transactions_are_never_reaped() -> None:
    """A transaction idle past its lifetime is aborted only when another transaction's statement
    comes: one whose client died (a holder SIGKILLed inside its fenced write) holds its documents
    for good, and the plain writes that meet them retry without end. mongod aborts it after
    ``transactionLifetimeLimitSeconds`` by itself: reap once a second."""
    from secantus import server

    start = server.SecantusDBServer.start

    @wraps(start)
    def start_and_reap(self, *args, **kwargs):
        started = start(self, *args, **kwargs)

        def reap() -> None:
            while True:
                time.sleep(1)
                self.transactions.prune_expired()

        threading.Thread(target=reap, name="reap-transactions", daemon=True).start()
        return started

    server.SecantusDBServer.start = start_and_reap


def set_transaction_lifetime(seconds: float) -> None:
    """mongod's ``transactionLifetimeLimitSeconds`` (60 by default), which SecantusDB's command line
    does not take."""
    from secantus import server

    init = server.SecantusDBServer.__init__

    @wraps(init)
    def init_with_lifetime(self, *args, **kwargs):
        init(self, *args, **{**kwargs, "transaction_lifetime_seconds": seconds})

    server.SecantusDBServer.__init__ = init_with_lifetime


def patch_server() -> None:
    from importlib.metadata import version

    found = version("secantusdb")
    if found != SECANTUS_VERSION:  # the fixes below read this version's internals
        raise SystemExit(f"tests.mongo_server works around secantusdb {SECANTUS_VERSION}; found {found}")
    fix_now_is_timezone_aware()
    fix_update_creates_a_missing_collection()
    fix_nested_project_inclusion()
    fix_abandoned_transactions_are_never_reaped()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def answers(uri: str) -> bool:
    from pymongo import MongoClient
    from pymongo.errors import PyMongoError

    client = MongoClient(uri, serverSelectionTimeoutMS=500)
    try:
        return client.admin.command("hello").get("isWritablePrimary", False)
    except PyMongoError:
        return False
    finally:
        client.close()


@contextmanager
def secantusdb(*, log: Path, standalone: bool = False, transaction_lifetime: float = 60) -> Iterator[str]:
    """A SecantusDB server on a free loopback port, its data in a temporary directory removed at
    the end; yields its URI (``?replicaSet=secantus``, or a standalone server's: no transactions).
    ``transaction_lifetime``: seconds a transaction may idle before the server aborts it."""
    port = free_port()
    uri = f"mongodb://127.0.0.1:{port}/" + ("" if standalone else f"?replicaSet={REPLICA_SET}")
    root = Path(__file__).resolve().parent.parent
    with open(log, "ab") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "tests.mongo_server", "--port", str(port)]
            + ["--transaction-lifetime", str(transaction_lifetime)]
            + (["--standalone"] if standalone else []),
            cwd=root,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not answers(uri):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"SecantusDB did not start on port {port}: see {log}")
            time.sleep(0.2)
        yield uri
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--storage-path", default=":memory:")
    parser.add_argument("--standalone", action="store_true", help="not a one-node replica set")
    parser.add_argument("--transaction-lifetime", type=float, default=60, help="seconds (mongod: 60)")
    args = parser.parse_args()
    patch_server()
    set_transaction_lifetime(args.transaction_lifetime)
    from secantus.cli import main as serve

    sys.argv = [
        "secantusd-py",
        "--host=127.0.0.1",
        f"--port={args.port}",
        f"--storage-path={args.storage_path}",
        "--log-level=WARNING",
        *(["--standalone"] if args.standalone else []),
    ]
    return serve()


if __name__ == "__main__":
    sys.exit(main())
