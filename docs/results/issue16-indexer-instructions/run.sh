#!/usr/bin/env bash
# Issue 16: the wgmma indexer with fewer instructions a chunk (descriptors hoisted, no division
# per chunk, copies at fixed offsets) against the shipped one, three times alternating; its test.
cd "$(dirname "$0")/../.."
export HISPARSE_CUDA_INCLUDE=/usr/local/cuda/include RUST_BACKTRACE=1
R=$OUT/r; mkdir -p $R; B=.gpu/bin
t() { local name=$1 lim=$2; shift 2; echo "=== $name $(date +%T)"; timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(date +%T)"; }
KB="kernel-bench --only indexer --batches 1,8,64 --contexts 32768,131072"
for i in 1 2 3; do
  for v in base new; do
    t kb-$v-$i 60 $B/hisparse-$v $KB --out $R/kbo-$v-$i; grep -E "HBM|warpgroup MMA\) (32|64) heads, ctx 131072, batch (1|64) |pages in order" $R/kb-$v-$i.log | sed 's/  */ /g'
  done
done
t indexer 90 $B/test-gpu_indexer --include-ignored --test-threads=1; grep -E "^test |test result" $R/indexer.log
cd $OUT && tar czf r.tgz r && rm -rf r
