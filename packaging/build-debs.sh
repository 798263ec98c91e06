#!/usr/bin/env bash
# Build Chorus's two Debian packages from the tree (docs/DEPLOY.md, "Building the packages"):
#   postgresql-15-chorus_V_ARCH.deb   the extension: library, control file, SQL scripts
#   chorus_V_ARCH.deb                 the coordinator and CLI in /opt/chorus/venv, /usr/bin/chorus,
#                                     the systemd unit chorus@.service, Corosync's uidgid file
# V is the release version (packaging/version.sh: a tree whose versions disagree builds nothing).
#
# Usage: packaging/build-debs.sh [OUTDIR]      (default: build/debs)
# Needs what scripts/setup.sh installs on Debian 12 (PostgreSQL 15's server headers, a C compiler,
# python3-venv and python3-dev) and PyPI, or pip's cache, for the coordinator's dependencies.
# Root is not needed: the packages' files are owned by root all the same (--root-owner-group).
#
# The coordinator's wheel is built once per content of its sources (packaging/build-wheel.sh, kept
# in build/cache/wheels); pip's own cache keeps the dependencies. PIP_CONSTRAINT=FILE pins them.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${1:-build/debs}")
WORK=$OUT/.work
PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config
PYTHON=/usr/bin/python3          # Debian's: the package's environment runs on it
VENV=/opt/chorus/venv            # where the coordinator's environment is installed
MAINTAINER="Chorus maintainers <maintainers@users.noreply.a-seed-a3a1e2d1.example>"
say() { printf 'build-debs: %s\n' "$*"; }
die() { printf 'build-debs: %s\n' "$*" >&2; exit 1; }
umask 022
# the environment is checked as it is: nothing of the caller's Python may reach it
unset PYTHONPATH PYTHONHOME PYTHONSTARTUP VIRTUAL_ENV

for tool in dpkg-deb make cc; do
  command -v "$tool" >/dev/null || die "$tool not found (scripts/setup.sh installs what is needed)"
done
[ -x "$PG_CONFIG" ] || die "$PG_CONFIG not found (apt-get install postgresql-server-dev-15)"
"$PYTHON" -c 'import venv, ensurepip' 2>/dev/null || die "$PYTHON cannot make environments (apt-get install python3-venv)"
VERSION=$(packaging/version.sh)
ARCH=$(dpkg --print-architecture)
say "version $VERSION, $ARCH, into $OUT"
rm -rf "$WORK"
mkdir -p "$WORK" "$OUT"

# DEBIAN/control from the package's template, sized by what the package holds
write_control() {  # PACKAGE ROOT
  local size
  mkdir -p "$2/DEBIAN"
  size=$(du -sk --exclude=DEBIAN "$2" | cut -f1)
  sed -e "s/@VERSION@/$VERSION/g" -e "s/@ARCH@/$ARCH/g" -e "s/@INSTALLED_SIZE@/$size/" \
      -e "s/@MAINTAINER@/$MAINTAINER/" "packaging/deb/$1/control.in" > "$2/DEBIAN/control"
}

build_deb() {  # PACKAGE ROOT
  dpkg-deb --root-owner-group -Zgzip --build "$2" "$OUT/${1}_${VERSION}_${ARCH}.deb" >/dev/null
  say "built $OUT/${1}_${VERSION}_${ARCH}.deb"
}

# ---- postgresql-15-chorus: PGXS's own install, into the package's root ----------------------------
build_extension() {
  local root=$WORK/postgresql-15-chorus
  say "building the extension"
  make -s -C extension with_llvm=no PG_CONFIG="$PG_CONFIG" >/dev/null
  make -s -C extension with_llvm=no PG_CONFIG="$PG_CONFIG" install DESTDIR="$root" >/dev/null
  write_control postgresql-15-chorus "$root"
  build_deb postgresql-15-chorus "$root"
}

# ---- chorus: the coordinator's environment, made in the package's root and moved by nothing -----
# A console script that runs the environment's python beside it, wherever the environment is:
# installed (/opt/chorus/venv) or unpacked elsewhere (a test's root). pip writes the same
# sh/python preamble for paths too long for a #! line.
relocatable_script() {  # FILE
  local body
  body=$(tail -n +2 "$1")
  {
    printf '#!/bin/sh\n'
    printf "'''exec' \"\$(dirname -- \"\$(readlink -f -- \"\$0\")\")/python\" \"\$0\" \"\$@\"\n"
    printf "' '''\n"
    printf '%s\n' "$body"
  } > "$1"
}

build_coordinator() {
  local root=$WORK/chorus wheel venv
  venv=$root$VENV
  say "making the coordinator's environment ($VENV)"
  "$PYTHON" -m venv "$venv"
  wheel=$(packaging/build-wheel.sh "$venv/bin/python")
  [ "$(basename "$wheel" | cut -d- -f2)" = "$VERSION" ] || die "$wheel is not version $VERSION"
  say "installing $(basename "$wheel") and its dependencies"
  "$venv/bin/python" -m pip install -q --no-compile --disable-pip-version-check "$wheel"
  CHORUS_IMPL=c "$venv/bin/python" -c 'import chorus.wire, chorus.certifier, chorus.commit.scheduler, chorus.commit.backendproto, chorus.bus.proto, chorus.dataplane.native as n; assert n.IMPL == "c"' \
    || die "the wheel's compiled parts do not load"

  # The environment was made at $venv; it is installed at $VENV: say so wherever the path is kept.
  find "$venv/bin" -maxdepth 1 -type f -exec grep -Iq . {} \; -exec sed -i "s|$root||g" {} \;
  sed -i "s|$root||g" "$venv/pyvenv.cfg"
  for script in "$venv"/bin/*; do
    [ -f "$script" ] && [ ! -L "$script" ] && head -1 "$script" | grep -qx "#!$VENV/bin/python[0-9.]*" \
      && relocatable_script "$script"
  done
  # byte code naming the installed paths (pip's own included: ensurepip compiled it here)
  find "$venv" -name __pycache__ -type d -prune -exec rm -rf {} +
  "$venv/bin/python" -m compileall -q -s "$root" -p / "$venv/lib" >/dev/null
  # pip's record of where the wheel came from names this build's directory; nothing else may
  find "$venv" -name direct_url.json -path '*pgchorus*' -delete
  if grep -rlI --exclude=RECORD "$root" "$venv" >/dev/null; then
    die "files still name the build's directory: $(grep -rlI --exclude=RECORD "$root" "$venv" | head -3)"
  fi

  install -d -m 0755 "$root/usr/bin"
  ln -s "../..$VENV/bin/chorus" "$root/usr/bin/chorus"
  install -D -m 0644 packaging/systemd/chorus@.service "$root/lib/systemd/system/chorus@.service"
  install -D -m 0644 packaging/deb/chorus/corosync-uidgid "$root/etc/corosync/uidgid.d/chorus-postgres"
  write_control chorus "$root"
  echo /etc/corosync/uidgid.d/chorus-postgres > "$root/DEBIAN/conffiles"
  install -m 0755 packaging/deb/chorus/postinst packaging/deb/chorus/prerm packaging/deb/chorus/postrm "$root/DEBIAN/"
  build_deb chorus "$root"
}

build_extension
build_coordinator
rm -rf "$WORK"
