#!/usr/bin/env bash
# Issue 52: the oracle's tensor-core scores and the GQA kernels against their CPU twins, then the
# Llama-3.1-8B emulation at 32k: sparse resident, hisparse and the swap-in-free bound, and dense
# resident (--top-k past every request's length: no selection, attention over every position, and
# no index keys on the device: its whole budget holds KV rows).
# Usage: DEADLINE_S=540 [KV=fp8] [SKIP_TESTS=1] [TESTS="gpu_oracle gpu_gqa ..."] [ORACLE=1] [NO_SWEEPS=1] [NO_DENSE=1] [NO_NCU=1] [BUFFER=slots] [WARMUP=steps] bash run.sh [CONTEXT] [LEVELS] [DENSE_LEVELS]
# ORACLE=1: also time the oracle alone (kernel-bench --only oracle at 1, 8 and 23 requests), then
# its four launches apart under Nsight Compute where the machine has it. BUFFER: hisparse's hot-buffer
# slots (--device-buffer-size; default twice top-k); WARMUP: steps before each level's windows (4).
cd "$(dirname "$0")/../../.."
export HISPARSE_CUDA_INCLUDE=/usr/local/cuda/include RUST_BACKTRACE=1
R=$OUT; B=.gpu/bin
ctx=${1:-32768}; levels=${2:-1,4,8,12,16,24}; dense=${3:-1,4,8,12,16}
deadline=$(( $(date +%s) + ${DEADLINE_S:-540} ))
left() { local l=$(( deadline - $(date +%s) )); [ $l -gt 1 ] && echo $l || echo 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv > $R/gpu.txt 2>&1
free -g > $R/host-memory.txt
if [ -z "$SKIP_TESTS" ]; then
  for t in ${TESTS:-gpu_oracle gpu_gqa}; do
    timeout $(left) $B/test-$t --include-ignored --test-threads=1 > $R/test-$t.log 2>&1; echo "$t rc=$? $(grep -E '^test result' $R/test-$t.log)"
  done
  timeout $(left) $B/test-gpu_engine --include-ignored --test-threads=1 grouped > $R/test-gpu_engine.log 2>&1; echo "gpu_engine grouped rc=$? $(grep -E '^test result' $R/test-gpu_engine.log)"
fi
# The HBM-copy ceiling, measured in the same run.
LD_LIBRARY_PATH=/usr/local/cuda/lib64 timeout $(left) $B/hisparse kernel-bench --only attention --batches 1 --reps 5 --out $R/kb > $R/kernel-bench.log 2>&1
echo "kernel-bench rc=$?"; grep -i -E "copy|cublas" $R/kernel-bench.log | head -4
if [ -n "$ORACLE" ]; then
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 timeout $(left) $B/hisparse kernel-bench --only oracle --contexts $ctx --batches 1,8,23 --reps 10 --out $R/kb-oracle > $R/oracle.log 2>&1
  echo "oracle rc=$?"; grep -E "oracle" $R/oracle.log | head -8
  # Nsight Compute (its counters read on Firecracker machines; clocks left alone): each of the
  # oracle's four launches at 23 requests, its duration, throughput, occupancy and stalls.
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  if [ -n "$NCU" ] && [ -z "$NO_NCU" ]; then
    LD_LIBRARY_PATH=/usr/local/cuda/lib64 timeout $(left) $NCU --clock-control none --kernel-name regex:oracle_ --launch-count 4 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats \
      $B/hisparse kernel-bench --only oracle --contexts $ctx --batches 23 --reps 1 --out $R/kb-ncu > $R/oracle-ncu.log 2>&1
    echo "ncu rc=$? ($NCU)"; grep -E "oracle_|Duration|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Stall" $R/oracle-ncu.log | head -60
  fi
fi
if [ -z "$NO_SWEEPS" ]; then
  common="--backend cuda --preset llama-3.1-8b --kv-format ${KV:-bf16} --context $ctx --warmup ${WARMUP:-4} --window 6 --windows 3"
  s=$(date +%s)
  timeout $(left) $B/hisparse sweep $common ${BUFFER:+--device-buffer-size $BUFFER} --concurrency $levels --bound --out $R/sweep > $R/sweep.log 2>&1
  echo "sweep rc=$? $(( $(date +%s) - s ))s"; tail -40 $R/sweep.log
  s=$(date +%s)
  # Dense resident is a top-k past every request's length; a top-k is at most 65534 (a hot
  # buffer's slots), so it cannot be run past a 61k context.
  [ $(( ctx + 4096 )) -gt 65534 ] && { NO_DENSE=1; echo "dense resident: not expressible at context $ctx (top-k at most 65534)"; }
  [ -z "$NO_DENSE" ] && timeout $(left) $B/hisparse sweep $common --concurrency $dense --mode resident --top-k $(( ctx + 4096 )) --out $R/dense > $R/dense.log 2>&1
  echo "dense rc=$? $(( $(date +%s) - s ))s"; tail -16 $R/dense.log
fi
# At most 8 files come back from the device: the sweeps' outputs travel as one archive.
(cd $R && tar czf outputs.tgz $(ls -d sweep dense kb kb-oracle kb-ncu 2>/dev/null) && rm -rf sweep dense kb kb-oracle kb-ncu)
