#!/usr/bin/env bash
# Set up (idempotent) and run every test: unit, integration (root + real BPF), GPU (where one is).
#   scripts/test.sh [pytest args]      (re-runs itself with sudo when not root: BPF needs root)
# pytest's exit code 5 ("no tests collected") is a failure here.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null; then exec sudo "$0" "$@"; fi
scripts/setup.sh || exit 1
.venv/bin/python -m pytest -ra "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
    echo "test: pytest collected no tests: failing" >&2
    exit 1
fi
exit "$rc"
