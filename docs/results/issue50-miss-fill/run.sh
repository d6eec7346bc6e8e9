#!/usr/bin/env bash
# Issue 50: the GPU tests after the miss-fill form became the backend's option (every form's
# losslessness, the bound, hits-first, the swap-in and the policy hooks), from a packed build.
# Usage: [ENGINE_S=200] [OTHERS_S=60] bash run.sh   (writes under $OUT; time limits per test binary)
cd "$(dirname "$0")/../../.."
export HISPARSE_CUDA_INCLUDE=/usr/local/cuda/include RUST_BACKTRACE=1
for t in gpu_engine gpu_hits_first gpu_swap_in gpu_policy_hooks; do
  s=$(date +%s)
  limit=${OTHERS_S:-60}; [ $t = gpu_engine ] && limit=${ENGINE_S:-200}
  timeout $limit .gpu/bin/test-$t --include-ignored --test-threads=1 > $OUT/test-$t.log 2>&1
  echo "$t rc=$? $(( $(date +%s) - s ))s $(grep -E '^test result' $OUT/test-$t.log)"
  grep -E "^test .* FAILED|panicked" $OUT/test-$t.log | head -5
done
