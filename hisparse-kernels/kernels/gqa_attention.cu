// Sparse decode attention over grouped-query rows (GQA): per request and query head, a softmax
// over `scale * q . K_g` of the request's selected rows, then the weighted sum of their `V_g`,
// where `g` is the head's KV group. A row holds `K_0 .. K_{h-1}, V_0 .. V_{h-1}` (h KV heads of
// head_dim values): bf16, or e4m3 codes in blocks of 128 values with an f32 scale per block
// after them (hisparse-memory's GQA row layouts).
//
// One block per (query head, request), GQA_THREADS threads. Shared memory: the query, then one
// logit per selected row (the launcher sizes it and refuses selections that do not fit). Each
// thread scores rows in turn; the block reduces the maximum and the sum; then each thread owns
// one value dim and sums the rows in selection order (the CPU twin's order), so the output
// differs from the CPU's only by the reductions' order and expf. A location outside the pool
// raises `fault` and its row reads as zeros.
//
// GqaParams, Span and GQA_THREADS: the generated prelude (src/cuda/facts.rs).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#define GQA_NEG_INF __int_as_float(0xff800000)

// Value `idx` (of the row's 2 h head_dim) of `row`.
__device__ __forceinline__ float gqa_value(const unsigned char* row, unsigned idx, const GqaParams& p) {
    if (p.fp8) {
        const __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)row[idx], __NV_E4M3);
        const float s = *reinterpret_cast<const float*>(row + p.scales_at + 4 * (idx / 128));
        return __half2float(__half(h)) * s;
    }
    return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(row)[idx]);
}

// The block's maximum (`max`) or sum of `x`; every thread gets it.
__device__ __forceinline__ float gqa_block_reduce(float x, float* red, bool max) {
    for (unsigned o = 16; o > 0; o /= 2) {
        const float y = __shfl_xor_sync(0xffffffffu, x, o);
        x = max ? fmaxf(x, y) : x + y;
    }
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) red[warp] = x;
    __syncthreads();
    float r = red[0];
    for (unsigned w = 1; w < GQA_THREADS / 32; ++w) r = max ? fmaxf(r, red[w]) : r + red[w];
    return r;
}

extern "C" __global__ void __launch_bounds__(GQA_THREADS) sparse_gqa_decode(
    const __nv_bfloat16* __restrict__ queries,  // [n, heads, head_dim]
    const unsigned char* __restrict__ rows,     // the pool: pool_rows rows of row_bytes
    const int* __restrict__ locations,          // each request's selected rows, from its span
    const Span* __restrict__ sels,              // one span of `locations` per request
    const GqaParams p,
    float* __restrict__ out,                    // [n, heads, head_dim]
    float* __restrict__ lse,                    // [n, heads]
    unsigned* __restrict__ fault) {
    extern __shared__ float gqa_smem[];
    __shared__ float red[GQA_THREADS / 32];
    const unsigned h = blockIdx.x, i = blockIdx.y, t = threadIdx.x, d = p.head_dim;
    float* q = gqa_smem;      // [head_dim]
    float* w = gqa_smem + d;  // [len]: logits, then weights
    const Span s = sels[i];
    const unsigned len = (unsigned)s.len;
    const unsigned g = h / (p.heads / p.kv_heads);
    const unsigned k_at = g * d, v_at = (p.kv_heads + g) * d;
    const size_t qo = ((size_t)i * p.heads + h) * d;
    for (unsigned e = t; e < d; e += GQA_THREADS) q[e] = __bfloat162float(queries[qo + e]);
    __syncthreads();
    float m = GQA_NEG_INF;
    for (unsigned j = t; j < len; j += GQA_THREADS) {
        const int loc = locations[s.offset + j];
        float acc = 0.f;
        if (loc < 0 || (unsigned long long)loc >= p.pool_rows) {
            atomicOr(fault, 1u);
        } else {
            const unsigned char* row = rows + (size_t)loc * p.row_bytes;
            for (unsigned e = 0; e < d; ++e) acc += q[e] * gqa_value(row, k_at + e, p);
        }
        w[j] = p.scale * acc;
        m = fmaxf(m, w[j]);
    }
    m = gqa_block_reduce(m, red, true);
    float sum = 0.f;
    for (unsigned j = t; j < len; j += GQA_THREADS) {
        w[j] = expf(w[j] - m);
        sum += w[j];
    }
    sum = gqa_block_reduce(sum, red, false);  // its leading __syncthreads orders the weights too
    const float inv = 1.f / sum;
    for (unsigned e = t; e < d; e += GQA_THREADS) {
        float acc = 0.f;
        for (unsigned j = 0; j < len; ++j) {
            const int loc = locations[s.offset + j];
            if (loc >= 0 && (unsigned long long)loc < p.pool_rows)
                acc += w[j] * gqa_value(rows + (size_t)loc * p.row_bytes, v_at + e, p);
        }
        out[qo + e] = len ? acc * inv : 0.f;
    }
    if (t == 0) lse[(size_t)i * p.heads + h] = len ? m + logf(sum) : GQA_NEG_INF;
}
