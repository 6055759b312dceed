#!/usr/bin/env bash
# Quick start, command 2: builds and runs every test (C++ via CTest, Python via
# pytest, the sanitizer builds). Installs what is missing first, so it works on
# a fresh machine. CI (.ci/run) runs this.
#
# After the Debian packages (scripts/setup.sh system), four lanes run at the same
# time, so that both cores of a 2-core machine stay busy (docs/reliability.md, "CI"):
#   pysetup   scripts/setup.sh python: the Python packages into .venv
#   main      scripts/build.sh, then (once pysetup is done) CTest, then
#             scripts/test_python.sh linking the library build/ has just compiled
#             (TILEATTN_PYTHON_LINK_LIBRARY)
#   asan      scripts/sanitize.sh ci-asan: ASan+UBSan build, its tests, the fuzzers
#   tsan      scripts/sanitize.sh ci-tsan: TSan build and the threaded tests
# Each lane's output goes to build-logs/<lane>.log, printed whole when the lane
# ends; meanwhile one line per step shows progress. A failing lane stops the
# others and fails the run, naming the lane and the step.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
scripts/setup.sh system
setup_seconds=$((SECONDS - start))
echo "test: setup (Debian packages) took $setup_seconds s" >&2
# Every test must run here (setup.sh installed MPI, torch, ...): a test that
# would skip for a missing dependency fails instead (tests/mpi/tests.cmake,
# tests/python/conftest.py, the AMX check of tests/core/peak_test.cpp).
export TILEATTN_REQUIRE_ALL=1
# The test executables compile in unity batches (tests/CMakeLists.txt), in all
# three builds.
export TILEATTN_UNITY_TESTS=ON
jobs=$(nproc 2>/dev/null || echo 2)
logs=build-logs
rm -rf "$logs"
mkdir -p "$logs"

# children_cpu: sets cpu to the CPU seconds (user + system) of this shell's
# finished child processes so far (`times`, run here: a subshell would see none).
children_cpu() {
  local f=$logs/.times.$BASHPID
  times >"$f"
  cpu=$(awk 'NR == 2 { split($1, u, "m"); split($2, s, "m"); printf "%d", u[1] * 60 + u[2] + s[1] * 60 + s[2] + 0.5 }' "$f")
}

# step LANE NAME COMMAND...: runs one step of a lane, with a progress line on
# the terminal (fd 3) at its start and end, and its wall and CPU seconds in
# $logs/times.
step() {
  local lane=$1 name=$2 t0=$SECONDS status=0 cpu cpu0
  shift 2
  children_cpu
  cpu0=$cpu
  echo "test: $lane: $name started at +$((SECONDS - start)) s" >&3
  "$@" || status=$?
  children_cpu
  echo "$lane $name $((SECONDS - t0)) $((cpu - cpu0)) $status" >>"$logs/times"
  if [ "$status" -ne 0 ]; then
    echo "test: $lane: $name FAILED (exit $status) after $((SECONDS - t0)) s" >&3
    return "$status"
  fi
  echo "test: $lane: $name done in $((SECONDS - t0)) s (CPU $((cpu - cpu0)) s)" >&3
}

# wait_for_pysetup: the main lane's CTest and pytest need the Python packages
# (NumPy for the .npy tests, torch, ...); pysetup leaves this file when done.
wait_for_pysetup() {
  while [ ! -f "$logs/pysetup.done" ]; do sleep 2; done
}

pysetup_lane() {
  step pysetup setup.sh scripts/setup.sh python
  touch "$logs/pysetup.done"
}

main_lane() {
  step main build scripts/build.sh
  step main wait-for-pysetup wait_for_pysetup
  step main ctest ctest --test-dir build --output-on-failure -j "$jobs"
  if [ -x scripts/test_python.sh ]; then
    step main python env TILEATTN_PYTHON_LINK_LIBRARY="$PWD/build/lib/libtileattn.a" scripts/test_python.sh
  fi
}

asan_lane() {
  # ASan+UBSan tests and 20 s per fuzzer (docs/reliability.md)
  step asan sanitize.sh-ci-asan scripts/sanitize.sh ci-asan
}

tsan_lane() {
  step tsan sanitize.sh-ci-tsan scripts/sanitize.sh ci-tsan
}

# Job control: each lane in its own process group, so that a failing lane's
# siblings (their builds and tests) can be stopped whole.
set -m
exec 3>&2
lanes=(pysetup main asan tsan)
declare -A pid_of lane_of status_of
for lane in "${lanes[@]}"; do
  "${lane}_lane" </dev/null >"$logs/$lane.log" 2>&1 &
  pid_of[$lane]=$!
  lane_of[$!]=$lane
done
stop_lanes() {
  for lane in "${lanes[@]}"; do
    [ -n "${status_of[$lane]:-}" ] || kill -TERM -- "-${pid_of[$lane]}" 2>/dev/null || true
  done
}
trap 'stop_lanes' EXIT
trap 'stop_lanes; exit 130' INT TERM

failed=""
for _ in "${lanes[@]}"; do
  done_pid=""
  status=0
  wait -n -p done_pid || status=$?
  lane=${lane_of[$done_pid]}
  status_of[$lane]=$status
  echo "test: lane $lane ended with exit $status at +$((SECONDS - start)) s; its log ($logs/$lane.log):" >&2
  sed "s/^/[$lane] /" "$logs/$lane.log" >&2
  if [ "$status" -ne 0 ]; then
    failed=$lane
    break
  fi
done
if [ -n "$failed" ]; then
  stop_lanes
  wait || true
  echo "test: FAILED: lane $failed (exit ${status_of[$failed]}):" \
    "$(awk -v l="$failed" '$1 == l && $5 != 0 {print $2}' "$logs/times" 2>/dev/null) failed;" \
    "its log is printed above ($logs/$failed.log); the other lanes were stopped" >&2
  exit 1
fi
trap - EXIT
echo "test: all passed in $((SECONDS - start)) s (wall / CPU seconds: setup $setup_seconds," \
  "$(awk '{printf "%s%s %s %s / %s", sep, $1, $2, $3, $4; sep=", "}' "$logs/times"))" >&2
