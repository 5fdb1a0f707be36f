#!/usr/bin/env bash
# Run a command against a throwaway PostgreSQL cluster, then stop and delete it.
#
#   scripts/with-postgres.sh COMMAND [ARG...]      e.g. scripts/with-postgres.sh .venv/bin/python -m pytest
#
# The cluster (Debian's postgresql package, version 15 unless PG_BIN says otherwise) lives in a
# temporary directory, trusts local connections only (127.0.0.1, ::1 and the 198.18.0.0/15 test
# range used by the network-namespace tests), and listens on a free port. The command sees:
#
#   DATABASE_URL          postgres://postgres@127.0.0.1:PORT/contests
#   WITH_POSTGRES_BIN     the server's bin directory      } so that fault tests can stop and
#   WITH_POSTGRES_DATA    the cluster's data directory    } restart this server
#   WITH_POSTGRES_RUNAS   the OS user that owns it (postgres when run as root)
#
# The exit status is the command's. The cluster is deleted however the command ends. It is the
# one throwaway-PostgreSQL helper: tests, `make bench PG=throwaway` (python -m bench re-runs
# itself inside it) and scripts use it. WITH_POSTGRES_DURABLE=1 keeps fsync and synchronous
# commits on, as on a real server (the benchmark's timings); tests leave them off.
# WITH_POSTGRES_CONF: more lines for postgresql.conf (the benchmark preloads pg_stat_statements).
set -euo pipefail

if [ $# -eq 0 ]; then
    echo "usage: $0 COMMAND [ARG...]" >&2
    exit 2
fi

PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
if [ ! -x "$PG_BIN/initdb" ]; then
    newest=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
    if [ -n "$newest" ] && [ -x "$newest/initdb" ]; then
        PG_BIN=$newest
    else
        echo "$0: PostgreSQL server binaries not found in $PG_BIN." >&2
        echo "Install them (apt-get install postgresql) or set PG_BIN to the directory holding initdb." >&2
        exit 2
    fi
fi

# initdb and postgres refuse to run as root: run them as the postgres user, which then owns
# the data directory. Anyone else runs them as themselves.
if [ "$(id -u)" = 0 ]; then
    RUNAS=postgres
    as_owner() { runuser -u "$RUNAS" -- "$@"; }
else
    RUNAS=$(id -un)
    as_owner() { "$@"; }
fi

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/with-postgres.XXXXXX")
DATA=$WORK/data
LOG=$WORK/postgres.log
chmod 755 "$WORK"
[ "$RUNAS" = "$(id -un)" ] || chown "$RUNAS" "$WORK"

cleanup() {
    local status=$?
    trap - EXIT INT TERM
    if [ -f "$DATA/postmaster.pid" ]; then
        as_owner "$PG_BIN/pg_ctl" -D "$DATA" -m immediate -w -t 30 stop >/dev/null 2>&1 || true
    fi
    rm -rf "$WORK"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

as_owner "$PG_BIN/initdb" -D "$DATA" -A trust -U postgres -E UTF8 --locale=C.UTF-8 >"$WORK/initdb.log" 2>&1 || {
    cat "$WORK/initdb.log" >&2
    exit 1
}

PORT=${WITH_POSTGRES_PORT:-$(free_port)}
# The server listens on every address so that network namespaces can reach it over their veth
# links; pg_hba.conf (below) admits only loopback and the 198.18.0.0/15 test range.
as_owner tee -a "$DATA/postgresql.conf" >/dev/null <<EOF

# --- scripts/with-postgres.sh: a throwaway test cluster ---
listen_addresses = '*'
port = $PORT
unix_socket_directories = '$WORK'
max_connections = 200
log_min_messages = warning
${WITH_POSTGRES_CONF:-}
EOF
if [ "${WITH_POSTGRES_DURABLE:-0}" != 1 ]; then
    # Durability across an OS crash is not under test here; a crash of a client or a stopped
    # server is, and neither needs fsync.
    as_owner tee -a "$DATA/postgresql.conf" >/dev/null <<EOF
fsync = off
synchronous_commit = off
full_page_writes = off
EOF
fi
as_owner tee "$DATA/pg_hba.conf" >/dev/null <<EOF
local all all trust
host all all 127.0.0.1/32 trust
host all all ::1/128 trust
host all all 198.18.0.0/15 trust
EOF

as_owner "$PG_BIN/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 start >/dev/null || {
    cat "$LOG" >&2
    exit 1
}
"$PG_BIN/createdb" -h 127.0.0.1 -p "$PORT" -U postgres contests

export DATABASE_URL="postgres://postgres@127.0.0.1:$PORT/contests"
export WITH_POSTGRES_BIN=$PG_BIN WITH_POSTGRES_DATA=$DATA WITH_POSTGRES_RUNAS=$RUNAS
echo "with-postgres: $("$PG_BIN/postgres" --version) at $DATABASE_URL" >&2

set +e
"$@"
status=$?
set -e
exit "$status"
