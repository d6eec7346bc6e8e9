# Source this file to get nvcc 13.0 on a machine without a CUDA toolkit: what candle-core's
# `cuda` feature needs to build its kernels (to PTX, no GPU), for hisparse-engine's
# `candle-cuda` feature and the compat/beside-candle-cuda check.
#
# It installs four registry wheels once into a cache folder (nvcc, its crt headers, CCCL, NVVM;
# the CUDA runtime headers come from the NVRTC set-up, .ci/nvrtc-env.sh), joins them into one
# toolkit folder of links, and exports:
#   PATH              += that folder's bin (nvcc)
#   CUDA_ROOT         =  that folder
#   CUDA_COMPUTE_CAP  =  90 (Hopper; nothing here asks a GPU)
# On a machine that has /usr/local/cuda/bin/nvcc this file uses that instead. Sourcing never
# fails the caller: on any problem it prints one line and leaves the variables unset.

_hisparse_nvcc_setup() {
    if [ -x /usr/local/cuda/bin/nvcc ]; then
        export PATH="/usr/local/cuda/bin:$PATH" CUDA_ROOT=/usr/local/cuda CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
        echo "nvcc-env: using the CUDA toolkit in /usr/local/cuda"
        return 0
    fi
    local here
    here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
    . "$here/nvrtc-env.sh" >/dev/null
    if [ -z "${HISPARSE_CUDA_INCLUDE:-}" ]; then
        echo "nvcc-env: no CUDA runtime headers (see .ci/nvrtc-env.sh); nvcc not set up"
        return 0
    fi
    local dir="${HISPARSE_NVCC_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hisparse/nvcc-13.0}"
    local root="$dir/root"
    if [ ! -x "$root/bin/nvcc" ] || [ ! -x "$root/nvvm/bin/cicc" ] || [ ! -e "$root/include/nv/target" ] || [ ! -e "$root/include/cuda_runtime.h" ]; then
        echo "nvcc-env: installing nvidia-cuda-nvcc, -crt 13.0.88, nvidia-nvvm 13.0.88 and nvidia-cuda-cccl 13.0.85 into $dir"
        mkdir -p "$dir/wheels" || { echo "nvcc-env: cannot create $dir"; return 0; }
        if ! python3 -m pip install --quiet --disable-pip-version-check --no-deps --upgrade --target "$dir/wheels" \
                "nvidia-cuda-nvcc==13.0.88" "nvidia-cuda-crt==13.0.88" "nvidia-nvvm==13.0.88" \
                "nvidia-cuda-cccl==13.0.85" >"$dir.log" 2>&1; then
            echo "nvcc-env: pip install failed (see $dir.log); nvcc not set up"
            return 0
        fi
        rm -rf "$root" && mkdir -p "$root/include" "$root/bin" "$root/nvvm"
        local w="$dir/wheels/nvidia/cu13"
        chmod +x "$w/bin/"* "$w/nvvm/bin/"* 2>/dev/null
        # Real folders of links: nvcc finds ../include and ../nvvm beside the path it was run by.
        cp -rs "$w/bin/"* "$root/bin/" && cp -rs "$w/nvvm/"* "$root/nvvm/"
        # One include folder: nvcc's, crt, CCCL and the runtime headers, first wins.
        cp -rsn "$w/include/"* "$HISPARSE_CUDA_INCLUDE/"* "$root/include/" 2>/dev/null
    fi
    export PATH="$root/bin:$PATH" CUDA_ROOT="$root" CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
    echo "nvcc-env: $("$root/bin/nvcc" --version | tail -2 | head -1)"
}
_hisparse_nvcc_setup
unset -f _hisparse_nvcc_setup
