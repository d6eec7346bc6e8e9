// The oracle selection's scores of a model without an indexer (`IndexScore::Oracle`), the CUDA
// twin of `src/cpu/oracle_index.rs`: per request and head the softmax over the request's
// positions of `w_h * q_h . k_t` (keys as e4m3 index keys with an f32 scale; a head's product over
// its query's non-zero part, its group's part of the key), combined over heads by sum or max;
// the first `sink` and last `window` positions (and the newest, with `pin_newest`) scored +inf.
//
// Four launches:
// - `oracle_chunks` (a block per request): which 16-dim chunks of the key each block of 8 heads'
//   queries touch (a grouped-query head touches only its group's chunks);
// - `oracle_logits` (a block per ORACLE_TILE positions of a request): the tile's keys staged in
//   shared memory by asynchronous copies, every head's `q_h . codes_t` on bf16 tensor cores (mma.sync m16n8k16: the
//   e4m3 codes are exact in bf16, the sum in f32), skipping chunks no head of a block touches;
//   the logit `w_h * (scale_t * dot)` into a row of heads per position, and per head the tile's
//   largest logit and sum of exponentials below it;
// - `oracle_stats` (a block per request and head): the tiles' partial statistics merged into the
//   largest logit and the reciprocal of the sum;
// - `oracle_combine` (a thread per position): the heads' weights in head order.
// The scores differ from the CPU's by the dot product's order (the tensor cores' sum, the scale
// applied after it), expf and the sum's order: within 1e-4 of their size (tested). A page id
// outside the pool raises `fault` and its key reads as zeros.
//
// IndexerReq, OracleArgs, ORACLE_THREADS, ORACLE_TILE and ORACLE_HEAD_BLOCKS: the generated
// prelude (src/cuda/facts.rs).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#define ORACLE_INF __int_as_float(0x7f800000)
#define ORACLE_NEG_INF __int_as_float(0xff800000)

extern "C" __global__ void __launch_bounds__(ORACLE_THREADS) oracle_chunks(
    const __nv_bfloat16* __restrict__ queries,  // [n, heads, dim]
    const OracleArgs a,
    unsigned char* __restrict__ chunks) {       // [n, head blocks, dim / 16]
    const unsigned i = blockIdx.x, heads = a.heads, dim = a.dim, dc = dim / 16;
    const unsigned hbs = (heads + 7) / 8;
    const unsigned short* q = reinterpret_cast<const unsigned short*>(queries) + (size_t)i * heads * dim;
    for (unsigned x = threadIdx.x; x < hbs * dc; x += ORACLE_THREADS) {
        const unsigned hb = x / dc, c = x % dc;
        unsigned any = 0;
        for (unsigned h = hb * 8; h < hb * 8 + 8 && h < heads; ++h)
            for (unsigned e = 0; e < 16; ++e) any |= q[h * dim + c * 16 + e] & 0x7fffu;  // +-0 is zero
        chunks[(size_t)i * hbs * dc + x] = any != 0;
    }
}

// Two e4m3 codes at `p` as a bf16 pair (exact: every e4m3 value is a bf16 value).
__device__ __forceinline__ unsigned oracle_bf16x2(const unsigned char* p) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(*reinterpret_cast<const __nv_fp8x2_storage_t*>(p), __NV_E4M3);
    const float2 f = __half22float2(__half2(h));
    const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
    return *reinterpret_cast<const unsigned*>(&b);
}

__device__ __forceinline__ void oracle_mma(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                           unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

extern "C" __global__ void __launch_bounds__(ORACLE_THREADS) oracle_logits(
    const __nv_bfloat16* __restrict__ queries,  // [n, heads, dim]
    const float* __restrict__ weights,          // [n, heads]
    const unsigned char* __restrict__ keys,     // pool_pages pages of page_tokens keys
    const unsigned* __restrict__ page_table,
    const IndexerReq* __restrict__ reqs,
    const OracleArgs a,
    const unsigned char* __restrict__ chunks,   // [n, head blocks, dim / 16]
    float* __restrict__ logits,                 // [score positions, heads]
    float* __restrict__ partials,               // [n, tiles, heads, 2]: largest logit, sum below it
    unsigned* __restrict__ fault) {
    extern __shared__ __align__(16) unsigned char oracle_smem[];
    const unsigned i = blockIdx.y, tile = blockIdx.x, t0 = tile * ORACLE_TILE;
    const IndexerReq r = reqs[i];
    if (t0 >= r.seq_len) return;
    const unsigned heads = a.heads, dim = a.dim, dc = dim / 16, hbs = (heads + 7) / 8, stride = a.tile_stride;
    const unsigned tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    unsigned char* rows = oracle_smem;                    // [ORACLE_TILE, stride]; then the logits
    unsigned char* flags = oracle_smem + a.flags_at;      // [head blocks, dim / 16]
    for (unsigned x = tid; x < hbs * dc; x += ORACLE_THREADS) flags[x] = chunks[(size_t)i * hbs * dc + x];
    // Each row's source, looked up by a thread per row at once (a page-table read each); a
    // missing position or a bad page reads as zeros (-1).
    __shared__ long long src_at[ORACLE_TILE];
    if (tid < ORACLE_TILE) {
        const unsigned t = t0 + tid;
        long long at = -1;
        if (t < r.seq_len) {
            const unsigned page = page_table[r.first_page + t / a.page_tokens];
            if (page < a.pool_pages)
                at = (long long)(((size_t)page * a.page_tokens + t % a.page_tokens) * a.key_bytes);
            else
                atomicOr(fault, 1u);
        }
        src_at[tid] = at;
    }
    __syncthreads();
    // The tile's key rows, a warp per row, copied asynchronously (every copy in flight at once).
    const unsigned words = a.key_bytes / 4;
    for (unsigned row = warp; row < ORACLE_TILE; row += ORACLE_THREADS / 32) {
        const long long at = src_at[row];
        const unsigned char* src = keys + (at < 0 ? 0 : at);
        const unsigned size = at < 0 ? 0 : 4;
        const unsigned dst = (unsigned)__cvta_generic_to_shared(rows + row * stride);
        for (unsigned w = lane; w < words; w += 32)
            asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst + 4 * w),
                         "l"(src + (size ? 4 * w : 0)), "r"(size));
    }
    asm volatile("cp.async.wait_all;\n" ::);
    __syncthreads();
    // Warp w: rows (w % 4) * 16 .. + 16, head blocks w / 4, w / 4 + 2, ...
    const unsigned g = lane / 4, k2 = 2 * (lane % 4), rg = (warp % 4) * 16, set = warp / 4;
    const unsigned char* ra = rows + (rg + g) * stride;
    const unsigned char* rb = ra + 8 * stride;
    const __nv_bfloat16* q = queries + (size_t)i * heads * dim;
    float acc[ORACLE_HEAD_BLOCKS][4];
