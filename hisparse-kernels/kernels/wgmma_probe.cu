// Hopper's warpgroup MMA on operands in shared memory, the building block of the wgmma sparse MLA
// decode (issue 16): one warpgroup computes D[64][64] = A[64][K] . B[64][K]^T (bf16 in, fp32
// accumulate) with wgmma.mma_async.m64n64k16, K / 16 instructions in one group. A and B are
// K-major and unswizzled in shared memory: 8x8 core matrices of 128 contiguous bytes (8 rows of
// 16 B), the core matrix of rows 8i.. and columns 8j.. at i * m_step + j * k_step bytes. The
// descriptor's leading and stride byte offsets are arguments apart from that placement, so that
// the GPU test holds the encoding PTX documents (leading = the step along K, stride = the step
// along M or N) against the CPU twin (a plain product), and can name the other if it is the one
// that works.
//
// Invariant: K is a multiple of 16, at most 256, and the steps place every core matrix inside
// 64 * K * 2 bytes (the test's launches; shared memory: 2 * 64 * K * 2 B).

#include <cuda_bf16.h>

__device__ __forceinline__ unsigned long long smem_desc(const void* p, unsigned lbo, unsigned sbo) {
    const unsigned addr = (unsigned)__cvta_generic_to_shared(p);
    return (unsigned long long)((addr >> 4) & 0x3fff) | ((unsigned long long)((lbo >> 4) & 0x3fff) << 16) |
           ((unsigned long long)((sbo >> 4) & 0x3fff) << 32);  // base offset 0, no swizzle
}

__device__ __forceinline__ void wgmma_m64n64k16(float* d, unsigned long long a, unsigned long long b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(a), "l"(b), "r"(accumulate));
}

// One block of 128 threads (a warpgroup). a: [64][k] and b: [64][k] bf16 row-major; d: [64][64]
// f32 row-major. Dynamic shared memory: 2 * 64 * k * 2 bytes.
extern "C" __global__ void __launch_bounds__(128, 1) wgmma_bf16_probe(
    const __nv_bfloat16* __restrict__ a, const __nv_bfloat16* __restrict__ b, float* __restrict__ d, unsigned k,
    unsigned k_step, unsigned m_step, unsigned lbo, unsigned sbo) {
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char* sa = smem;
    unsigned char* sb = smem + 64 * k * 2;
    // 16-byte pieces: piece (r, c8) holds row r, columns 8 c8 .. + 7; it goes to core matrix
    // (r / 8, c8) at row r % 8.
    const unsigned pieces = 64 * (k / 8);
    for (unsigned e = threadIdx.x; e < 2 * pieces; e += blockDim.x) {
        const unsigned m = e / pieces, q = e % pieces, r = q / (k / 8), c8 = q % (k / 8);
        const uint4 v = reinterpret_cast<const uint4*>(m ? b : a)[q];
        unsigned char* base = m ? sb : sa;
        *reinterpret_cast<uint4*>(base + (r / 8) * m_step + c8 * k_step + (r % 8) * 16) = v;
    }
    // The generic proxy's writes made visible to the async proxy that wgmma reads through.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    float acc[32];
    #pragma unroll
    for (int i = 0; i < 32; ++i) acc[i] = 0.f;
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    for (unsigned s = 0; s < k / 16; ++s)
        wgmma_m64n64k16(acc, smem_desc(sa + 2 * s * k_step, lbo, sbo), smem_desc(sb + 2 * s * k_step, lbo, sbo),
                        s > 0);
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    // Accumulator layout: warp w holds rows 16 w + g and + 8; register 4 j + {0, 1} columns
    // 8 j + 2 tig + {0, 1} of the first, 4 j + {2, 3} of the second.
    const unsigned lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, tig = lane & 3;
    #pragma unroll
    for (int j = 0; j < 8; ++j) {
        const unsigned r = 16 * w + g, c = 8 * j + 2 * tig;
        d[r * 64 + c] = acc[4 * j];
        d[r * 64 + c + 1] = acc[4 * j + 1];
        d[(r + 8) * 64 + c] = acc[4 * j + 2];
        d[(r + 8) * 64 + c + 1] = acc[4 * j + 3];
    }
}
