#!/usr/bin/env bash
# A short device call, most wanted first: hybrid placement's GPU tests with index keys in the
# shared pool (issue 53), the CUDA oracle over fp8 and top-channel keys against the CPU's
# (issue 52), the model with its projections on the GPU where packed (issue 52), then hybrid
# against resident and hisparse at one request and at resident's
# capacity — GLM-5.1 32k fp8 on an H200 (levels 1, 12), Llama-3.1-8B 32k bf16 with 8192-slot
# buffers on an H100 (levels 1, 10) — within what is left of DEADLINE_S.
# Usage: DEADLINE_S=400 bash run-short.sh   (writes under $OUT)
cd "$(dirname "$0")/../../.."
. docs/results/issue53-hybrid/call-start.sh 400
timeout $(left) $B/test-gpu_oracle --include-ignored --test-threads=1 > $O/test-oracle.log 2>&1
echo "gpu_oracle rc=$? $(grep -E '^test result' $O/test-oracle.log)"
# The model with its projections on the GPU (issue 52), where its candle build was packed
# (docs/results/issue40-gpu/pack-candle.sh hisparse-model gpu_model candle-cuda).
if [ -f .gpu/candle-gpu_model.xz ]; then
  export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
  python3 -c 'import lzma,sys; open(sys.argv[2],"wb").write(lzma.open(sys.argv[1]).read())' .gpu/candle-gpu_model.xz \
    /tmp/test-gpu_model-candle && chmod +x /tmp/test-gpu_model-candle
  timeout $(left) /tmp/test-gpu_model-candle --include-ignored --test-threads=1 --nocapture > $O/test-model-candle.log 2>&1
  echo "gpu_model (candle) rc=$? $(grep -E '^test result' $O/test-model-candle.log)"
fi
mkdir -p /tmp/hy
if grep -q H200 $O/gpu.txt; then
  OUT=/tmp/hy DEADLINE_S=$(( $(left) - 5 )) LEVELS=1,12 bash docs/results/issue53-hybrid/run.sh
else
  OUT=/tmp/hy DEADLINE_S=$(( $(left) - 5 )) PRESET=llama-3.1-8b KV=bf16 LEVELS=1,10 WARMUP=16 WINDOW=6 \
    EXTRA="--device-buffer-size 8192" bash docs/results/issue53-hybrid/run.sh
fi
cp /tmp/hy/sweep.log /tmp/hy/outputs.tgz $O/ 2>/dev/null
