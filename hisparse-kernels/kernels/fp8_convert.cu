// fp8 e4m3 conversions on the GPU: the twins of hisparse_memory::fp8::{encode_e4m3, decode_e4m3}.
// Encoding goes through CUDA's own __nv_fp8_e4m3(float) constructor (cvt.rn.satfinite on sm_89+),
// so a GPU test comparing these kernels with the CPU codec proves the codec bit-exact.
#include <cuda_fp8.h>

extern "C" __global__ void e4m3_encode(const float* __restrict__ x, unsigned char* __restrict__ out,
                                       unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = __nv_fp8_e4m3(x[i]).__x;
    }
}

extern "C" __global__ void e4m3_decode(const unsigned char* __restrict__ in, float* __restrict__ out,
                                       unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        __nv_fp8_e4m3 v;
        v.__x = in[i];
        out[i] = static_cast<float>(v);
    }
}
