#!/usr/bin/env bash
# Issue 15: the copy-engine staging path — its tests, then it against deferred-gather.
cd "$(dirname "$0")/../.."
export HISPARSE_CUDA_INCLUDE=/usr/local/cuda/include RUST_BACKTRACE=1
R=$OUT/r; mkdir -p $R; B=.gpu/bin
t() { local name=$1 lim=$2; shift 2; echo "=== $name $(date +%T)"; timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(date +%T)"; tail -n 4 $R/$name.log; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t swap-small 120 $B/test-gpu_swap_in --include-ignored --test-threads=1 gpu_swap_in_matches_the_cpu_swap_in_for_every_gpu_policy
t engine-deferred 200 $B/test-gpu_engine --include-ignored --test-threads=1 on_cuda_a_deferred_swap_in_is_lossless
S="$B/hisparse sweep --backend cuda --preset glm-5.1 --context 32768 --warmup 8 --window 12 --mode hisparse"
t ce-1-8 90 $S --concurrency 1,8 --miss-fill copy-engine --out $R/ce-1-8
t ce-32 100 $S --concurrency 32 --miss-fill copy-engine --out $R/ce-32
t dg-32 100 $S --concurrency 32 --miss-fill deferred-gather --out $R/dg-32
cd $OUT && tar czf r.tgz r && rm -rf r
