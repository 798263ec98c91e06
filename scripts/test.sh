#!/usr/bin/env bash
# Set everything up, then run the unit and integration tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
set +e
.venv/bin/pytest -p no:cacheprovider -q -ra "$@"
rc=$?
set -e
if [ $rc -eq 5 ]; then echo "test: no tests were collected" >&2; exit 1; fi
exit $rc
