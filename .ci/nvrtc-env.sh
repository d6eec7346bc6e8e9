# Copy of ../shared/tools/nvrtc-env.sh, used by .ci/run where the shared folder is absent.
# Source this file (". ../shared/tools/nvrtc-env.sh") to get an NVRTC 13.0 library and the
# CUDA headers on a machine without a GPU or CUDA toolkit, so that every CUDA kernel source
# of the project can be compiled (to PTX/CUBIN for sm_90a) in tests and CI.
#
# It installs two registry wheels once into a cache folder and exports:
#   LD_LIBRARY_PATH        += folder holding libnvrtc.so.13 (found by cudarc's dynamic loading)
#   HISPARSE_CUDA_INCLUDE  =  folder holding cuda_fp16.h, cuda_bf16.h, cuda_fp8.h, ...
# Versions are pinned to the CUDA 13.0 toolkit of the H200 hosts (driver 580): a newer NVRTC
# emits PTX that driver rejects. On a machine that has /usr/local/cuda this file uses that instead.
# Sourcing never fails the caller: on any problem it prints one line and leaves the variables unset.

_hisparse_nvrtc_setup() {
    if [ -e /usr/local/cuda/include/cuda_fp8.h ] && ls /usr/local/cuda/lib64/libnvrtc.so* >/dev/null 2>&1; then
        export HISPARSE_CUDA_INCLUDE=/usr/local/cuda/include
        export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        echo "nvrtc-env: using the CUDA toolkit in /usr/local/cuda"
        return 0
    fi
    local dir="${HISPARSE_NVRTC_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hisparse/nvrtc-13.0}"
    if [ ! -e "$dir/nvidia/cu13/lib/libnvrtc.so.13" ] || [ ! -e "$dir/nvidia/cu13/include/cuda_fp8.h" ]; then
        echo "nvrtc-env: installing nvidia-cuda-nvrtc 13.0.88 and nvidia-cuda-runtime 13.0.96 into $dir"
        mkdir -p "$dir" || { echo "nvrtc-env: cannot create $dir; kernel compile checks will be skipped"; return 0; }
        if ! python3 -m pip install --quiet --disable-pip-version-check --no-deps --upgrade \
                --target "$dir" "nvidia-cuda-nvrtc==13.0.88" "nvidia-cuda-runtime==13.0.96" >"$dir.log" 2>&1; then
            echo "nvrtc-env: pip install failed (see $dir.log); kernel compile checks will be skipped"
            return 0
        fi
    fi
    export HISPARSE_CUDA_INCLUDE="$dir/nvidia/cu13/include"
    export LD_LIBRARY_PATH="$dir/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "nvrtc-env: NVRTC $(ls "$dir/nvidia/cu13/lib" | grep -m1 -o 'libnvrtc.so.13') ready, headers in $HISPARSE_CUDA_INCLUDE"
}
_hisparse_nvrtc_setup
unset -f _hisparse_nvrtc_setup
