#!/usr/bin/env bash
# Issue 41: the GPU tests of the packed build on the H200, in three lanes in parallel under one
# deadline (each executable gets what is left of it): the swap-in's tests alone (its
# production-size case is long), the graph-replay and hits-first tests, then the engine's and
# every other GPU test. Usage: bash run-tests.sh [SECONDS] (default 560).
cd "$(dirname "$0")/../../.."
export HISPARSE_CUDA_INCLUDE=/usr/local/cuda/include RUST_BACKTRACE=1
R=$OUT/r; mkdir -p $R; B=.gpu/bin
deadline=$(( $(date +%s) + ${1:-560} ))
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv > $R/gpu.txt 2>&1
one() { local t=$1; local n=$(basename $t); local s=$(date +%s); local left=$(( deadline - s ))
  [ $left -gt 5 ] || { echo "$n not run (deadline)"; return; }
  timeout $left $t --include-ignored --test-threads=1 > $R/$n.log 2>&1; local rc=$?
  echo "$n rc=$rc $(( $(date +%s) - s ))s $(grep -E '^test result' $R/$n.log | tail -1)"; }
lane() { for t in "$@"; do one $t; done; }
swap=$(ls $B/test-gpu_swap_in*)
replay="$(ls $B/test-gpu_long_replay* $B/test-gpu_hits_first*)"
# The tests built with candle's CUDA kernels travel compressed (.gpu/candle-gpu_*.xz, from
# docs/results/issue40-gpu/pack-candle.sh); they load CUDA's runtime, cuBLAS and cuRAND from the
# toolkit. One named as a test of the pack runs instead of the pack's.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
ls /usr/local/cuda/lib64 > $R/cuda-lib64.txt 2>&1
mkdir -p /tmp/candle
for x in .gpu/candle-gpu_*.xz; do
  [ -f "$x" ] || continue
  t=$(basename "$x" .xz); t=test-${t#candle-}
  python3 -c 'import lzma,sys; open(sys.argv[2],"wb").write(lzma.open(sys.argv[1]).read())' "$x" "/tmp/candle/$t" \
    && chmod +x "/tmp/candle/$t"
done
candle=$(ls /tmp/candle/test-* 2>/dev/null)
skip=$(for c in $candle; do printf -- '-e %s ' "$(basename $c)"; done)
rest="$(ls $B/test-gpu_engine*) $candle $(ls $B/test-* | grep -v -e gpu_swap_in -e gpu_engine -e gpu_hits_first -e gpu_long_replay $skip)"
lane $swap > $R/lane-swap.txt & lane $replay > $R/lane-replay.txt & lane $rest > $R/lane-rest.txt & wait
cat $R/lane-*.txt
echo "executables: $(cat $R/lane-*.txt | wc -l), passed: $(cat $R/lane-*.txt | grep -c 'rc=0 ')"
grep -h "^test .* \.\.\. " $R/test-*.log | sort | uniq -c | awk '{print $NF}' | sort | uniq -c
# At most 8 files come back from the device: the logs travel as one archive beside the summaries.
(cd $OUT && tar czf logs.tgz r/*.log && rm -f r/test-*.log)
