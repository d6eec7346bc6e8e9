#!/usr/bin/env bash
# Issue 41, call 3: GLM-5.1 at 128k (up to the host tier's limit) and GLM-5.2 (IndexShare,
# shared-index prefetch) at 32k up to its capacity, both with the swap-in-free bound.
cd "$(dirname "$0")/../../.."
export HISPARSE_CUDA_INCLUDE=/usr/local/cuda/include
R=$OUT/r; mkdir -p $R; B=.gpu/bin
t() { local name=$1; shift; echo "=== $name $(date +%T)"; "$@" > $R/$name.log 2>&1; echo "rc=$? $(date +%T)"; }
t glm51-128k-fp8 $B/hisparse sweep --backend cuda --preset glm-5.1 --context 131072 --warmup 8 --window 12 \
  --miss-fill auto --bound --concurrency 1,2,4,8,12,16 --out $R/glm51-128k-fp8
t glm52-32k $B/hisparse sweep --backend cuda --preset glm-5.2 --prefetcher shared-index --context 32768 \
  --warmup 8 --window 12 --miss-fill auto --bound --concurrency 1,12,32,48,56,64 --out $R/glm52-32k
grep -A4 "^headline" $R/*.log
