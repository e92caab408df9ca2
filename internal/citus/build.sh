#!/usr/bin/env bash
# Builds and installs Citus from a source directory (a checkout of
# citusdata/citus at tag v12.1.12, the last line for PostgreSQL 15) into
# the PostgreSQL 15 found by pg_config.
#
#   internal/citus/build.sh /path/to/citus
#
# Needs Debian's postgresql-server-dev-15 libzstd-dev liblz4-dev
# libkrb5-dev flex bison (installing them upgrades PostgreSQL 15 in place:
# stop running clusters first). About two to five minutes on two cores.
set -euo pipefail
src=${1:?usage: build.sh CITUS_SOURCE_DIR}
pg_config=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
[ -x "$pg_config" ] || pg_config=$(command -v pg_config)
cd "$src"
PG_CONFIG=$pg_config ./configure --without-libcurl
make -j"$(nproc)"
make install
echo "installed: $("$pg_config" --pkglibdir)/citus.so"
