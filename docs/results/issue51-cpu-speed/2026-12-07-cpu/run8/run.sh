set -e
cd /work/main
G=/root/.cache/hisparse/models/SmolLM2-135M-Instruct.Q4_1.gguf; T=/tmp/licenses.txt; O=/tmp/llbench/r4
export RAYON_NUM_THREADS=2
common="--gguf $G --text $T --output 64 --concurrency 1 --prompts 1"
python3 docs/results/issue51-cpu-speed/llama_cpp_decode.py $G $T --context 2048 --decode 64 --threads 2 > $O/llama-cpp-2048-a.json
./target/release/hisparse run $common --context 2048 --top-k $((2048 + 64 + 1)) --mode resident --out $O/hisparse-dense-2k | grep -E "^resident|per token" > $O/hisparse-dense-2k.txt
python3 docs/results/issue51-cpu-speed/llama_cpp_decode.py $G $T --context 2048 --decode 64 --threads 2 > $O/llama-cpp-2048-b.json
