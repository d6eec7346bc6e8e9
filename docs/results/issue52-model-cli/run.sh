#!/usr/bin/env bash
# Issue 52 item 2: the four model commands with `--backend cuda` on the tiny llama GGUF packed
# with the build (.gpu/tiny.gguf, written by hisparse_model::tiny::write_tiny_gguf), each beside
# the same command on the CPU backend, so that the GPU's numbers have their CPU twin in one call.
# Usage (on the device): bash docs/results/issue52-model-cli/run.sh   (writes under $OUT)
cd "$(dirname "$0")/../../.."
export HISPARSE_CUDA_INCLUDE=/usr/local/cuda/include RUST_BACKTRACE=1
O=${OUT:-/tmp/out}; R=/tmp/model-cli; B=.gpu/bin; G=.gpu/tiny.gguf
T=hisparse-model/tests/data/apache-2.0.txt
rm -rf "$R"; mkdir -p "$R" "$O"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv > $R/gpu.txt 2>&1
common="--gguf $G --text $T --top-k 16 --context 200 --prompts 2 --device-buffer-size 32"
# A build with the projections on the GPU too (feature model-cuda, .gpu/candle-hisparse.xz from
# docs/results/issue40-gpu/pack-candle.sh) runs as the backend "cuda-projections".
bes="cuda cpu"
. docs/results/issue52-model-cli/candle-bin.sh
[ -n "$CANDLE_BIN" ] && bes="cuda-projections $bes"
for tag in $bes; do
  B=.gpu/bin be=$tag
  [ $tag = cuda-projections ] && { B=$CANDLE_BIN; be=cuda; }
  timeout 120 $B/hisparse run $common --backend $be --out $R/run-$tag > $R/run-$tag.log 2>&1
  echo "run $tag rc=$?"; tail -n 12 $R/run-$tag.log
  timeout 120 $B/hisparse sweep $common --backend $be --concurrency 1,2 --out $R/sweep-$tag > $R/sweep-$tag.log 2>&1
  echo "sweep $tag rc=$?"; tail -n 12 $R/sweep-$tag.log
  timeout 180 $B/hisparse eval --gguf $G --text $T --contexts 200 --decode 32 --windows 2 --top-k 16 \
    --backend $be --index-format fp8 --out $R/eval-$tag > $R/eval-$tag.log 2>&1
  echo "eval $tag rc=$?"; tail -n 12 $R/eval-$tag.log
  timeout 120 $B/hisparse generate --gguf $G --prompt "the theory of the thing" --max-tokens 40 \
    --top-k 16 --device-buffer-size 32 --show-misses --backend $be > $R/generate-$tag.log 2>&1
  echo "generate $tag rc=$?"; tail -n 6 $R/generate-$tag.log
done
# At most 8 files come back from the device: the outputs and logs travel as one archive.
(cd $R && tar czf $O/model-cli.tgz .)
