#!/usr/bin/env bash
# Regenerates the benchmark report (docs/benchmarks.md table, docs/img/bench_*.png,
# bench/results/) from measured runs on this machine: installs what is missing,
# builds build/bin/tileattn, then runs bench/run_report.py (under 15 minutes on an
# idle 2-core machine; other load on the machine slows it and every number).
# Extra arguments go to run_report.py (e.g. --quick for a tooling check).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
exec .venv/bin/python bench/run_report.py "$@"
