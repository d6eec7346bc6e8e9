// Sparse decode attention over grouped-query rows (GQA): per request and query head, a softmax
// over `scale * q . K_g` of the request's selected rows, then the weighted sum of their `V_g`,
// where `g` is the head's KV group. A row holds `K_0 .. K_{h-1}, V_0 .. V_{h-1}` (h KV heads of
// head_dim values): bf16, or e4m3 codes in blocks of 128 values with an f32 scale per block
// after them (hisparse-memory's GQA row layouts).
//
// Split over the selection, as flash-decoding splits it: `sparse_gqa_split` takes one block per
// (KV group, request, chunk of GQA_CHUNK selected rows) and serves every query head of the group
// from one read of each row: a warp scores four rows at a time for every head (lanes over the
// dims, a butterfly sum), a warp per head takes the chunk's largest logit and its exponentials, then each
// thread owns value dims and sums the chunk's rows in selection order. Its partial (the output
// relative to the chunk's largest logit, that logit, the sum) goes to scratch; `sparse_gqa_merge`
// (a block per head and request) merges a request's chunks in order. The output differs from the
// CPU's only by the sums' order and expf. A location outside the pool raises `fault` and its row
// reads as zeros.
//
// GqaParams, Span, GQA_THREADS, GQA_CHUNK, GQA_MAX_GROUP and GQA_MAX_HEAD_DIM: the generated prelude
// (src/cuda/facts.rs).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#define GQA_NEG_INF __int_as_float(0xff800000)
#define GQA_WARPS (GQA_THREADS / 32)
#define GQA_ROWS 4  // rows a warp scores at once

// Value `idx` (of the row's 2 h head_dim) of `row`.
__device__ __forceinline__ float gqa_value(const unsigned char* row, unsigned idx, const GqaParams& p) {
    if (p.fp8) {
        const __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)row[idx], __NV_E4M3);
        const float s = *reinterpret_cast<const float*>(row + p.scales_at + 4 * (idx / 128));
        return __half2float(__half(h)) * s;
    }
    return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(row)[idx]);
}

