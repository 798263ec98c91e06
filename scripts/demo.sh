#!/usr/bin/env bash
# Set everything up, then start a 3-node local cluster and run the demo workload on it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/chorus demo --dir "${CHORUS_DEMO_DIR:-/tmp/chorus-demo}" "$@"
