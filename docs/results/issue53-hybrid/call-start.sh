# Sourced by this folder's device calls (run-first.sh, run-short.sh) from the repository root:
# the CUDA headers, a deadline of DEADLINE_S seconds (default $1) with `left` the seconds that
# remain, the GPU named in $OUT/gpu.txt, and hybrid's GPU tests run first.
export HISPARSE_CUDA_INCLUDE=/usr/local/cuda/include RUST_BACKTRACE=1
end=$(( $(date +%s) + ${DEADLINE_S:-$1} ))
left() { local l=$(( end - $(date +%s) )); [ $l -gt 1 ] && echo $l || echo 1; }
O=$OUT; B=.gpu/bin
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv > $O/gpu.txt 2>&1
cat $O/gpu.txt
timeout $(left) $B/test-gpu_engine --include-ignored --test-threads=1 hybrid > $O/test-hybrid.log 2>&1
echo "gpu_engine hybrid rc=$? $(grep -E '^test result' $O/test-hybrid.log)"
