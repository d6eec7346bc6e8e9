#!/usr/bin/env bash
# Issue 52 item 2 with the real model: SmolLM2-135M-Instruct (joined in /tmp/smollm2 by
# smollm2.sh's two calls) through `eval` and `run` on the CUDA backend, each beside the CPU
# backend's, so that the GPU's perplexity has its CPU twin in one call; with a build whose
# projections run on the GPU too (.gpu/candle-hisparse.xz, model-cuda), that build as well.
# Usage (on the device, after `smollm2.sh receive` printed the model's path):
#   bash docs/results/issue52-model-cli/smollm2-run.sh   (writes $OUT/smollm2.tgz)
cd "$(dirname "$0")/../../.."
export HISPARSE_CUDA_INCLUDE=/usr/local/cuda/include RUST_BACKTRACE=1
O=${OUT:-/tmp/out}; R=/tmp/smollm2-run; M=/tmp/smollm2/model.gguf
T=hisparse-model/tests/data/apache-2.0.txt
[ -f $M ] || { echo "smollm2-run: no $M (run smollm2.sh receive in two calls first)"; exit 1; }
rm -rf "$R"; mkdir -p "$R" "$O"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv > $R/gpu.txt 2>&1
bins="gpu:.gpu/bin"
. docs/results/issue52-model-cli/candle-bin.sh
[ -n "$CANDLE_BIN" ] && bins="$bins gpu-projections:$CANDLE_BIN"
for b in $bins cpu:.gpu/bin; do
  tag=${b%%:*} B=${b#*:} be=cuda
  [ $tag = cpu ] && be=cpu
  # Perplexity and agreement at 1,536 tokens, 256 scored, dense and top-k 256 (fp8 keys: the
  # default on CUDA, given on both for one comparison).
  timeout 240 $B/hisparse eval --gguf $M --text $T --contexts 1536 --decode 256 --windows 1 --top-k 256 \
    --index-format fp8 --backend $be --out $R/eval-$tag > $R/eval-$tag.log 2>&1
  echo "eval $tag rc=$?"; tail -n 6 $R/eval-$tag.log
  # Throughput of 8 requests of a 1,536-token prompt, hisparse and resident.
  timeout 180 $B/hisparse run --gguf $M --text $T --context 1536 --prompts 2 --concurrency 8 --output 32 \
    --top-k 256 --index-format fp8 --backend $be --mode both --out $R/run-$tag > $R/run-$tag.log 2>&1
  echo "run $tag rc=$?"; tail -n 8 $R/run-$tag.log
done
(cd $R && tar czf $O/smollm2.tgz .)
