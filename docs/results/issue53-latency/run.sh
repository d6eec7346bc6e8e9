#!/usr/bin/env bash
# Issue 53, item 3: latency under load, resident against hisparse, on the packed build.
# Poisson arrivals (seeded: the same requests and arrival times in every mode) at each offered
# load in RATES (requests per second), every request CONTEXT prompt tokens and OUTPUT decoded
# ones, REQUESTS of them per run; `hisparse run --arrival-rate` reports time to first decode and
# per-token latency (P50, P90, P99) per mode. Runs in order under one deadline (DEADLINE_S
# seconds, default 540): a run that would start with less than 40 s left is skipped.
#   bash docs/results/issue53-latency/run.sh [EXTRA FLAGS...]     # e.g. --backend cuda --preset glm-5.1
cd "$(dirname "$0")/../../.."
export HISPARSE_CUDA_INCLUDE=${HISPARSE_CUDA_INCLUDE:-/usr/local/cuda/include}
R=${OUT:-/tmp}/lat; mkdir -p "$R"
deadline=$(( $(date +%s) + ${DEADLINE_S:-540} ))
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv > "$R/gpu.txt" 2>&1
for rate in ${RATES:-1 2 4 8 16}; do
  for mode in resident hisparse; do
    left=$(( deadline - $(date +%s) ))
    name=rate$rate-$mode
    if [ $left -lt 40 ]; then echo "$name skipped (deadline)"; continue; fi
    s=$(date +%s)
    timeout $left .gpu/bin/hisparse run --mode $mode --concurrency ${REQUESTS:-24} --arrival-rate $rate \
      --context ${CONTEXT:-32768} --output ${OUTPUT:-64} --seed 7 --out "$R/$name" "$@" > "$R/$name.log" 2>&1
    echo "$name rc=$? $(( $(date +%s) - s ))s $(grep -h 'time to first' "$R/$name.log")"
  done
done
python3 "$(dirname "$0")/table.py" "$R" | tee "$R/table.md"
(cd "${OUT:-/tmp}" && tar czf lat.tgz lat && rm -rf lat)
