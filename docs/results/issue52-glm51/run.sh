#!/usr/bin/env bash
# Issue 52, item 3: the GLM-5.1 emulation's table on the H200 against both resident baselines —
# sparse resident, hisparse and the swap-in-free bound (one sweep), then dense resident (--top-k
# past every request: attention over every position, no index keys on the device).
# Usage: DEADLINE_S=570 [KV=bf16|fp8] bash run.sh [CONTEXT] [LEVELS] [DENSE_LEVELS]
cd "$(dirname "$0")/../../.."
export HISPARSE_CUDA_INCLUDE=/usr/local/cuda/include RUST_BACKTRACE=1
R=$OUT; B=.gpu/bin
ctx=${1:-32768}; levels=${2:-1,40}; dense=${3:-1,8}
deadline=$(( $(date +%s) + ${DEADLINE_S:-570} ))
left() { local l=$(( deadline - $(date +%s) )); [ $l -gt 1 ] && echo $l || echo 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv > $R/gpu.txt 2>&1
free -g > $R/host-memory.txt
common="--backend cuda --preset glm-5.1 --kv-format ${KV:-bf16} --context $ctx --warmup 8 --window 12 --windows 3 --miss-fill auto"
s=$(date +%s)
timeout $(left) $B/hisparse sweep $common --concurrency $levels --bound --out $R/sweep > $R/sweep.log 2>&1
echo "sweep rc=$? $(( $(date +%s) - s ))s"; tail -32 $R/sweep.log
s=$(date +%s)
timeout $(left) $B/hisparse sweep $common --concurrency $dense --mode resident --top-k $(( ctx + 4096 )) --out $R/dense > $R/dense.log 2>&1
echo "dense rc=$? $(( $(date +%s) - s ))s"; tail -14 $R/dense.log
# At most 8 files come back from the device: the sweeps' outputs travel as one archive.
(cd $R && tar czf outputs.tgz $(ls -d sweep dense 2>/dev/null) && rm -rf sweep dense)
