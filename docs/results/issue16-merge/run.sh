#!/usr/bin/env bash
# Issue 16: batch-1 attention's kernel times (Nsight Compute, wgmma kernels and merges); the
# 64-head indexer's pipes; the adaptive merge against the shipped one in kernel-bench.
cd "$(dirname "$0")/../.."
export HISPARSE_CUDA_INCLUDE=/usr/local/cuda/include RUST_BACKTRACE=1
R=$OUT/r; mkdir -p $R; B=.gpu/bin
t() { local name=$1 lim=$2; shift 2; echo "=== $name $(date +%T)"; timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(date +%T)"; }
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
for v in base new; do
  t ncu-attn-$v 150 $NCU --cache-control none --clock-control none --metrics gpu__time_duration.sum -k regex:"wgmma|merge_splits" --launch-count 300 $B/hisparse-$v kernel-bench --only attention --batches 1 --reps 2 --out $R/kbo-ncu-$v
done
t ncu-idx 150 $NCU --clock-control none -k regex:"indexer_scores_wg_h64" --launch-skip 4 --launch-count 1 --section ComputeWorkloadAnalysis --section SchedulerStats --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_gmma.sum,smsp__inst_executed.sum $B/hisparse-base kernel-bench --only indexer --batches 64 --contexts 131072 --reps 3 --out $R/kbo-ncu-idx
grep -vE "^==PROF==" $R/ncu-idx.log | tail -120
for v in base new; do
  t kba-$v 120 $B/hisparse-$v kernel-bench --only attention --batches 1,8,64 --out $R/kboa-$v; grep -E "wgmma" $R/kba-$v.log | sed 's/  */ /g'
done
cd $OUT && tar czf r.tgz r && rm -rf r
