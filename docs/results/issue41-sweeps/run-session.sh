#!/usr/bin/env bash
# Issue 41 on the H200, one call: the sweeps named as arguments, in order, under one deadline
# (DEADLINE_S seconds from the start, default 560; a sweep gets what is left, and one that
# would start with less than a minute is skipped). Every sweep runs resident, hisparse and the
# swap-in-free bound (timing only) at each concurrency. Names:
#   fp8-small   GLM-5.1 32k fp8 rows at 1, 2, 4, 8 and 16 requests (the bound's small batches)
#   bf16        GLM-5.1 32k bf16 rows, 1 request up to capacity
#   stages      GLM-5.1 32k per-stage breakdown (every layer launched one by one) at 1, 12, 32
#   glm52       GLM-5.2 (IndexShare, shared-index prefetch) 32k up to its capacity
#   128k        GLM-5.1 at 128k up to the host tier's limit
cd "$(dirname "$0")/../../.."
export HISPARSE_CUDA_INCLUDE=/usr/local/cuda/include
R=$OUT/r; mkdir -p $R; B=.gpu/bin
deadline=$(( $(date +%s) + ${DEADLINE_S:-560} ))
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv > $R/gpu.txt 2>&1
S="$B/hisparse sweep --backend cuda --preset glm-5.1 --context 32768 --warmup 8 --window 12 --miss-fill auto --bound"
t() { local name=$1; shift; local left=$(( deadline - $(date +%s) ))
  if [ $left -lt 60 ]; then echo "=== $name skipped (deadline)"; return; fi
  echo "=== $name $(date +%T)"; timeout $left "$@" > $R/$name.log 2>&1; echo "rc=$? $(date +%T)"; }
for name in "$@"; do case $name in
  fp8-small) t glm51-32k-fp8-small $S --concurrency 1,2,4,8,16 --out $R/glm51-32k-fp8-small ;;
  bf16) t glm51-32k-bf16 $S --concurrency 1,8,16,24,32,40 --kv-format bf16 --out $R/glm51-32k-bf16 ;;
  stages) t glm51-32k-stages $B/hisparse sweep --backend cuda --preset glm-5.1 --context 32768 --warmup 4 \
    --window 6 --miss-fill auto --bound --no-graphs --concurrency 1,12,32 --out $R/glm51-32k-stages ;;
  glm52) t glm52-32k $B/hisparse sweep --backend cuda --preset glm-5.2 --prefetcher shared-index --context 32768 \
    --warmup 8 --window 12 --miss-fill auto --bound --concurrency 1,32,48,56,64 --out $R/glm52-32k ;;
  128k) t glm51-128k-fp8 $B/hisparse sweep --backend cuda --preset glm-5.1 --context 131072 --warmup 8 --window 12 \
    --miss-fill auto --bound --concurrency 1,4,8,12,16 --out $R/glm51-128k-fp8 ;;
  *) echo "unknown sweep $name" ;;
esac; done
grep -A4 "^headline" $R/*.log
# At most 8 files come back from the device: everything travels as one archive.
(cd $OUT && tar czf sweeps.tgz r && rm -rf r)
