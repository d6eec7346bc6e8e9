#!/usr/bin/env bash
# Records the CPU selection traces of the main job's engine under every online policy, the
# prefetchers and the miss-fill modes; prints their SHA-256. Usage: record.sh HISPARSE OUTDIR
set -euo pipefail
H=$1; O=$2; mkdir -p "$O"; cd "$O"
base="run --backend cpu --mode hisparse --concurrency 4 --context 3000 --output 24 --device-buffer-size 512"
for p in lru fifo random clock clock-cold s3fifo mq score score-lru; do
  $H $base --eviction-policy $p --record-trace $p.hstrace --out r-$p >/dev/null 2>&1
done
for f in none adjacent-layer next-step; do
  $H $base --prefetcher $f --record-trace pf-$f.hstrace --out r-pf-$f >/dev/null 2>&1
done
$H run --backend cpu --mode hisparse --preset cpu-small --concurrency 3 --context 3000 --output 16 --prefetcher shared-index --record-trace shared.hstrace --out r-shared >/dev/null 2>&1 || echo "shared-index n/a on cpu-small"
for m in swap-in attention deferred auto; do
  $H $base --miss-fill $m --record-trace mf-$m.hstrace --out r-mf-$m >/dev/null 2>&1
done
$H sweep --backend cpu --out sweep >/dev/null 2>&1
python3 -c "
import json; r=json.load(open('sweep/sweep.json'))
print('sweep misses', json.dumps([r['misses_over_time'], r['misses_by_buffer'], [(p['context'],p['concurrency'],p['mode'],p['misses_per_step']) for p in r['points']]])[:0])
json.dump([r['misses_over_time'], r['misses_by_buffer'], [(p['context'],p['concurrency'],p['mode'],p['misses_per_step'],p['miss_ratio']) for p in r['points']]], open('sweep-counts.json','w'))"
sha256sum *.hstrace sweep-counts.json
