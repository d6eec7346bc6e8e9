#!/usr/bin/env bash
# Issue 16: the pipelined wgmma indexer (one barrier a chunk, the epilogue of chunk c-1 under
# chunk c's wgmmas) against the shipped one, twice alternating; its test; batch-1 attention's
# kernel times under Nsight Compute (attention vs merge).
cd "$(dirname "$0")/../.."
export HISPARSE_CUDA_INCLUDE=/usr/local/cuda/include RUST_BACKTRACE=1
R=$OUT/r; mkdir -p $R; B=.gpu/bin
t() { local name=$1 lim=$2; shift 2; echo "=== $name $(date +%T)"; timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(date +%T)"; }
KB="kernel-bench --only indexer --batches 1,64 --contexts 131072"
for i in 1 2; do
  for v in base pipe pipe3; do
    t kb-$v-$i 60 $B/hisparse-$v $KB --out $R/kbo-$v-$i; grep -E "HBM|warpgroup MMA\) (32|64) heads, ctx 131072, batch (1|64) " $R/kb-$v-$i.log
  done
done
t indexer 90 $B/test-gpu_indexer --include-ignored --test-threads=1; grep -E "^test |test result" $R/indexer.log
t kb-attn 90 $B/hisparse-pipe kernel-bench --only attention --batches 1 --attention-splits 8,16 --out $R/kbo-attn; grep -E "HBM|GEMM|batch 1" $R/kb-attn.log
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
t ncu-attn 150 $NCU --cache-control none --clock-control none --metrics gpu__time_duration.sum -k regex:"wgmma|merge_splits" --launch-count 60 $B/hisparse-pipe kernel-bench --only attention --batches 1 --reps 3 --out $R/kbo-ncu
grep -E "sparse_mla|merge_splits|gpu__time|Block Size|Grid Size" $R/ncu-attn.log | head -100
cd $OUT && tar czf r.tgz r && rm -rf r
