#!/usr/bin/env bash
# Issue 51, item 4: one request's decode, hisparse bracketed by llama.cpp on the same GGUF, text,
# threads and context (llama.cpp, each hisparse run, llama.cpp again), so that a noisy machine's
# drift shows on both sides. FORMATS empty: hisparse's dense attention (top-k past the context);
# otherwise sparse at top-k 256 with each index format. Per-token times are in each run's
# steps.csv and the llama.cpp JSONs.
# Usage: CONTEXT=8000 FORMATS=channels:16:64,fp8 bash bracket.sh HISPARSE GGUF TEXT OUT_DIR
#        CONTEXT=2048 FORMATS= bash bracket.sh ...   (dense)
set -euo pipefail
hs=$1; gguf=$2; text=$3; out=$4
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
c=${CONTEXT:-8000}; n=64; k=$((c / 1000))k
export RAYON_NUM_THREADS=2
common="--gguf $gguf --text $text --output $n --concurrency 1 --prompts 1 --context $c"
python3 "$here/llama_cpp_decode.py" "$gguf" "$text" --context "$c" --decode $n --threads 2 > "$out/llama-cpp-$c-a.json"
if [ -z "${FORMATS-channels:16:64,fp8}" ]; then
  "$hs" run $common --top-k $((c + n + 1)) --mode resident --out "$out/hisparse-dense-$k" \
    | grep -E "^resident|per token" > "$out/hisparse-dense-$k.txt"
else
  IFS=, read -ra formats <<< "${FORMATS-channels:16:64,fp8}"
  for f in "${formats[@]}"; do
    "$hs" run $common --top-k 256 --mode hisparse --index-format "$f" --out "$out/hisparse-$k-${f//:/-}" \
      | grep -E "^hisparse|per token" > "$out/hisparse-$k-${f//:/-}.txt"
  done
fi
python3 "$here/llama_cpp_decode.py" "$gguf" "$text" --context "$c" --decode $n --threads 2 > "$out/llama-cpp-$c-b.json"
