#!/usr/bin/env bash
# Packs a GPU test that needs candle's CUDA kernels: `hisparse-engine/tests/gpu_candle.rs` (feature
# `candle-cuda`) by default, or another as `pack-candle.sh PACKAGE TEST FEATURES` (the model's
# projections on CUDA: `pack-candle.sh hisparse-model gpu_model candle-cuda`; the CLI with them:
# `pack-candle.sh hisparse-bench bin:hisparse model-cuda`), on a machine without CUDA's
# libraries; writes .gpu/candle-TEST.xz (a program: .gpu/candle-NAME.xz). candle's
# `dynamic-linking` names libcuda, libcudart, libnvrtc, cuBLAS(Lt) and cuRAND at link time (and
# NCCL, for a build with the `nccl` feature: the GPU host's is PyTorch's libnccl.so.2); this links
# against stub libraries of those names (the same sonames, each defining the symbols the link
# asked of it as empty functions), so the executable records them as needed and the GPU host's
# real libraries are the ones loaded.
# Two passes: the first link's undefined symbols make the stubs. nvcc from .ci/nvcc-env.sh.
# Run from the repository root after ../shared/tools/gpu-pack.
set -uo pipefail
pkg=${1:-hisparse-engine} test=${2:-gpu_candle} features=${3:-candle-cuda}
target=(--test "$test")
# A target folder of its own: these builds link CUDA's libraries (stubs here), and a program built
# into target/release would replace the one the CPU runs use.
tdir=${CANDLE_TARGET_DIR:-target/candle}
case $test in bin:*) test=${test#bin:}; target=(--bin "$test") ;; esac
. .ci/nvcc-env.sh >/dev/null
stubs=${CUDA_STUBS:-$HOME/.cache/hisparse/cuda-stubs}
mkdir -p "$stubs" .gpu/bin
build() {
  cargo rustc --release --target-dir "$tdir" -p "$pkg" "${target[@]}" --features "$features" --message-format=json-render-diagnostics -- \
    -L "native=$stubs" -C link-arg=-Wl,--error-limit=0 2> "$stubs/link.log"
}
lib_of() {
  case $1 in
    __cuda*|cuda[A-Z]*) echo cudart:13 ;; cublasLt*) echo cublasLt:13 ;; cublas*) echo cublas:13 ;;
    curand*) echo curand:10 ;; nvrtc*) echo nvrtc:13 ;; nccl*) echo nccl:2 ;; cu[A-Z]*) echo cuda:1 ;; *) echo "" ;;
  esac
}
make_stubs() {
  rm -f "$stubs"/*.c "$stubs"/*.so
  for lib in cuda:1 cudart:13 nvrtc:13 cublas:13 cublasLt:13 curand:10 nccl:2; do : > "$stubs/${lib%%:*}.c"; done
  for sym in "$@"; do
    l=$(lib_of "$sym"); [ -n "$l" ] || { echo "pack-candle: no library for $sym"; exit 1; }
    echo "void $sym(void) {}" >> "$stubs/${l%%:*}.c"
  done
  for lib in cuda:1 cudart:13 nvrtc:13 cublas:13 cublasLt:13 curand:10 nccl:2; do
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
# unpacks every .gpu/candle-*.xz on the GPU host.
cp "$exe" "/tmp/pack-$test" && strip "/tmp/pack-$test"
echo "pack-candle: $test needs: $(readelf -d "/tmp/pack-$test" | grep -o 'lib[a-zA-Z]*\.so\.[0-9]*' | tr '\n' ' ')"
xz -T2 -6 -c "/tmp/pack-$test" > ".gpu/candle-$test.xz" && rm "/tmp/pack-$test" && du -h ".gpu/candle-$test.xz"
