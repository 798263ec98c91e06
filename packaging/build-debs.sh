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
# The coordinator's wheel is built once per content of its sources and kept in build/cache/wheels;
# pip's own cache keeps the dependencies. PIP_CONSTRAINT=FILE pins them, as pip reads it.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
OUT=$(realpath -m "${1:-build/debs}")
WORK=$OUT/.work
WHEELS=$REPO/build/cache/wheels
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
mkdir -p "$WORK" "$OUT" "$WHEELS"

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
# The wheel is built from the tree's files as git lists them (no build directory, in-place module
# or cache of a run gets in); without git (a container build's copy), from the directories it needs.
copy_sources() {  # DEST
  mkdir -p "$1"
  if git -C "$REPO" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git -C "$REPO" ls-files -co --exclude-standard -z -- pyproject.toml setup.py coordinator spark/chorus_spark \
      | while IFS= read -r -d '' f; do [ -f "$REPO/$f" ] && printf '%s\0' "$f"; done \
      | tar -C "$REPO" --null -T - -cf - | tar -C "$1" -xf -
  else
    tar -C "$REPO" --exclude=__pycache__ --exclude='*.so' --exclude='*.egg-info' --exclude='coordinator/chorus/_c*.c' -cf - \
        pyproject.toml setup.py coordinator spark/chorus_spark | tar -C "$1" -xf -
  fi
}

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
  local root=$WORK/chorus src=$WORK/src key wheel venv
  venv=$root$VENV
  copy_sources "$src"
  key=$(cd "$src" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
  wheel=$(ls "$WHEELS/$key"/pgchorus-"$VERSION"-*.whl 2>/dev/null | head -1 || true)

  say "making the coordinator's environment ($VENV)"
  "$PYTHON" -m venv "$venv"
  if [ -z "$wheel" ]; then
    say "building the wheel (the compiled hot path: Cython)"
    "$venv/bin/python" -m pip wheel -q --no-deps -w "$WORK/wheel" "$src"
    mkdir -p "$WHEELS/$key.tmp"
    mv "$WORK"/wheel/pgchorus-"$VERSION"-*.whl "$WHEELS/$key.tmp/"
    rm -rf "$WHEELS/$key"; mv "$WHEELS/$key.tmp" "$WHEELS/$key"
    wheel=$(ls "$WHEELS/$key"/pgchorus-"$VERSION"-*.whl)
  fi
  say "installing $(basename "$wheel") and its dependencies"
  "$venv/bin/python" -m pip install -q --no-compile --disable-pip-version-check "$wheel"
  CHORUS_IMPL=c "$venv/bin/python" -c 'import chorus.wire, chorus.certifier, chorus.commit.scheduler, chorus.commit.backendproto, chorus.bus.proto' \
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