#pragma unroll
    for (unsigned j = 0; j < ORACLE_HEAD_BLOCKS; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    for (unsigned c = 0; c < dc; ++c) {
        unsigned any = 0;
#pragma unroll
        for (unsigned j = 0; j < ORACLE_HEAD_BLOCKS; ++j) {
            const unsigned hb = set + 2 * j;
            if (hb < hbs) any |= flags[hb * dc + c];
        }
        if (!any) continue;
        const unsigned e = c * 16 + k2;
        const unsigned a0 = oracle_bf16x2(ra + e), a1 = oracle_bf16x2(rb + e);
        const unsigned a2 = oracle_bf16x2(ra + e + 8), a3 = oracle_bf16x2(rb + e + 8);
#pragma unroll
        for (unsigned j = 0; j < ORACLE_HEAD_BLOCKS; ++j) {
            const unsigned hb = set + 2 * j;
            if (hb >= hbs || !flags[hb * dc + c]) continue;
            const unsigned h = hb * 8 + g;
            unsigned b0 = 0, b1 = 0;
            if (h < heads) {
                b0 = *reinterpret_cast<const unsigned*>(q + (size_t)h * dim + e);
                b1 = *reinterpret_cast<const unsigned*>(q + (size_t)h * dim + e + 8);
            }
            oracle_mma(acc[j], a0, a1, a2, a3, b0, b1);
        }
    }
    const float sa = *reinterpret_cast<const float*>(ra + dim), sb = *reinterpret_cast<const float*>(rb + dim);
    __syncthreads();  // every warp has read the rows: their space takes the logits
    // [ORACLE_TILE, heads + 1]: a row of heads per position, padded so that a warp reading one
    // head's column meets no bank conflict.
    const unsigned ss = heads + 1;
    float* stage = reinterpret_cast<float*>(oracle_smem);
#pragma unroll
    for (unsigned j = 0; j < ORACLE_HEAD_BLOCKS; ++j) {
        const unsigned hb = set + 2 * j;
        if (hb >= hbs) continue;
        for (unsigned x = 0; x < 2; ++x) {
            const unsigned h = hb * 8 + k2 + x;
            if (h >= heads) continue;
            const float w = weights[(size_t)i * heads + h];
            stage[(rg + g) * ss + h] = __fmul_rn(w, __fmul_rn(sa, acc[j][x]));
            stage[(rg + g + 8) * ss + h] = __fmul_rn(w, __fmul_rn(sb, acc[j][2 + x]));
        }
    }
    __syncthreads();
    const unsigned n = min(ORACLE_TILE, r.seq_len - t0);
    float* out = logits + ((size_t)r.score_offset + t0) * heads;
    for (unsigned x = tid; x < n * heads; x += ORACLE_THREADS) out[x] = stage[(x / heads) * ss + x % heads];
    // A warp per head: the tile's largest logit and the sum of exponentials below it.
    for (unsigned h = warp; h < heads; h += ORACLE_THREADS / 32) {
        float m = ORACLE_NEG_INF, s = 0.f;
        for (unsigned t = lane; t < n; t += 32) m = fmaxf(m, stage[t * ss + h]);
        for (unsigned o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        for (unsigned t = lane; t < n; t += 32) s += expf(stage[t * ss + h] - m);
        for (unsigned o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) {
            float* p = partials + (((size_t)i * a.tiles + tile) * heads + h) * 2;
            p[0] = m;
            p[1] = s;
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
    const float* __restrict__ partials, const IndexerReq* __restrict__ reqs, const OracleArgs a,
    float* __restrict__ stats) {  // [n, heads, 2]: the largest logit, 1 / the sum
    __shared__ float red[ORACLE_THREADS / 32];
    const unsigned h = blockIdx.x, i = blockIdx.y;
    const IndexerReq r = reqs[i];
    const unsigned tiles = (r.seq_len + ORACLE_TILE - 1) / ORACLE_TILE;
    const float* p = partials + ((size_t)i * a.tiles * a.heads + h) * 2;
    const size_t step = (size_t)a.heads * 2;
    float m = ORACLE_NEG_INF;
    for (unsigned j = threadIdx.x; j < tiles; j += ORACLE_THREADS) m = fmaxf(m, p[j * step]);
    m = oracle_reduce(m, red, true);
    float s = 0.f;
    for (unsigned j = threadIdx.x; j < tiles; j += ORACLE_THREADS) s += p[j * step + 1] * expf(p[j * step] - m);
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
