#!/usr/bin/env bash
# Issue 16: the wgmma attention with its descriptors built once (base: shipped), kernel-bench
# twice alternating; the GPU tests the indexer and attention changes touch; the real steps.
cd "$(dirname "$0")/../.."
export HISPARSE_CUDA_INCLUDE=/usr/local/cuda/include RUST_BACKTRACE=1
R=$OUT/r; mkdir -p $R; B=.gpu/bin
t() { local name=$1 lim=$2; shift 2; echo "=== $name $(date +%T)"; timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(date +%T)"; }
for i in 1 2; do for v in base new; do
  t kba-$v-$i 60 $B/hisparse-$v kernel-bench --only attention --batches 1,8,64 --out $R/kboa-$v-$i; grep -E "HBM|GEMM|wgmma.*(batch 1|batch 64), graph" $R/kba-$v-$i.log | sed 's/  */ /g'
done; done
for x in kernels indexer hits_first engine; do
  t test-$x 200 $B/test-gpu_$x --include-ignored --test-threads=1; grep -E "^test |test result" $R/test-$x.log
done
SW="sweep --backend cuda --warmup 8 --window 12 --mode hisparse"
for v in new base; do
  t dsv-$v 110 $B/hisparse-$v $SW --preset deepseek-v3.2 --context 131072 --concurrency 8 --out $R/dsv-$v; grep -iE "step|tok/s" $R/dsv-$v.log | tail -3
done
t glm-new 120 $B/hisparse-new $SW --preset glm-5.1 --context 32768 --concurrency 32 --out $R/glm-new; grep -iE "step|tok/s" $R/glm-new.log | tail -3
cd $OUT && tar czf r.tgz r && rm -rf r
