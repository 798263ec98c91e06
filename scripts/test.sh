#!/usr/bin/env bash
# Set everything up, then run the unit and integration tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
set +e
rc_python=0
if [ $# -eq 0 ]; then
  # the unit tests once more on the pure-Python implementations (the whole run uses the compiled ones)
  echo "test: unit tests with CHORUS_IMPL=python"
  CHORUS_IMPL=python .venv/bin/pytest -p no:cacheprovider -q tests/unit
  rc_python=$?
fi
.venv/bin/pytest -p no:cacheprovider -q -ra --durations=25 "$@"
rc=$?
[ $rc -eq 0 ] && rc=$rc_python
set -e
if [ $rc -eq 5 ]; then echo "test: no tests were collected" >&2; exit 1; fi
exit $rc
