#!/usr/bin/env bash
# Quick start, command 1: installs what is missing, builds, and runs the main
# job -- a short benchmark on a default shape and the accuracy self-test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
build/bin/tileattn info
build/bin/tileattn bench --batch 1 --heads 8 --seq 2048 --dim 128 --reps 3
build/bin/tileattn bench --batch 1 --heads 8 --seq 2048 --dim 128 --causal --reps 3
build/bin/tileattn check
