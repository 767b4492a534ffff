#!/usr/bin/env bash
# Create the project's virtual environment and install splitflow with its pinned
# development dependencies (pyproject.toml is the one place versions are pinned).
set -euo pipefail
py="${1:-python3}"
venv="${2:-.venv}"
"$py" - <<'PYCHECK'
import sys
if sys.version_info < (3, 11):
    sys.exit(f"splitflow needs Python 3.11 or newer; {sys.executable} is {sys.version.split()[0]}")
PYCHECK
# PySpark needs a Java runtime (17 is what it is tested with here).
if ! command -v java >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "bootstrap: no java found; installing openjdk-17-jre-headless" >&2
        apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless >/dev/null
    else
        echo "bootstrap: PySpark needs Java 17: install a JDK/JRE 17 and put java on PATH" >&2
        exit 1
    fi
fi
java -version 2>&1 | head -1 | grep -Eq '"(17|21)[."]' \
    || echo "bootstrap: warning: Spark 4.3 is tested with Java 17; found: $(java -version 2>&1 | head -1)" >&2
# The PostgreSQL tests start a throw-away server from /usr/lib/postgresql/*/bin; the JDBC
# driver (/usr/share/java/postgresql.jar) is for the Spark JDBC comparison benchmark.
if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "bootstrap: no PostgreSQL server found; installing postgresql-15" >&2
        apt-get update -qq && apt-get install -y -qq postgresql-15 libpostgresql-jdbc-java >/dev/null
    else
        echo "bootstrap: warning: no PostgreSQL server in /usr/lib/postgresql/*/bin:" \
            "the PostgreSQL tests will be skipped (install postgresql-15)" >&2
    fi
elif [ ! -f /usr/share/java/postgresql.jar ] && [ "$(id -u)" = 0 ] \
        && command -v apt-get >/dev/null 2>&1; then
    echo "bootstrap: installing libpostgresql-jdbc-java (for bench/)" >&2
    { apt-get install -y -qq libpostgresql-jdbc-java >/dev/null 2>&1 \
        || { apt-get update -qq && apt-get install -y -qq libpostgresql-jdbc-java >/dev/null; }; } \
        || echo "bootstrap: warning: could not install libpostgresql-jdbc-java;" \
            "bench/pg_snapshot.py compares with a psycopg COPY loop instead of Spark JDBC" >&2
fi
# The MySQL/MariaDB CDC tests start a throw-away MariaDB (mariadbd, mariadb-install-db, the
# mysql user; the package brings the mariadb client too). Where apt may start services, it
# also starts the system's own MariaDB on port 3306; the tests do not use it.
if ! command -v mariadbd >/dev/null 2>&1 && [ ! -x /usr/sbin/mariadbd ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "bootstrap: no MariaDB server found; installing mariadb-server" >&2
        apt-get update -qq && apt-get install -y -qq mariadb-server >/dev/null
    else
        echo "bootstrap: warning: no MariaDB server (mariadbd):" \
            "the MySQL/MariaDB tests will be skipped (install mariadb-server)" >&2
    fi
fi
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -e ".[dev,spark,kafka,postgres,objectstore,mysql,delta]"
# Azurite, the Azure Storage emulator the object-store tests start (npm registry, Node 18+),
# into a project-local folder; only when missing.
azurite_version=3.37.0
if [ ! -x .tools/azurite/node_modules/.bin/azurite-blob ]; then
    if command -v npm >/dev/null 2>&1; then
        mkdir -p .tools/azurite
        (cd .tools/azurite && npm install --no-audit --no-fund --silent "azurite@$azurite_version") \
            || echo "bootstrap: warning: npm could not install azurite; the Azure tests will be skipped" >&2
    else
        echo "bootstrap: warning: no npm: the Azure object-store tests will be skipped" \
            "(install Node.js 18+ and run this again)" >&2
    fi
fi
