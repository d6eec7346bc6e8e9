#!/usr/bin/env bash
# One device call for a session that may get only one, most wanted first: hybrid placement's GPU
# tests (issue 53, item 1), hybrid against resident and hisparse (item 2) on the GPU that came —
# GLM-5.1 32k fp8 on an H200, Llama-3.1-8B 32k bf16 (8192-slot buffers) on an H100 — then
# latency under load with every mode (item 3, sized for the GPU that came), then the model
# commands' CUDA run (issue 52), each within what is left of DEADLINE_S.
# Usage: DEADLINE_S=570 bash run-first.sh   (writes under $OUT)
cd "$(dirname "$0")/../../.."
. docs/results/issue53-hybrid/call-start.sh 570
mkdir -p /tmp/hy /tmp/lat
if grep -q H200 $O/gpu.txt; then
  OUT=/tmp/hy DEADLINE_S=$(( $(left) * 3 / 5 )) LEVELS=1,12,44 bash docs/results/issue53-hybrid/run.sh
  OUT=/tmp/lat LIMIT_S=$(( $(left) - 60 )) REQUESTS=24 RATES=2,8,32 bash docs/results/issue53-latency/run.sh
else
  OUT=/tmp/hy DEADLINE_S=$(( $(left) * 3 / 5 )) PRESET=llama-3.1-8b KV=bf16 LEVELS=1,12,23 WARMUP=16 WINDOW=6 \
    EXTRA="--device-buffer-size 8192" bash docs/results/issue53-hybrid/run.sh
  OUT=/tmp/lat LIMIT_S=$(( $(left) - 60 )) PRESET=llama-3.1-8b KV=bf16 EXTRA="--device-buffer-size 8192" \
    REQUESTS=16 RATES=2,8 OUTPUT=32 bash docs/results/issue53-latency/run.sh
fi
cp /tmp/hy/sweep.log /tmp/hy/outputs.tgz $O/ 2>/dev/null
(cd /tmp/lat && tar czf $O/latency.tgz . 2>/dev/null)
[ $(left) -gt 40 ] && { timeout $(( $(left) - 5 )) bash docs/results/issue52-model-cli/run.sh > $O/model-cli.txt 2>&1; echo "model-cli rc=$?"; }
