#!/usr/bin/env bash
# A PostgreSQL for the Prefect server, in a folder of its own, on a loopback port.
#
#   infra/postgres.sh start DIR [PORT]   # initdb on first use, then pg_ctl start; prints the URL
#   infra/postgres.sh stop DIR
#
# The URL it prints is what the Prefect server reads:
#   PREFECT_SERVER_DATABASE_CONNECTION_URL=postgresql+asyncpg://prefect:PASSWORD@127.0.0.1:PORT/prefect
# The password is random, made at initdb and kept in DIR/password (mode 600). PostgreSQL refuses
# to run as root: as root the server runs as $SPECREGEN_PG_USER (default `postgres`, the user
# Debian's package creates), which then owns DIR. Debian: apt-get install postgresql
# (scripts/setup.sh does that in CI). A managed or shared PostgreSQL works just as well: set
# PREFECT_SERVER_DATABASE_CONNECTION_URL to it and skip this script.
set -euo pipefail
cmd=${1:?usage: postgres.sh start|stop DIR [PORT]}
dir=${2:?usage: postgres.sh start|stop DIR [PORT]}
port=${3:-5432}

bin=""
if command -v pg_ctl >/dev/null 2>&1 && command -v initdb >/dev/null 2>&1; then
    bin=$(dirname "$(command -v pg_ctl)")
else
    for candidate in /usr/lib/postgresql/*/bin; do
        [ -x "$candidate/pg_ctl" ] && bin=$candidate
    done
fi
if [ -z "$bin" ]; then
    echo "error: no PostgreSQL server (pg_ctl, initdb) found; Debian: apt-get install postgresql" >&2
    exit 2
fi

as_owner() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u "${SPECREGEN_PG_USER:-postgres}" -- "$@"
    else
        "$@"
    fi
}

case "$cmd" in
start)
    mkdir -p "$dir"
    if [ "$(id -u)" = 0 ]; then
        chown "${SPECREGEN_PG_USER:-postgres}" "$dir"
    fi
    chmod 700 "$dir"
    if [ ! -f "$dir/data/PG_VERSION" ]; then
        umask 077
        python3 -c 'import secrets; print(secrets.token_hex(16))' >"$dir/password.tmp"
        if [ "$(id -u)" = 0 ]; then
            chown "${SPECREGEN_PG_USER:-postgres}" "$dir/password.tmp"
        fi
        # scram on every connection; the superuser is `prefect` (owner of the `prefect` db).
        as_owner "$bin/initdb" -D "$dir/data" -U prefect --pwfile="$dir/password.tmp" \
            --auth=scram-sha-256 --encoding=UTF8 --no-instructions >"$dir/initdb.log" 2>&1 \
            || { cat "$dir/initdb.log" >&2; exit 1; }
        mv "$dir/password.tmp" "$dir/password"
    fi
    # Loopback only, the socket in DIR (not /run/postgresql, which may not be writable).
    if ! as_owner "$bin/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then
        as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 \
            -o "-p $port -c listen_addresses=127.0.0.1 -k $dir -c max_connections=200" start \
            >/dev/null || { tail -n 20 "$dir/postgres.log" >&2; exit 1; }
    fi
    password=$(cat "$dir/password")
    if ! PGPASSWORD=$password psql -h 127.0.0.1 -p "$port" -U prefect -d postgres -tAc \
        "SELECT 1 FROM pg_database WHERE datname = 'prefect'" | grep -q 1; then
        PGPASSWORD=$password psql -h 127.0.0.1 -p "$port" -U prefect -d postgres -q \
            -c "CREATE DATABASE prefect OWNER prefect" >/dev/null
    fi
    echo "postgresql+asyncpg://prefect:$password@127.0.0.1:$port/prefect"
    ;;
stop)
    if [ -f "$dir/data/postmaster.pid" ]; then
        as_owner "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
    fi
    ;;
*)
    echo "usage: postgres.sh start|stop DIR [PORT]" >&2
    exit 2
    ;;
esac
