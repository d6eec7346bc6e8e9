#!/usr/bin/env bash
# Issue 53, item 3: latency under load on one GPU — GLM-5.1 at 32k, fp8 rows, resident,
# hisparse and hybrid placement (MODE=all; the swap-in fills the misses, as hybrid needs) at offered loads from light to past resident's saturation, the same requests at
# every load (Poisson arrivals, seeded): load.csv, latency.svg, and where each mode first made
# requests wait.
# Usage: [RATES=2,4,8,16,32,64] [REQUESTS=48] [OUTPUT=64] [MODE=all] [MISS_FILL=swap-in] [PRESET=glm-5.1]
#        [KV=fp8] [EXTRA="..."] [LIMIT_S=540] bash run.sh   (writes under $OUT)
# On an H100 GLM-5.1's emulated weights do not fit: PRESET=llama-3.1-8b KV=bf16
# EXTRA="--device-buffer-size 8192" REQUESTS=16 RATES=2,8 OUTPUT=32 (each run prefills every
# request's 32k rows into every tier: 32 requests at 4 rates and 3 modes ran past 470 s there).
cd "$(dirname "$0")/../../.."
export HISPARSE_CUDA_INCLUDE=/usr/local/cuda/include RUST_BACKTRACE=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv > $OUT/gpu.txt 2>&1
s=$(date +%s)
timeout ${LIMIT_S:-540} .gpu/bin/hisparse run --backend cuda --preset ${PRESET:-glm-5.1} --kv-format ${KV:-fp8} --context 32768 $EXTRA \
  --output ${OUTPUT:-64} --concurrency ${REQUESTS:-48} --arrival-rate ${RATES:-2,4,8,16,32,64} --mode ${MODE:-all} --miss-fill ${MISS_FILL:-swap-in} \
  --out $OUT/load > $OUT/load.log 2>&1
echo "load sweep rc=$? $(( $(date +%s) - s ))s"
tail -25 $OUT/load.log
