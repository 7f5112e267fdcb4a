#!/usr/bin/env bash
# Set up (idempotent) and run every test: unit, integration (root + real BPF), GPU (where one is).
#   sudo scripts/test.sh [pytest args]
# pytest's exit code 5 ("no tests collected") is a failure here.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh || exit 1
.venv/bin/python -m pytest -ra "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
    echo "test: pytest collected no tests: failing" >&2
    exit 1
fi
exit "$rc"
