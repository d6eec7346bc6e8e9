#!/usr/bin/env bash
# Issue 51, item 4: one request's decode speed on this machine's CPU, hisparse against llama.cpp
# on the same GGUF, text, threads and contexts, one after the other in one run: dense attention
# at 2k (hisparse: top-k past the context, no index), and at 8k llama.cpp's dense against
# hisparse's sparse decode with each index format given. Per-token P50 and tokens/s.
# Usage: [THREADS=2] [DECODE=64] [FORMATS=fp8,int4:32] bash bench.sh HISPARSE GGUF TEXT OUT_DIR
# (llama-cpp-python importable by python3, built from source: `CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON
# -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON
# -DGGML_AVX512_BF16=ON -DLLAMA_CURL=OFF" pip install --no-cache-dir --no-binary llama-cpp-python
# llama-cpp-python`: a native build, or a wheel cached from another machine, dies with an illegal
# instruction on this workspace's VM, whose CPU flags name AMX tiles it does not run).
set -euo pipefail
hs=$1; gguf=$2; text=$3; out=$4
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
t=${THREADS:-2}; n=${DECODE:-64}
export RAYON_NUM_THREADS=$t
common="--gguf $gguf --text $text --output $n --concurrency 1 --prompts 1"
for ctx in 2048 8000; do
  python3 "$here/llama_cpp_decode.py" "$gguf" "$text" --context $ctx --decode $n --threads $t | tee "$out/llama-cpp-$ctx.json"
done
"$hs" run $common --context 2048 --top-k $((2048 + n + 1)) --mode resident --out "$out/hisparse-dense-2k" \
  | grep -E "^resident|per token" | tee "$out/hisparse-dense-2k.txt"
"$hs" run $common --context 8000 --top-k $((8000 + n + 1)) --mode resident --out "$out/hisparse-dense-8k" \
  | grep -E "^resident|per token" | tee "$out/hisparse-dense-8k.txt"
IFS=, read -ra formats <<< "${FORMATS:-fp8,int4:32}"
for f in "${formats[@]}"; do
  "$hs" run $common --context 8000 --top-k 256 --mode hisparse --index-format "$f" --out "$out/hisparse-8k-${f//:/-}" \
    | grep -E "^hisparse|per token" | tee "$out/hisparse-8k-${f//:/-}.txt"
done
