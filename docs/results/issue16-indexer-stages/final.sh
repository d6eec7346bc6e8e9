#!/usr/bin/env bash
# Issue 16: four staging tiles in the wgmma indexer (hisparse-4st) against three, same run;
# issue 15: the copy-engine build's full gpu_engine and gpu_swap_in tests.
cd "$(dirname "$0")/../.."
export HISPARSE_CUDA_INCLUDE=/usr/local/cuda/include RUST_BACKTRACE=1
R=$OUT/r; mkdir -p $R; B=.gpu/bin
t() { local name=$1 lim=$2; shift 2; echo "=== $name $(date +%T)"; timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(date +%T)"; }
KB="kernel-bench --only indexer --batches 1,64 --contexts 32768,131072"
for i in 1 2; do
  t kb3-$i 60 $B/hisparse $KB; grep -E "HBM|warpgroup MMA\) (32|64) heads, ctx 131072, batch 64" $R/kb3-$i.log
  t kb4-$i 60 $B/hisparse-4st $KB; grep -E "HBM|warpgroup MMA\) (32|64) heads, ctx 131072, batch 64" $R/kb4-$i.log
done
t indexer-4st 90 $B/test-gpu_indexer-4st --include-ignored --test-threads=1; grep "test result" $R/indexer-4st.log
t engine 220 $B/test-gpu_engine --include-ignored --test-threads=1; grep -E "^test |test result" $R/engine.log
t swap-in 300 $B/test-gpu_swap_in --include-ignored --test-threads=1; grep -E "^test |test result" $R/swap-in.log
cd $OUT && tar czf r.tgz r && rm -rf r
