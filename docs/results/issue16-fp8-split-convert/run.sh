#!/usr/bin/env bash
# Issue 16: fp8 attention with S over the first four atoms started while warpgroup 1 converts
# the other five (base: fba1557), kernel-bench twice alternating; the GPU tests it touches.
cd "$(dirname "$0")/../.."
export HISPARSE_CUDA_INCLUDE=/usr/local/cuda/include RUST_BACKTRACE=1
R=$OUT/r; mkdir -p $R; B=.gpu/bin
t() { local name=$1 lim=$2; shift 2; echo "=== $name $(date +%T)"; timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(date +%T)"; }
for i in 1 2; do for v in base new; do
  t kba-$v-$i 40 $B/hisparse-$v kernel-bench --only attention --batches 1,64 --out $R/kboa-$v-$i; grep -E "wgmma.*(batch 1|batch 64), graph" $R/kba-$v-$i.log | sed 's/  */ /g; s/per call, 8 calls a graph; //'
done; done
for x in kernels engine hits_first; do
  t test-$x 200 $B/test-gpu_$x --include-ignored --test-threads=1; grep -E "^test |test result" $R/test-$x.log
done
cd $OUT && tar czf r.tgz r && rm -rf r
