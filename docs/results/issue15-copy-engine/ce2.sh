#!/usr/bin/env bash
# Issue 15: the copy-engine path after the small-gather fix: its step at 1/8/32, threads, stages.
cd "$(dirname "$0")/../.."
export HISPARSE_CUDA_INCLUDE=/usr/local/cuda/include RUST_BACKTRACE=1
R=$OUT/r; mkdir -p $R; B=.gpu/bin
t() { local name=$1 lim=$2; shift 2; echo "=== $name $(date +%T)"; timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(date +%T)"; grep -E "^ +32768" $R/$name.log | tail -n 6; }
S="$B/hisparse sweep --backend cuda --preset glm-5.1 --context 32768 --warmup 8 --window 12 --mode hisparse"
t ce-1-8 90 $S --concurrency 1,8 --miss-fill copy-engine --out $R/ce-1-8
t ce-32-t6 100 $S --concurrency 32 --miss-fill copy-engine --host-gather-threads 6 --out $R/ce-32-t6
t ce-nog 130 $B/hisparse sweep --backend cuda --preset glm-5.1 --context 32768 --warmup 6 --window 8 --mode hisparse --no-graphs --concurrency 1,32 --miss-fill copy-engine --out $R/ce-nog
t hits-first 120 $B/test-gpu_hits_first --include-ignored --test-threads=1
t swap-small 60 $B/test-gpu_swap_in --include-ignored --test-threads=1 gpu_swap_in_matches_the_cpu_swap_in_for_every_gpu_policy
cd $OUT && tar czf r.tgz r && rm -rf r
