#!/bin/bash
# Runs the AVX-512 path on real AVX-512 hardware: the device machine some
# sessions are lent (16 x86-64 cores next to a GPU; see /work/.library/device),
# whose CPU has AVX-512 where this development box has none.
#
# Prepare here (the device machine has no compiler for this tree and its libc
# may differ, so the binaries are static):
#   cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DTILEATTN_BUILD_MPI=OFF \
#         -DTILEATTN_BUILD_EXAMPLES=OFF -DCMAKE_EXE_LINKER_FLAGS=-static
#   cmake --build build-dev -j2 && strip build-dev/bin/*_tests build-dev/bin/tileattn
# then run through the device tool, carrying build-dev/bin (~30 MB):
#   run(command="bash scripts/avx512_device_check.sh", carry=["build-dev/bin"], timeout_s=400)
# It writes cpu.txt, info.txt, all.log (per test binary: passed / failed /
# skipped counts and failing names), tests.log and bench.txt under $OUT.
# The forced-AVX-512 test cases (GTEST_SKIP here) run there for real. cli_tests
# is left out: it calls the CLI by this machine's build path.
# Locally (`OUT=/tmp/x NTHR=2 bash scripts/avx512_device_check.sh`) it checks itself.
B=build-dev/bin
L=$OUT/all.log
{ lscpu | grep -E "Model name|^CPU\(s\)|Thread|Socket|L1d|L2|L3|Flags" | cut -c1-400
  echo "avx512 flags: $(grep -o 'avx512[a-z_0-9]*\|amx[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ')"
} > $OUT/cpu.txt 2>&1
cat $OUT/cpu.txt
$B/tileattn info > $OUT/info.txt 2>&1; head -10 $OUT/info.txt
for t in isa core inference training reliability capi io; do
  timeout 150 $B/${t}_tests --gtest_brief=1 > $OUT/$t.log 2>&1; rc=$?
  echo "== $t rc=$rc: $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \]' $OUT/$t.log | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' $OUT/$t.log | head -20
done 2>&1 | tee $L
cat $OUT/isa.log $OUT/core.log $OUT/inference.log $OUT/training.log $OUT/reliability.log $OUT/capi.log $OUT/io.log > $OUT/tests.log 2>/dev/null
rm -f $OUT/isa.log $OUT/core.log $OUT/inference.log $OUT/training.log $OUT/reliability.log $OUT/capi.log $OUT/io.log
for isa in avx512 avx2; do for thr in 2 ${NTHR:-16}; do for dt in fp32 bf16; do
  TILEATTN_ISA=$isa timeout 60 $B/tileattn bench --json --heads 8 --seq 4096 --dim 128 --dtype $dt --no-baseline --threads $thr --reps 3 > $OUT/b.json 2>&1 || { echo "$isa thr=$thr $dt: exit $?: $(head -c 200 $OUT/b.json)" | tee -a $OUT/bench.txt; continue; }
  python3 -c "import json;d=json.load(open('$OUT/b.json'));print('$isa thr=$thr $dt', round(d['gflops'],1), 'GF/s', round(d['fraction_of_peak'],3), 'of peak', round(d['peak_gflops'],1), d['block_q'], d['block_kv'])" 2>&1 | tee -a $OUT/bench.txt
done; done; done
for isa in avx512 avx2; do
  TILEATTN_ISA=$isa timeout 60 $B/tileattn decode --json --prompt 8192 --steps 16 --threads 2 --recompute-steps 1 > $OUT/b.json 2>&1 || { echo "decode $isa: exit $?: $(head -c 200 $OUT/b.json)" | tee -a $OUT/bench.txt; continue; }
  python3 -c "import json;d=json.load(open('$OUT/b.json'));print('decode $isa', {k: d[k] for k in ('ms_per_token','kv_gb_per_s','read_gb_per_s','fraction_of_bandwidth','thread_speedup') if k in d})" 2>&1 | tee -a $OUT/bench.txt
done
rm -f $OUT/b.json
