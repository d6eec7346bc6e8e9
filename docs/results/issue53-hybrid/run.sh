#!/usr/bin/env bash
# Issue 53, item 2: hybrid placement against resident (sparse) and hisparse at every concurrency
# of one sweep (`--mode all`), each point the median of 3 windows. The swap-in copies the misses
# in every mode (`--miss-fill swap-in`: hybrid refuses the attention's fill).
# Usage: [BACKEND=cuda] [PRESET=glm-5.1] [KV=fp8] [CONTEXT=32768] [LEVELS=1,4,12,24,44] [EXTRA="..."] DEADLINE_S=540 bash run.sh
cd "$(dirname "$0")/../../.."
export HISPARSE_CUDA_INCLUDE=/usr/local/cuda/include RUST_BACKTRACE=1
R=$OUT; B=.gpu/bin
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv > $R/gpu.txt 2>&1
free -g > $R/host-memory.txt
s=$(date +%s)
timeout ${DEADLINE_S:-540} $B/hisparse sweep --backend ${BACKEND:-cuda} --preset ${PRESET:-glm-5.1} --kv-format ${KV:-fp8} \
  --context ${CONTEXT:-32768} --warmup ${WARMUP:-8} --window ${WINDOW:-12} --windows 3 --miss-fill swap-in \
  --mode all --concurrency ${LEVELS:-1,4,12,24,44} $EXTRA --out $R/sweep > $R/sweep.log 2>&1
echo "sweep rc=$? $(( $(date +%s) - s ))s"; tail -40 $R/sweep.log
# At most 8 files come back from the device: the sweep's outputs travel as one archive.
(cd $R && tar czf outputs.tgz sweep && rm -rf sweep)
