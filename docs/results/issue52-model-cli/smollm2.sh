#!/usr/bin/env bash
# SmolLM2-135M-Instruct on a device machine that reaches nothing: its GGUF (98 MB, 90 MB as xz)
# passes the 64 MiB a call carries only in two halves, carried by two calls made one after the
# other (the machine stays warm 30 s between them and keeps what the first call left in /tmp).
#   here:       bash docs/results/issue52-model-cli/smollm2.sh split [GGUF]
#               -> .gpu-smollm2/a/part.xz and .gpu-smollm2/b/part.xz (ignored by git)
#   call 1:     carry [".gpu", ".gpu-smollm2/a"], command "bash docs/results/issue52-model-cli/smollm2.sh receive"
#   call 2:     carry [".gpu-smollm2/b"], command "bash docs/results/issue52-model-cli/smollm2.sh receive && ..."
# `receive` copies the part this call carried to /tmp/smollm2; with both there it joins them,
# checks the SHA-256 pinned in hisparse-model/src/fetch.rs and prints the model's path.
set -euo pipefail
cd "$(dirname "$0")/../../.."
want=$(grep -o 'SMOLLM2_SHA256: &str = "[0-9a-f]*"' hisparse-model/src/fetch.rs | grep -o '[0-9a-f]\{64\}')
case "${1:-}" in
  split)
    gguf=${2:-${XDG_CACHE_HOME:-$HOME/.cache}/hisparse/models/SmolLM2-135M-Instruct.Q4_1.gguf}
    [ "$(sha256sum "$gguf" | cut -d' ' -f1)" = "$want" ] || { echo "smollm2: $gguf is not the pinned file"; exit 1; }
    mkdir -p .gpu-smollm2/a .gpu-smollm2/b
    xz -T2 -9 -c "$gguf" > .gpu-smollm2/whole.xz
    half=$(( ($(stat -c %s .gpu-smollm2/whole.xz) + 1) / 2 ))
    head -c "$half" .gpu-smollm2/whole.xz > .gpu-smollm2/a/part.xz
    tail -c +$(( half + 1 )) .gpu-smollm2/whole.xz > .gpu-smollm2/b/part.xz
    rm .gpu-smollm2/whole.xz
    du -h .gpu-smollm2/a/part.xz .gpu-smollm2/b/part.xz ;;
  receive)
    mkdir -p /tmp/smollm2
    for p in a b; do [ -f .gpu-smollm2/$p/part.xz ] && cp .gpu-smollm2/$p/part.xz /tmp/smollm2/$p.xz; done
    if [ -f /tmp/smollm2/a.xz ] && [ -f /tmp/smollm2/b.xz ] && [ ! -f /tmp/smollm2/model.gguf ]; then
      cat /tmp/smollm2/a.xz /tmp/smollm2/b.xz | xz -d > /tmp/smollm2/part.gguf
      [ "$(sha256sum /tmp/smollm2/part.gguf | cut -d' ' -f1)" = "$want" ] || { echo "smollm2: joined file differs"; exit 1; }
      mv /tmp/smollm2/part.gguf /tmp/smollm2/model.gguf
    fi
    if [ -f /tmp/smollm2/model.gguf ]; then echo /tmp/smollm2/model.gguf; else echo "smollm2: $(ls /tmp/smollm2) so far"; fi ;;
  *) echo "usage: smollm2.sh split [GGUF] | receive"; exit 2 ;;
esac
