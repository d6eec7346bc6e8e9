// The oracle selection's scores of a model without an indexer (`IndexScore::Oracle`), the CUDA
// twin of `src/cpu/oracle_index.rs`: per request and head the softmax over the request's
// positions of `w_h * q_h . k_t` (keys as e4m3 index keys with an f32 scale; a head's product over
// its query's non-zero span, its group's part of the key), combined over heads by sum or max;
// the first `sink` and last `window` positions (and the newest, with `pin_newest`) scored +inf.
//
// Three launches: `oracle_logits` (a thread per position: every head's logit, into a scratch
// row per position; the products in the CPU's order — eight lanes, then their fixed pairing,
// then the tail — without contraction, so the logits are the CPU's bits), `oracle_stats` (a
// block per request and head: the largest logit and the reciprocal of the sum of exponentials,
// reduced across the block), `oracle_combine` (a thread per position: the heads' weights in head
// order). The scores differ from the CPU's only by expf and the sum's order. A page id outside
// the pool raises `fault` and its key reads as zeros.
//
// IndexerReq, OracleArgs, ORACLE_THREADS and ORACLE_MAX_HEADS: the generated prelude
// (src/cuda/facts.rs).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#define ORACLE_INF __int_as_float(0x7f800000)
#define ORACLE_NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float oracle_e4m3(unsigned char c) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)c, __NV_E4M3);
    return __half2float(__half(h));
}

extern "C" __global__ void __launch_bounds__(ORACLE_THREADS) oracle_logits(
    const __nv_bfloat16* __restrict__ queries,  // [n, heads, dim]
    const float* __restrict__ weights,          // [n, heads]
    const unsigned char* __restrict__ keys,     // pool_pages pages of page_tokens keys
    const unsigned* __restrict__ page_table,
    const IndexerReq* __restrict__ reqs,
    const OracleArgs a,
    float* __restrict__ logits,                 // [score positions, heads]
    unsigned* __restrict__ fault) {
    __shared__ unsigned span_lo[ORACLE_MAX_HEADS], span_hi[ORACLE_MAX_HEADS];
    const unsigned i = blockIdx.y, heads = a.heads, dim = a.dim;
    const IndexerReq r = reqs[i];
    const __nv_bfloat16* q = queries + (size_t)i * heads * dim;
    // Each head's non-zero span of its query (empty for an all-zero query).
    for (unsigned h = threadIdx.x; h < heads; h += ORACLE_THREADS) {
        unsigned lo = 0, hi = 0;
        bool any = false;
        for (unsigned e = 0; e < dim; ++e) {
            if (__bfloat162float(q[h * dim + e]) != 0.f) {
                if (!any) lo = e;
                any = true;
                hi = e + 1;
            }
        }
        span_lo[h] = any ? lo : 0;
        span_hi[h] = any ? hi : 0;
    }
    __syncthreads();
    for (unsigned t = blockIdx.x * ORACLE_THREADS + threadIdx.x; t < r.seq_len; t += gridDim.x * ORACLE_THREADS) {
        const unsigned page = page_table[r.first_page + t / a.page_tokens];
        float* out = logits + ((size_t)r.score_offset + t) * heads;
        if (page >= a.pool_pages) {
            atomicOr(fault, 1u);
            for (unsigned h = 0; h < heads; ++h) out[h] = 0.f;
            continue;
        }
        const unsigned char* row = keys + ((size_t)page * a.page_tokens + t % a.page_tokens) * a.key_bytes;
        const float scale = *reinterpret_cast<const float*>(row + dim);
        for (unsigned h = 0; h < heads; ++h) {
            const unsigned lo = span_lo[h], len = span_hi[h] - lo, body = len - len % 8;
            float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
            for (unsigned e = 0; e < body; ++e) {
                const float k = __fmul_rn(oracle_e4m3(row[lo + e]), scale);
                acc[e % 8] = __fadd_rn(acc[e % 8], __fmul_rn(__bfloat162float(q[h * dim + lo + e]), k));
            }
            float tail = 0.f;
            for (unsigned e = body; e < len; ++e) {
                const float k = __fmul_rn(oracle_e4m3(row[lo + e]), scale);
                tail = __fadd_rn(tail, __fmul_rn(__bfloat162float(q[h * dim + lo + e]), k));
            }
            const float d = __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(acc[0], acc[4]), __fadd_rn(acc[1], acc[5])),
                                                __fadd_rn(__fadd_rn(acc[2], acc[6]), __fadd_rn(acc[3], acc[7]))),
                                      tail);
            out[h] = __fmul_rn(weights[(size_t)i * heads + h], d);
        }
    }
}

// The block's maximum (`max`) or sum of `x`; every thread gets it.
__device__ __forceinline__ float oracle_reduce(float x, float* red, bool max) {
    for (unsigned o = 16; o > 0; o /= 2) {
        const float y = __shfl_xor_sync(0xffffffffu, x, o);
        x = max ? fmaxf(x, y) : x + y;
    }
    __syncthreads();
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = x;
    __syncthreads();
    float r = red[0];
    for (unsigned w = 1; w < ORACLE_THREADS / 32; ++w) r = max ? fmaxf(r, red[w]) : r + red[w];
    return r;
}

extern "C" __global__ void __launch_bounds__(ORACLE_THREADS) oracle_stats(
    const float* __restrict__ logits, const IndexerReq* __restrict__ reqs, const OracleArgs a,
    float* __restrict__ stats) {  // [n, heads, 2]: the largest logit, 1 / the sum
    __shared__ float red[ORACLE_THREADS / 32];
    const unsigned h = blockIdx.x, i = blockIdx.y;
    const IndexerReq r = reqs[i];
    float m = ORACLE_NEG_INF;
    for (unsigned t = threadIdx.x; t < r.seq_len; t += ORACLE_THREADS)
        m = fmaxf(m, logits[((size_t)r.score_offset + t) * a.heads + h]);
    m = oracle_reduce(m, red, true);
    float s = 0.f;
    for (unsigned t = threadIdx.x; t < r.seq_len; t += ORACLE_THREADS)
        s += expf(logits[((size_t)r.score_offset + t) * a.heads + h] - m);
    s = oracle_reduce(s, red, false);
    if (threadIdx.x == 0) {
        stats[((size_t)i * a.heads + h) * 2] = m;
        stats[((size_t)i * a.heads + h) * 2 + 1] = 1.f / s;
    }
}

extern "C" __global__ void __launch_bounds__(ORACLE_THREADS) oracle_combine(
    const float* __restrict__ logits, const float* __restrict__ stats, const IndexerReq* __restrict__ reqs,
    const OracleArgs a, float* __restrict__ scores) {
    const unsigned i = blockIdx.y;
    const IndexerReq r = reqs[i];
    const unsigned n = r.seq_len;
    for (unsigned t = blockIdx.x * ORACLE_THREADS + threadIdx.x; t < n; t += gridDim.x * ORACLE_THREADS) {
        const bool kept = t < a.sink || t + a.window >= n || (a.pin_newest && t + 1 == n);
        float o = ORACLE_INF;
        if (!kept) {
            const float* l = logits + ((size_t)r.score_offset + t) * a.heads;
            const float* st = stats + (size_t)i * a.heads * 2;
            o = a.combine_max ? 0.f : -0.f;
            for (unsigned h = 0; h < a.heads; ++h) {
                const float p = __fmul_rn(expf(l[h] - st[2 * h]), st[2 * h + 1]);
                o = a.combine_max ? fmaxf(o, p) : __fadd_rn(o, p);
            }
        }
        scores[r.score_offset + t] = o;
    }
}