extern "C" __global__ void __launch_bounds__(GQA_THREADS) sparse_gqa_split(
    const __nv_bfloat16* __restrict__ queries,  // [n, heads, head_dim]
    const unsigned char* __restrict__ rows,     // the pool: pool_rows rows of row_bytes
    const int* __restrict__ locations,          // each request's selected rows, from its span
    const Span* __restrict__ sels,              // one span of `locations` per request
    const GqaParams p,
    float* __restrict__ part,                   // [n, heads, chunks, head_dim + 2]
    unsigned* __restrict__ fault) {
    __shared__ float q[GQA_MAX_GROUP * GQA_MAX_HEAD_DIM];  // the group's queries, [group, head_dim]
    __shared__ float w[GQA_MAX_GROUP * GQA_CHUNK];    // logits, then weights, [group, chunk]
    __shared__ float stat[GQA_MAX_GROUP * 2];         // per head: the largest logit, the sum
    __shared__ int loc[GQA_CHUNK];
    const unsigned g = blockIdx.x, i = blockIdx.y, c = blockIdx.z, t = threadIdx.x, d = p.head_dim;
    const unsigned lane = t % 32, warp = t / 32, group = p.heads / p.kv_heads;
    const Span s = sels[i];
    const unsigned j0 = c * GQA_CHUNK;
    if (j0 >= (unsigned)s.len) return;
    const unsigned len = min((unsigned)GQA_CHUNK, (unsigned)s.len - j0);
    const unsigned k_at = g * d, v_at = (p.kv_heads + g) * d;
    const size_t q0 = ((size_t)i * p.heads + g * group) * d;
    for (unsigned e = t; e < group * d; e += GQA_THREADS) q[e] = __bfloat162float(queries[q0 + e]);
    for (unsigned j = t; j < len; j += GQA_THREADS) {
        int l = locations[s.offset + j0 + j];
        if (l < 0 || (unsigned long long)l >= p.pool_rows) {
            atomicOr(fault, 1u);
            l = -1;
        }
        loc[j] = l;
    }
    __syncthreads();
    // Logits: a warp per row, GQA_ROWS rows at a time (their loads in flight together), every
    // head of the group.
    for (unsigned j = warp * GQA_ROWS; j < len; j += GQA_WARPS * GQA_ROWS) {
        float acc[GQA_ROWS][GQA_MAX_GROUP];
#pragma unroll
        for (unsigned r = 0; r < GQA_ROWS; ++r)
#pragma unroll
            for (unsigned h = 0; h < GQA_MAX_GROUP; ++h) acc[r][h] = 0.f;
        for (unsigned e = lane; e < d; e += 32) {
            float k[GQA_ROWS];
#pragma unroll
            for (unsigned r = 0; r < GQA_ROWS; ++r) {
                const int l = j + r < len ? loc[j + r] : -1;
                k[r] = l >= 0 ? gqa_value(rows + (size_t)l * p.row_bytes, k_at + e, p) : 0.f;
            }
#pragma unroll
            for (unsigned h = 0; h < GQA_MAX_GROUP; ++h) {
                if (h >= group) break;
                const float qe = q[h * d + e];
#pragma unroll
                for (unsigned r = 0; r < GQA_ROWS; ++r) acc[r][h] += qe * k[r];
            }
        }
#pragma unroll
        for (unsigned r = 0; r < GQA_ROWS; ++r) {
#pragma unroll
            for (unsigned h = 0; h < GQA_MAX_GROUP; ++h) {
                if (h >= group) break;
                float x = acc[r][h];
                for (unsigned o = 16; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
                if (lane == 0 && j + r < len) w[h * GQA_CHUNK + j + r] = p.scale * x;
            }
        }
    }
    __syncthreads();  // every logit written before any head's softmax reads them
    // A warp per head: the chunk's largest logit, its weights and their sum.
    for (unsigned h = warp; h < group; h += GQA_WARPS) {
        float m = GQA_NEG_INF;
        for (unsigned j = lane; j < len; j += 32) m = fmaxf(m, w[h * GQA_CHUNK + j]);
        for (unsigned o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        float sum = 0.f;
        for (unsigned j = lane; j < len; j += 32) {
            const float x = expf(w[h * GQA_CHUNK + j] - m);
            w[h * GQA_CHUNK + j] = x;
            sum += x;
        }
        for (unsigned o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (lane == 0) {
            stat[2 * h] = m;
            stat[2 * h + 1] = sum;
        }
    }
    __syncthreads();
    // Values: each thread owns dims, the chunk's rows in selection order.
    const unsigned chunks = gridDim.z, stride = d + 2;
    for (unsigned e = t; e < d; e += GQA_THREADS) {
        float acc[GQA_MAX_GROUP];
#pragma unroll
        for (unsigned h = 0; h < GQA_MAX_GROUP; ++h) acc[h] = 0.f;
        // Unrolled so that several rows' loads are in flight; a missing row adds zeros.
#pragma unroll 8
        for (unsigned j = 0; j < len; ++j) {
            const int l = loc[j];
            const float v = l >= 0 ? gqa_value(rows + (size_t)l * p.row_bytes, v_at + e, p) : 0.f;
#pragma unroll
            for (unsigned h = 0; h < GQA_MAX_GROUP; ++h)
                if (h < group) acc[h] += w[h * GQA_CHUNK + j] * v;
        }
#pragma unroll
        for (unsigned h = 0; h < GQA_MAX_GROUP; ++h)
            if (h < group) part[(((size_t)i * p.heads + g * group + h) * chunks + c) * stride + e] = acc[h];
    }
    for (unsigned h = t; h < group; h += GQA_THREADS) {
        float* st = part + (((size_t)i * p.heads + g * group + h) * chunks + c) * stride + d;
        st[0] = stat[2 * h];
        st[1] = stat[2 * h + 1];
    }
}

extern "C" __global__ void __launch_bounds__(GQA_THREADS) sparse_gqa_merge(
    const Span* __restrict__ sels, const GqaParams p, const float* __restrict__ part,
    float* __restrict__ out,  // [n, heads, head_dim]
    float* __restrict__ lse,  // [n, heads]
    unsigned chunks) {
    const unsigned h = blockIdx.x, i = blockIdx.y, t = threadIdx.x, d = p.head_dim, stride = d + 2;
    const unsigned mine = ((unsigned)sels[i].len + GQA_CHUNK - 1) / GQA_CHUNK;
    const float* base = part + ((size_t)i * p.heads + h) * chunks * stride;
    float m = GQA_NEG_INF;
    for (unsigned c = 0; c < mine; ++c) m = fmaxf(m, base[c * stride + d]);
    float sum = 0.f;
    for (unsigned c = 0; c < mine; ++c) sum += base[c * stride + d + 1] * expf(base[c * stride + d] - m);
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    const size_t o = ((size_t)i * p.heads + h) * d;
    for (unsigned e = t; e < d; e += GQA_THREADS) {
        float acc = 0.f;
        for (unsigned c = 0; c < mine; ++c) acc += base[c * stride + e] * expf(base[c * stride + d] - m);
        out[o + e] = mine ? acc * inv : 0.f;
    }
    if (t == 0) lse[(size_t)i * p.heads + h] = mine ? m + logf(sum) : GQA_NEG_INF;
}
