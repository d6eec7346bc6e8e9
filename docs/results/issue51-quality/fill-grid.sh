#!/usr/bin/env bash
# Issue 51, item 2: the quality grid's cells for 2-bit keys (int2:32) and page summaries
# (pages:16) at top-k 64, 256 and 1024, at 2k and 8k, on legal text, code and prose (fp8,
# int4:32 and channels:16:64 have every cell; these two's 2k cells were measured on 2026-12-07,
# their 8k cells on 2026-12-08: BENCHMARKS.md; a machine's numbers differ from another's, so
# compare a cell only with runs of the same machine). One eval per text and
# context (one prefill for both formats), 2 windows of 500 scored tokens, alone on the machine
# for hours (a 2k eval of 13 runs takes about 45 minutes on 2 cores).
# Usage: bash fill-grid.sh HISPARSE LEGAL CODE... -- PROSE OUT_DIR
#   LEGAL: licenses.txt (sha256 c359c7ed...); CODE: the texts of the earlier entries (the CPU
#   kernels' sources at 2k, argparse.py at 8k: give the 2k ones here, CODE8K names argparse.py);
#   PROSE: `git show 8808a4b:BENCHMARKS.md`.
set -euo pipefail
hs=$1; legal=$2; shift 2
code=(); while [ "$1" != "--" ]; do code+=(--text "$1"); shift; done; shift
prose=$1; out=$2; code8k=${CODE8K:-${code[1]}}
mkdir -p "$out"
export RAYON_NUM_THREADS=${RAYON_NUM_THREADS:-2}
run() { local name=$1; shift
  [ -f "$out/$name/eval.csv" ] && { echo "$name: done before"; return; }
  "$hs" eval "$@" --decode 500 --windows 2 --index-format int2:32,pages:16 --out "$out/$name" > "$out/$name.log" 2>&1
  echo "$name rc=$?"; }
# The 2k cells again only with ALL=1 (they are recorded).
if [ "${ALL:-0}" = 1 ]; then
  run legal-2k --text "$legal" --contexts 2048 --top-k 64,256,1024
  run code-2k "${code[@]}" --contexts 2048 --top-k 64,256,1024
  run prose-2k --text "$prose" --contexts 2048 --top-k 64,256,1024
fi
# Legal text at 8k has both formats at top-k 256 recorded; code and prose lack pages:16 there.
run legal-8k --text "$legal" --contexts 7680 --top-k 64,1024
run code-8k --text "$code8k" --contexts 7680 --top-k 64,256,1024
run prose-8k --text "$prose" --contexts 7680 --top-k 64,256,1024
