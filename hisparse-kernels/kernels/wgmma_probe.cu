// Hopper's warpgroup MMA on operands in shared memory, the building blocks of the wgmma sparse
// MLA decode, each held to a plain product by tests/gpu_wgmma.rs: one warpgroup
// computes D[64][64] = A[64][K] . B (bf16 in, fp32 accumulate) with wgmma.mma_async.m64n64k16,
// K / 16 instructions in one group, in two forms:
//   - wgmma_probe_ss: A and B both K-major in shared memory (S = Q K^T: heads x rows over dims);
//   - wgmma_probe_rs: A in registers (the mma.sync A fragment of each warp's 16 rows) and B
//     MN-major, transposed by the instruction (O = P V: P from the softmax's registers, V the
//     same shared rows as K read along the other dimension);
//   - wgmma_probe_ss_t256: m64n256k16, A K-major and B MN-major both in shared memory (O = P V
//     for a warpgroup that reads P from shared memory; 256 value dims, four swizzle atoms).
// An operand's element (o, i) — o its outer index (M or N for K-major, K for MN-major), i the
// contiguous one — is placed in shared memory as
//   no swizzle:  (o / 8) * step_o + (i / 8) * step_i + (o % 8) * 16 + (i % 8) * 2
//   128 B:       (i / 64) * step_i + (o / 8) * step_o + (o % 8) * 128 + (((i % 64) / 8) ^ (o % 8)) * 16 + (i % 8) * 2
// (8x8 core matrices of 16-byte rows; with the 128-byte swizzle, atoms of 8 rows x 128 B whose
// 16-byte chunks are XORed with the row, 1024-byte aligned). The descriptors' leading and stride
// byte offsets are arguments apart from that placement, so that the test holds the encodings it
// reads in PTX's documentation against the CPU and names the other where that is what works.
//
// The helpers (descriptor, instruction forms) are in wgmma_common.cu, compiled in front.
//
// Invariant: K is a multiple of 16 (64 with the swizzle), at most 256, and the steps place every
// element inside its operand's 64 * K * 2 bytes (the test's launches).

struct ProbeLayout {
    unsigned step_o, step_i;  // placement steps (bytes)
    unsigned lbo, sbo;        // descriptor offsets (bytes)
    unsigned swizzle;         // 0 none, 1 the 128-byte swizzle
};

__device__ __forceinline__ unsigned place(const ProbeLayout& l, unsigned o, unsigned i) {
    if (l.swizzle)
        return (i / 64) * l.step_i + (o / 8) * l.step_o + (o % 8) * 128 + ((((i % 64) / 8) ^ (o % 8)) * 16) + (i % 8) * 2;
    return (o / 8) * l.step_o + (i / 8) * l.step_i + (o % 8) * 16 + (i % 8) * 2;
}

// Copies a [rows][cols] row-major bf16 matrix into shared memory, element (r, c) at
// place(l, r, c) — r outer, c contiguous.
__device__ void stage(unsigned char* dst, const __nv_bfloat16* src, unsigned rows, unsigned cols, const ProbeLayout& l) {
    for (unsigned e = threadIdx.x; e < rows * cols; e += blockDim.x) {
        const unsigned r = e / cols, c = e % cols;
        *reinterpret_cast<__nv_bfloat16*>(dst + place(l, r, c)) = src[e];
    }
}

__device__ __forceinline__ unsigned long long smem_desc(const void* p, const ProbeLayout& l) {
    return wgmma_desc(p, l.lbo, l.sbo, l.swizzle);
}

// The start of k-step s (16 values along K) of an operand whose K is its contiguous index.
__device__ __forceinline__ unsigned k_major_step(const ProbeLayout& l, unsigned s) {
    return l.swizzle ? (s / 4) * l.step_i + (s % 4) * 32 : 2 * s * l.step_i;
}

// D[64][N] from a warpgroup's accumulators: warp w holds rows 16 w + g and + 8; register
// 4 j + {0, 1} columns 8 j + 2 tig + {0, 1} of the first, 4 j + {2, 3} of the second.
template <unsigned N>
__device__ __forceinline__ void store_d(float* d, const float* acc) {
    const unsigned lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, tig = lane & 3;
    #pragma unroll
    for (unsigned j = 0; j < N / 8; ++j) {
        const unsigned r = 16 * w + g, c = 8 * j + 2 * tig;
        d[r * N + c] = acc[4 * j];
        d[r * N + c + 1] = acc[4 * j + 1];
        d[(r + 8) * N + c] = acc[4 * j + 2];
        d[(r + 8) * N + c + 1] = acc[4 * j + 3];
    }
}

