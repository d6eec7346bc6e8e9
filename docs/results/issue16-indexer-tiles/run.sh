#!/usr/bin/env bash
# Issue 16: staging tiles per block of the 64-head wgmma indexer (s5 / s7 / s11 against the
# shipped four), and the merge of attention splits read in four ways (new) against one.
cd "$(dirname "$0")/../.."
export HISPARSE_CUDA_INCLUDE=/usr/local/cuda/include RUST_BACKTRACE=1
R=$OUT/r; mkdir -p $R; B=.gpu/bin
t() { local name=$1 lim=$2; shift 2; echo "=== $name $(date +%T)"; timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(date +%T)"; }
KB="kernel-bench --only indexer --batches 1,64 --contexts 131072"
for i in 1 2; do
  for v in base s5 s7 s11; do
    t kb-$v-$i 60 $B/hisparse-$v $KB --out $R/kbo-$v-$i; grep -E "warpgroup MMA\) (32|64) heads, ctx 131072, batch (1|64) " $R/kb-$v-$i.log | sed 's/  */ /g'
  done
done
t kernels 90 $B/test-gpu_kernels --include-ignored --test-threads=1; grep -E "^test |test result" $R/kernels.log
t indexer 90 $B/test-gpu_indexer --include-ignored --test-threads=1; grep -E "^test |test result" $R/indexer.log
for v in base new; do
  t kba-$v 120 $B/hisparse-$v kernel-bench --only attention --batches 1,8,64 --out $R/kboa-$v; grep -E "HBM|GEMM|attention" $R/kba-$v.log | sed 's/  */ /g'
done
cd $OUT && tar czf r.tgz r && rm -rf r
