#!/usr/bin/env bash
# Build the coordinator's wheel (pgchorus, with its compiled hot path: setup.py) from the tree and
# print its path. It is built from the files git lists (no build directory, in-place module or cache
# of a run gets in); without git (a container build's copy of the tree), from the directories it
# needs, less what a build leaves in them.
#
# One wheel per content of those files and interpreter, kept in build/cache/wheels: asked again for
# the same sources, it builds nothing (packaging/build-debs.sh and tests/integration/test_package.py
# both use it).
#
# Usage: packaging/build-wheel.sh [PYTHON]   (the interpreter it is built with and for; default
# /usr/bin/python3, which needs pip). Progress goes to stderr, the wheel's path to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
PYTHON=${1:-/usr/bin/python3}
WHEELS=$REPO/build/cache/wheels
# extension/: the writeset reader the data plane's C core compiles in (dataplane/build.py)
SOURCES=(pyproject.toml setup.py coordinator spark/chorus_spark extension/chorus_wsread.c extension/chorus_wsread.h
         extension/chorus_wire.h)
unset PYTHONPATH PYTHONHOME PYTHONSTARTUP
umask 022

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src" "$WHEELS"
if git -C "$REPO" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git -C "$REPO" ls-files -co --exclude-standard -z -- "${SOURCES[@]}" \
    | while IFS= read -r -d '' f; do [ -f "$REPO/$f" ] && printf '%s\0' "$f"; done \
    | tar -C "$REPO" --null -T - -cf - | tar -C "$work/src" -xf -
else
  tar -C "$REPO" --exclude=__pycache__ --exclude='*.so' --exclude='*.egg-info' \
      --exclude='coordinator/chorus/_c*.c' -cf - "${SOURCES[@]}" | tar -C "$work/src" -xf -
fi

tag=$("$PYTHON" -c 'import sys; print(sys.implementation.cache_tag)')
key=$tag-$(cd "$work/src" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
if ! ls "$WHEELS/$key"/pgchorus-*.whl >/dev/null 2>&1; then
  echo "build-wheel: building the wheel with $PYTHON (Cython compiles the hot path)" >&2
  "$PYTHON" -m pip wheel -q --no-deps --disable-pip-version-check -w "$work/wheel" "$work/src" >&2
  mv "$work/wheel" "$WHEELS/$key.$$"
  rm -rf "$WHEELS/$key"
  mv "$WHEELS/$key.$$" "$WHEELS/$key"
fi
ls "$WHEELS/$key"/pgchorus-*.whl
