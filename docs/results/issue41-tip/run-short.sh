#!/usr/bin/env bash
# Issue 40/41, a short call: the GPU tests of what was never run on a GPU — the engine's (the
# bound placed as auto, the prefetch kernel aging its policy) and hits-first, the candle CUDA
# test, and the rest but the long ones (gpu_swap_in, gpu_long_replay) — under one deadline.
# Usage: bash run-short.sh [SECONDS] (default 200).
cd "$(dirname "$0")/../../.."
export HISPARSE_CUDA_INCLUDE=/usr/local/cuda/include RUST_BACKTRACE=1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
R=$OUT/r; mkdir -p $R; B=.gpu/bin
deadline=$(( $(date +%s) + ${1:-200} ))
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv > $R/gpu.txt 2>&1
[ -f .gpu/candle-gpu_candle.xz ] && python3 -c 'import lzma,sys; open(sys.argv[2],"wb").write(lzma.open(sys.argv[1]).read())' \
  .gpu/candle-gpu_candle.xz /tmp/test-gpu_candle && chmod +x /tmp/test-gpu_candle
one() { local t=$1; local n=$(basename $t); local s=$(date +%s); local left=$(( deadline - s ))
  [ $left -gt 5 ] || { echo "$n not run (deadline)"; return; }
  timeout $left $t --include-ignored --test-threads=1 > $R/$n.log 2>&1; local rc=$?
  echo "$n rc=$rc $(( $(date +%s) - s ))s $(grep -E '^test result' $R/$n.log | tail -1)"; }
lane() { for t in "$@"; do one $t; done; }
rest="$(ls $B/test-gpu_hits_first-*) /tmp/test-gpu_candle $(ls $B/test-* | grep -v -e gpu_swap_in -e gpu_engine -e gpu_hits_first -e gpu_long_replay)"
lane $(ls $B/test-gpu_engine-*) > $R/lane-engine.txt & lane $rest > $R/lane-rest.txt & wait
cat $R/lane-*.txt
(cd $OUT && tar czf logs.tgz r/*.log && rm -f r/test-*.log)
