#!/usr/bin/env bash
# Issue 41: the tip's GPU tests on the H200. The attention kernel-bench first (GPU otherwise
# idle), then every packed test executable with --include-ignored, in three parallel lanes
# (the tests check values, not times): the swap-in's lane, the engine's, and the rest.
cd "$(dirname "$0")/../../.."
export HISPARSE_CUDA_INCLUDE=/usr/local/cuda/include RUST_BACKTRACE=1
R=$OUT/r; mkdir -p $R; B=.gpu/bin
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv > $R/gpu.txt 2>&1
timeout 60 $B/hisparse kernel-bench --only attention --batches 1,64 --out $R/kbench-attention > $R/kbench-attention.log 2>&1
echo "kernel-bench rc=$?"
one() { local t=$1; local n=$(basename $t); local s=$(date +%s)
  timeout 420 $t --include-ignored --test-threads=1 > $R/$n.log 2>&1; local rc=$?
  echo "$n rc=$rc $(( $(date +%s) - s ))s $(grep -E '^test result' $R/$n.log | tail -1)"; }
lane() { for t in "$@"; do one $t; done; }
swap=$(ls $B/test-gpu_swap_in-*)
eng="$(ls $B/test-gpu_engine-* $B/test-gpu_hits_first-* $B/test-gpu_long_replay-* 2>/dev/null)"
rest=$(ls $B/test-* | grep -v -e gpu_swap_in -e gpu_engine -e gpu_hits_first -e gpu_long_replay)
lane $swap > $R/lane-swap.txt & lane $eng > $R/lane-engine.txt & lane $rest > $R/lane-rest.txt & wait
cat $R/lane-*.txt
echo "executables: $(cat $R/lane-*.txt | wc -l), failed: $(cat $R/lane-*.txt | grep -vc 'rc=0 ')"
