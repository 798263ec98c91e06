#!/usr/bin/env bash
# Install everything Chorus needs on Debian 12 (run as root; idempotent):
# Debian packages, the Python environment in .venv/, the C extension.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
say() { printf 'setup: %s\n' "$*"; }

[ "$(id -u)" = 0 ] || { echo "setup: run as root (it installs Debian packages)" >&2; exit 1; }

PACKAGES=(postgresql-15 postgresql-server-dev-15 postgresql-contrib postgresql-plpython3-15
          corosync libcpg-dev libvotequorum-dev libquorum-dev libcorosync-common-dev
          iproute2 build-essential pkg-config libffi-dev
          python3 python3-venv python3-dev procps openssl util-linux)
command -v java >/dev/null 2>&1 || PACKAGES+=(openjdk-17-jre-headless)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing Debian packages: ${missing[*]}"
  # do not let the packages start their own PostgreSQL or Corosync services
  policy=/usr/sbin/policy-rc.d
  had_policy=0; [ -e "$policy" ] && had_policy=1 && cp "$policy" "$policy.chorus-save"
  printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod +x "$policy"
  trap 'if [ $had_policy = 1 ]; then mv "$policy.chorus-save" "$policy"; else rm -f "$policy"; fi' EXIT
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  if [ $had_policy = 1 ]; then mv "$policy.chorus-save" "$policy"; else rm -f "$policy"; fi
  trap - EXIT
fi

# Coordinators run as the postgres OS user: let it use Corosync's IPC.
mkdir -p /etc/corosync/uidgid.d
printf 'uidgid {\n  uid: postgres\n  gid: postgres\n}\n' > /etc/corosync/uidgid.d/chorus-postgres

# The postgres user must be able to read the repository and run the virtual environment.
if ! su postgres -s /bin/sh -c "test -r '$REPO/pyproject.toml'"; then
  echo "setup: the postgres user cannot read $REPO; clone Chorus under a directory it can read (e.g. /opt or /srv)" >&2
  exit 1
fi

# Python environment: Debian's python3 (readable by every user), not a per-user interpreter.
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import sys; sys.exit(sys.prefix == sys.base_prefix or not sys.base_prefix.startswith("/usr"))'; then
  say "creating .venv with /usr/bin/python3"
  rm -rf .venv
  /usr/bin/python3 -m venv .venv
fi
stamp=.venv/.chorus-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  say "installing the Python package, its test and benchmark tools and pyspark into .venv"
  .venv/bin/pip install -q --upgrade pip >/dev/null
  .venv/bin/pip install -q -e '.[test,spark,build,bench]'
  echo "$want" > "$stamp"
fi

# A compiled module is built again unless it is newer than every file it is built from: the
# editable install above (setup.py) builds each of them in place, and building them twice cost CI
# its longest setup step.
built() {  # built MODULE_GLOB SOURCE...: the module exists and no source is newer
  local so
  so=$(ls $1 2>/dev/null | head -n 1)
  [ -n "$so" ] || return 1
  shift
  [ -z "$(find "$@" -newer "$so" -print -quit)" ]
}
if built "coordinator/chorus/_cwire.cpython-*.so" coordinator/chorus/_cwire.pyx \
   && built "coordinator/chorus/_ccert.cpython-*.so" coordinator/chorus/_ccert.pyx \
   && built "coordinator/chorus/_csched.cpython-*.so" coordinator/chorus/_csched.pyx \
   && built "coordinator/chorus/_cproto.cpython-*.so" coordinator/chorus/_cproto.pyx; then
  say "the compiled hot path is up to date"
else
  say "building the compiled hot path (coordinator/chorus/_cwire.pyx, _ccert.pyx, _csched.pyx, _cproto.pyx)"
  (cd coordinator && ../.venv/bin/cythonize -3 -i -q chorus/_cwire.pyx chorus/_ccert.pyx chorus/_csched.pyx chorus/_cproto.pyx >/dev/null)
fi
if built "coordinator/chorus/dataplane/_native.cpython-*.so" coordinator/chorus/dataplane/native \
   coordinator/chorus/dataplane/build.py extension/chorus_wsread.c extension/chorus_wsread.h extension/chorus_wire.h; then
  say "the data plane's C core is up to date"
else
  say "building the data plane's C core (coordinator/chorus/dataplane/native/, cffi: chorus.dataplane._native)"
  .venv/bin/python coordinator/chorus/dataplane/build.py >/dev/null 2>&1 \
    || { echo "setup: the data plane's C core did not build (.venv/bin/python coordinator/chorus/dataplane/build.py says why)" >&2; exit 1; }
fi

say "building and installing the chorus extension"
make -s -C extension with_llvm=no PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config >/dev/null
make -s -C extension with_llvm=no PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config install >/dev/null
say "ready"
