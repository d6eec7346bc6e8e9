#!/usr/bin/env bash
# Packs `hisparse-engine/tests/gpu_candle.rs` (feature `candle-cuda`) into .gpu/bin on a machine
# without CUDA's libraries. candle's `dynamic-linking` names libcuda, libcudart, libnvrtc,
# cuBLAS(Lt) and cuRAND at link time; this links the test against stub libraries of those names
# (the same sonames, each defining the symbols the link asked of it as empty functions), so the
# executable records them as needed and the GPU host's real libraries are the ones loaded.
# Two passes: the first link's undefined symbols make the stubs. nvcc from .ci/nvcc-env.sh.
# Run from the repository root after ../shared/tools/gpu-pack; writes .gpu/candle.xz.
set -uo pipefail
. .ci/nvcc-env.sh >/dev/null
stubs=${CUDA_STUBS:-$HOME/.cache/hisparse/cuda-stubs}
mkdir -p "$stubs" .gpu/bin
build() {
  cargo rustc --release -p hisparse-engine --test gpu_candle --features candle-cuda --message-format=json-render-diagnostics -- \
    -L "native=$stubs" -C link-arg=-Wl,--error-limit=0 2> "$stubs/link.log"
}
lib_of() {
  case $1 in
    __cuda*|cuda[A-Z]*) echo cudart:13 ;; cublasLt*) echo cublasLt:13 ;; cublas*) echo cublas:13 ;;
    curand*) echo curand:10 ;; nvrtc*) echo nvrtc:13 ;; cu[A-Z]*) echo cuda:1 ;; *) echo "" ;;
  esac
}
make_stubs() {
  rm -f "$stubs"/*.c "$stubs"/*.so
  for lib in cuda:1 cudart:13 nvrtc:13 cublas:13 cublasLt:13 curand:10; do : > "$stubs/${lib%%:*}.c"; done
  for sym in "$@"; do
    l=$(lib_of "$sym"); [ -n "$l" ] || { echo "pack-candle: no library for $sym"; exit 1; }
    echo "void $sym(void) {}" >> "$stubs/${l%%:*}.c"
  done
  for lib in cuda:1 cudart:13 nvrtc:13 cublas:13 cublasLt:13 curand:10; do
    n=${lib%%:*}; gcc -shared -fPIC -o "$stubs/lib$n.so" "$stubs/$n.c" -Wl,-soname,"lib$n.so.${lib##*:}" || exit 1
  done
}
make_stubs
build > /dev/null
undefined=$(grep -o "undefined symbol: [A-Za-z0-9_]*" "$stubs/link.log" | awk '{print $3}' | sort -u)
[ -n "$undefined" ] && make_stubs $undefined
exe=$(build | python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except Exception: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable"): print(m["executable"])')
[ -n "$exe" ] || { echo "pack-candle: the link failed (see $stubs/link.log)"; tail -5 "$stubs/link.log"; exit 1; }
# Compressed (38 MB of candle's kernels; .gpu must stay under 64 MiB): issue41-tip/run-tests.sh
# unpacks it on the GPU host.
cp "$exe" /tmp/test-gpu_candle && strip /tmp/test-gpu_candle
echo "pack-candle: test-gpu_candle needs: $(readelf -d /tmp/test-gpu_candle | grep -o 'lib[a-zA-Z]*\.so\.[0-9]*' | tr '\n' ' ')"
xz -T2 -6 -c /tmp/test-gpu_candle > .gpu/candle.xz && rm /tmp/test-gpu_candle && du -h .gpu/candle.xz
