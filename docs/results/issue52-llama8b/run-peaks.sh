#!/usr/bin/env bash
# Issue 52: the two peaks of the 32k headline in one call — hisparse at its capacity and dense
# resident (no index keys, top-k past every request) up to its own — after the GPU test of dense
# attention under launch graphs.
# Usage: [HS_LEVEL=24] [DENSE_LEVELS=1,13] [BUFFER=8192] bash run-peaks.sh
cd "$(dirname "$0")/../../.."
export HISPARSE_CUDA_INCLUDE=/usr/local/cuda/include RUST_BACKTRACE=1
R=$OUT; B=.gpu/bin
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv > $R/gpu.txt 2>&1
timeout 120 $B/test-gpu_engine --include-ignored --test-threads=1 dense graphs > $R/test-gpu_engine.log 2>&1
echo "gpu_engine dense, graphs rc=$? $(grep -E '^test result' $R/test-gpu_engine.log)"
common="--backend cuda --preset llama-3.1-8b --kv-format bf16 --context 32768 --warmup 16 --window 6 --windows 3"
s=$(date +%s)
timeout 240 $B/hisparse sweep $common --device-buffer-size ${BUFFER:-8192} --concurrency ${HS_LEVEL:-24} --mode hisparse --out $R/hisparse > $R/hisparse.log 2>&1
echo "hisparse rc=$? $(( $(date +%s) - s ))s"; grep -E "^ +32768" $R/hisparse.log
s=$(date +%s)
timeout 240 $B/hisparse sweep $common --concurrency ${DENSE_LEVELS:-1,13} --mode resident --top-k 36864 --out $R/dense > $R/dense.log 2>&1
echo "dense rc=$? $(( $(date +%s) - s ))s"; grep -E "^ +32768|budget" $R/dense.log
(cd $R && tar czf outputs.tgz hisparse dense && rm -rf hisparse dense)
