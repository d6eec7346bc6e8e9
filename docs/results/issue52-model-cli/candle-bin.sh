# Sourced by this folder's device scripts: unpacks the hisparse built with the projections on the
# GPU (.gpu/candle-hisparse.xz, from docs/results/issue40-gpu/pack-candle.sh hisparse-bench
# bin:hisparse model-cuda) into /tmp/candle-bin, with the CUDA toolkit's libraries and PyTorch's
# NCCL on LD_LIBRARY_PATH (the build links them); sets CANDLE_BIN to its folder, or leaves it
# empty where there is no such pack.
CANDLE_BIN=""
if [ -f .gpu/candle-hisparse.xz ]; then
  nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null \
    || dirname "$(find / -name 'libnccl.so.2' -not -path '/proc/*' 2>/dev/null | head -1)")
  export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$nccl:${LD_LIBRARY_PATH:-}
  mkdir -p /tmp/candle-bin && python3 -c 'import lzma,sys; open(sys.argv[2],"wb").write(lzma.open(sys.argv[1]).read())' \
    .gpu/candle-hisparse.xz /tmp/candle-bin/hisparse && chmod +x /tmp/candle-bin/hisparse && CANDLE_BIN=/tmp/candle-bin
fi