__device__ __forceinline__ unsigned pair(const __nv_bfloat16* p) {
    return *reinterpret_cast<const unsigned*>(p);
}

// One block of 128 threads. a: [64][k], b: [64][k] (N x K) bf16 row-major; d: [64][64] f32.
// Dynamic shared memory: 2 * 64 * k * 2 bytes, 1024-aligned.
extern "C" __global__ void __launch_bounds__(128, 1) wgmma_probe_ss(
    const __nv_bfloat16* __restrict__ a, const __nv_bfloat16* __restrict__ b, float* __restrict__ d, unsigned k,
    ProbeLayout la, ProbeLayout lb) {
    extern __shared__ __align__(1024) unsigned char smem[];
    unsigned char* sa = smem;
    unsigned char* sb = smem + 64 * k * 2;
    stage(sa, a, 64, k, la);
    stage(sb, b, 64, k, lb);
    // The generic proxy's writes made visible to the async proxy that wgmma reads through.
    fence_async_shared();
    __syncthreads();
    float acc[32];
    #pragma unroll
    for (int i = 0; i < 32; ++i) acc[i] = 0.f;
    wgmma_fence();
    for (unsigned s = 0; s < k / 16; ++s)
        wgmma_ss(acc, smem_desc(sa + k_major_step(la, s), la), smem_desc(sb + k_major_step(lb, s), lb), s > 0);
    wgmma_commit();
    wgmma_wait_all();
    store_d<64>(d, acc);
}

// One block of 128 threads. a: [64][k] bf16 row-major, read into registers; bt: [k][64] (K x N)
// bf16 row-major, MN-major in shared memory (K outer, N contiguous); d: [64][64] f32. Dynamic
// shared memory: 64 * k * 2 bytes, 1024-aligned.
extern "C" __global__ void __launch_bounds__(128, 1) wgmma_probe_rs(
    const __nv_bfloat16* __restrict__ a, const __nv_bfloat16* __restrict__ bt, float* __restrict__ d, unsigned k,
    ProbeLayout lb) {
    extern __shared__ __align__(1024) unsigned char smem[];
    stage(smem, bt, k, 64, lb);
    fence_async_shared();
    __syncthreads();
    const unsigned lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, tig = lane & 3;
    const __nv_bfloat16* r0 = a + (size_t)(16 * w + g) * k;
    const __nv_bfloat16* r8 = r0 + (size_t)8 * k;
    float acc[32];
    #pragma unroll
    for (int i = 0; i < 32; ++i) acc[i] = 0.f;
    wgmma_fence();
    for (unsigned s = 0; s < k / 16; ++s) {
        // The m16n8k16 A fragment of rows 16 w.. over K 16 s..: (g, 2 tig), (g + 8, 2 tig),
        // (g, 8 + 2 tig), (g + 8, 8 + 2 tig), pairs of consecutive K.
        const unsigned c = 16 * s + 2 * tig;
        const unsigned fa[4] = {pair(r0 + c), pair(r8 + c), pair(r0 + c + 8), pair(r8 + c + 8)};
        // K is the outer index of B here: a k-step is two 8-row groups.
        wgmma_rs_t(acc, fa, smem_desc(smem + 2 * s * lb.step_o, lb), s > 0);
    }
    wgmma_commit();
    wgmma_wait_all();
    store_d<64>(d, acc);
}

// One block of 128 threads: D[64][256] = A . B with A [64][k] K-major and bt [k][256] (K x N)
// MN-major, both in shared memory, B transposed by the instruction (the second warpgroup's
// O = P V of the attention: P from shared memory, 256 value dims spanning four swizzle atoms).
// d: [64][256] f32. Dynamic shared memory: 64 * k * 2 + k * 256 * 2 bytes, 1024-aligned.
extern "C" __global__ void __launch_bounds__(128, 1) wgmma_probe_ss_t256(
    const __nv_bfloat16* __restrict__ a, const __nv_bfloat16* __restrict__ bt, float* __restrict__ d, unsigned k,
    ProbeLayout la, ProbeLayout lb) {
    extern __shared__ __align__(1024) unsigned char smem[];
    unsigned char* sa = smem;
    unsigned char* sb = smem + 64 * k * 2;
    stage(sa, a, 64, k, la);
    stage(sb, bt, k, 256, lb);
    fence_async_shared();
    __syncthreads();
    float acc[128];
    #pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;
    wgmma_fence();
    for (unsigned s = 0; s < k / 16; ++s)
        wgmma_ss_t256(acc, smem_desc(sa + k_major_step(la, s), la), smem_desc(sb + 2 * s * lb.step_o, lb), s > 0);
    wgmma_commit();
    wgmma_wait_all();
    store_d<256>(d, acc);
}
