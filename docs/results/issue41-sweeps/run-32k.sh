#!/usr/bin/env bash
# Issue 41, call 2: GLM-5.1 at 32k with fp8 and bf16 rows, concurrency 1 up to capacity, each
# point measured in three series (resident, hisparse, and the swap-in-free bound: the hisparse
# step without the swap-in's copies, timing only); then the per-stage breakdown of both modes
# and the bound at 1, 12 and 32 requests with every layer launched one by one (--no-graphs).
cd "$(dirname "$0")/../../.."
export HISPARSE_CUDA_INCLUDE=/usr/local/cuda/include
R=$OUT/r; mkdir -p $R; B=.gpu/bin
t() { local name=$1; shift; echo "=== $name $(date +%T)"; "$@" > $R/$name.log 2>&1; echo "rc=$? $(date +%T)"; }
S="$B/hisparse sweep --backend cuda --preset glm-5.1 --context 32768 --warmup 8 --window 12 --miss-fill auto --bound"
t glm51-32k-fp8 $S --concurrency 1,2,4,8,16,24,32,40,48 --out $R/glm51-32k-fp8
t glm51-32k-bf16 $S --concurrency 1,2,4,8,16,24,32,40 --kv-format bf16 --out $R/glm51-32k-bf16
t glm51-32k-stages $B/hisparse sweep --backend cuda --preset glm-5.1 --context 32768 --warmup 4 --window 6 \
  --miss-fill auto --bound --no-graphs --concurrency 1,12,32 --out $R/glm51-32k-stages
grep -A4 "^headline" $R/*.log
