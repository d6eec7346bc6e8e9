set -e
cd /work/main
G=/root/.cache/hisparse/models/SmolLM2-135M-Instruct.Q4_1.gguf; T=/tmp/licenses.txt; O=/tmp/llbench/r3
export RAYON_NUM_THREADS=2
common="--gguf $G --text $T --output 64 --concurrency 1 --prompts 1"
python3 docs/results/issue51-cpu-speed/llama_cpp_decode.py $G $T --context 8000 --decode 64 --threads 2 > $O/llama-cpp-8000-a.json
./target/release/hisparse run $common --context 8000 --top-k 256 --mode hisparse --index-format channels:16:64 --out $O/hisparse-8k-channels-16-64 | grep -E "^hisparse|per token" > $O/hisparse-8k-channels-16-64.txt
./target/release/hisparse run $common --context 8000 --top-k 256 --mode hisparse --index-format fp8 --out $O/hisparse-8k-fp8 | grep -E "^hisparse|per token" > $O/hisparse-8k-fp8.txt
python3 docs/results/issue51-cpu-speed/llama_cpp_decode.py $G $T --context 8000 --decode 64 --threads 2 > $O/llama-cpp-8000-b.json
