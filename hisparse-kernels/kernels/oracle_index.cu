// The oracle selection's scores of a model without an indexer (`IndexScore::Oracle`), the CUDA
// twin of `src/cpu/oracle_index.rs`: per request and head the softmax over the request's
// positions of `w_h * q_h . k_t` (keys as e4m3 index keys with an f32 scale; a head's product over
// its query's non-zero part, its group's part of the key; top-channel keys expanded into such
// rows as a tile is staged), combined over heads by sum or max;
// the first `sink` and last `window` positions (and the newest, with `pin_newest`) scored +inf.
//
// Four launches:
// - `oracle_chunks` (a block per request and block of 8 heads): which 16-dim chunks of the key each block of 8 heads'
//   queries touch (a grouped-query head touches only its group's chunks), as a count and a list
//   per head block; and the queries as the tensor cores take them: each head's scaled by a power
//   of two 2^s (its largest magnitude into [2^14, 2^15)) and rounded to f16, laid out as each
//   lane's B fragment of each listed chunk (the chunk's dims permuted so that a lane's four key
//   bytes are one aligned word), with 2^-s per head beside them;
// - `oracle_logits` (a block per ORACLE_TILE positions of a request): the tile's keys staged in
//   shared memory by asynchronous copies, every head's `q_h . codes_t` on f16 tensor cores
//   (mma.sync m16n8k16: e4m3 codes are exact in f16, two of them converted by one instruction;
//   the sum in f32) over its block's listed chunks only; the logit `w_h * (scale_t * (dot * 2^-s))`
//   into a row of heads per position, and per head the tile's largest logit and sum of
//   exponentials below it;
// - `oracle_stats` (a block per request and head): the tiles' partial statistics merged into the
//   largest logit and the reciprocal of the sum;
// - `oracle_combine` (a warp per 32 positions, a lane per head): the heads' weights summed (or
//   their largest taken) across the warp.
// The scores differ from the CPU's by the dot product's order (the tensor cores' sum, the scale
// applied after it), a query's parts below 2^-24 of its largest rounded (f16's subnormals), expf
// and the heads' sum's order: within 1e-4 of their size (tested). A page id outside the pool raises
// `fault` and its key reads as zeros.
//
// IndexerReq, OracleArgs, ORACLE_THREADS, ORACLE_TILE, ORACLE_HEAD_BLOCKS, ORACLE_MAX_HEADS and
// ORACLE_MAX_CHUNKS: the generated prelude (src/cuda/facts.rs).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#define ORACLE_INF __int_as_float(0x7f800000)
#define ORACLE_NEG_INF __int_as_float(0xff800000)

// `x` as an f16 pair's bits (the low half first).
__device__ __forceinline__ unsigned oracle_f16x2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&h);
}

extern "C" __global__ void __launch_bounds__(ORACLE_THREADS) oracle_chunks(
    const __nv_bfloat16* __restrict__ queries,  // [n, heads, dim]
    const OracleArgs a,
    unsigned char* __restrict__ lists,          // [n, head blocks, chunks + 1]: a count, then chunk ids
    unsigned* __restrict__ fragments,           // [n, head blocks, chunks, 32 lanes, 2]: f16 pairs
    float* __restrict__ inverse) {              // [n, heads]: 2^-s
    // A block per request and head block.
    __shared__ int shift[8];
    __shared__ unsigned char touched[ORACLE_MAX_CHUNKS];
    const unsigned i = blockIdx.x, hb = blockIdx.y, heads = a.heads, dim = a.dim, dc = a.chunks;
    const unsigned hbs = (heads + 7) / 8, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const unsigned short* q = reinterpret_cast<const unsigned short*>(queries) + (size_t)i * heads * dim;
    // A warp per head: its scale from its largest magnitude's exponent e (bf16 bits), s = 14 - e.
    for (unsigned u = warp; u < 8; u += ORACLE_THREADS / 32) {
        const unsigned h = hb * 8 + u;
        unsigned m = 0;
        if (h < heads)
            for (unsigned e = lane; e < dim; e += 32) m = max(m, (unsigned)(q[h * dim + e] & 0x7fffu));
        for (unsigned o = 16; o > 0; o /= 2) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
        const int biased = (int)(m >> 7);
        const int s = biased == 0 ? 0 : min(100, max(-100, 14 - (biased - 127)));
        if (lane == 0) {
            shift[u] = s;
            if (h < heads) inverse[(size_t)i * heads + h] = ldexpf(1.f, -s);
        }
    }
    for (unsigned c = tid; c < dc; c += ORACLE_THREADS) {
        unsigned any = 0;
        for (unsigned h = hb * 8; h < hb * 8 + 8 && h < heads; ++h)
            for (unsigned e = 0; e < 16; ++e) any |= q[h * dim + c * 16 + e] & 0x7fffu;  // +-0 is zero
        touched[c] = any != 0;
    }
    __syncthreads();
    if (tid == 0) {
        unsigned char* list = lists + ((size_t)i * hbs + hb) * (dc + 1);
        unsigned count = 0;
        for (unsigned c = 0; c < dc; ++c)
            if (touched[c]) list[1 + count++] = (unsigned char)c;
        list[0] = (unsigned char)count;
    }
    // A lane's B fragment of a chunk: head hb * 8 + lane / 4, dims 4t .. 4t + 3 of the chunk
    // (t = lane % 4) as the k slots 2t, 2t + 1 (b0) and 2t + 8, 2t + 9 (b1).
    for (unsigned x = tid; x < dc * 32; x += ORACLE_THREADS) {
        const unsigned c = x / 32, l = x % 32;
        if (!touched[c]) continue;
        const unsigned h = hb * 8 + l / 4, e = c * 16 + 4 * (l % 4);
        float v[4] = {0.f, 0.f, 0.f, 0.f};
        if (h < heads) {
            const float sc = ldexpf(1.f, shift[l / 4]);
            for (unsigned k = 0; k < 4; ++k) v[k] = __bfloat162float(queries[((size_t)i * heads + h) * dim + e + k]) * sc;
        }
        unsigned* f = fragments + ((((size_t)i * hbs + hb) * dc + c) * 32 + l) * 2;
        f[0] = oracle_f16x2(v[0], v[1]);
        f[1] = oracle_f16x2(v[2], v[3]);
    }
}

// Two e4m3 codes (the low 16 bits of `x`) as an f16 pair (exact: every e4m3 value is an f16).
__device__ __forceinline__ unsigned oracle_e4m3x2(unsigned x) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(x & 0xffffu), __NV_E4M3);
    return (unsigned)h.x | ((unsigned)h.y << 16);
}

__device__ __forceinline__ void oracle_mma(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                           unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

extern "C" __global__ void __launch_bounds__(ORACLE_THREADS) oracle_logits(
    const float* __restrict__ weights,          // [n, heads]
    const unsigned char* __restrict__ keys,     // pool_pages pages of page_tokens keys
    const unsigned* __restrict__ page_table,
    const IndexerReq* __restrict__ reqs,
    const OracleArgs a,
    const unsigned char* __restrict__ lists,    // [n, head blocks, chunks + 1]
    const unsigned* __restrict__ fragments,     // [n, head blocks, chunks, 32, 2]
    const float* __restrict__ inverse,          // [n, heads]
    float* __restrict__ logits,                 // [score positions, heads]
    float* __restrict__ partials,               // [n, tiles, heads, 2]: largest logit, sum below it
    unsigned* __restrict__ fault) {
    extern __shared__ __align__(16) unsigned char oracle_smem[];
    __shared__ unsigned char list_at[ORACLE_MAX_HEADS / 8 * (ORACLE_MAX_CHUNKS + 1)];
    const unsigned i = blockIdx.y, tile = blockIdx.x, t0 = tile * ORACLE_TILE;
    const IndexerReq r = reqs[i];
    if (t0 >= r.seq_len) return;
    const unsigned heads = a.heads, dim = a.dim, dc = a.chunks, hbs = (heads + 7) / 8, stride = a.tile_stride;
    const unsigned tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    unsigned char* rows = oracle_smem;  // [ORACLE_TILE, stride]; then the logits
    for (unsigned x = tid; x < hbs * (dc + 1); x += ORACLE_THREADS) list_at[x] = lists[(size_t)i * hbs * (dc + 1) + x];
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
    if (a.keep == 0) {
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
    } else {
        // Top-channel keys (`keep` places of every `group` values, their codes, the scale),
        // expanded into fp8 rows, a warp per row: the row's codes zeroed, then each kept code put
        // at its place (a place past its group raises `fault` and is not put), then the scale. A
        // missing row reads as zeros.
        const unsigned kept = dim / a.group * a.keep;
        for (unsigned row = warp; row < ORACLE_TILE; row += ORACLE_THREADS / 32) {
            const long long at = src_at[row];
            unsigned char* dst = rows + row * stride;
            for (unsigned w = lane; w < dim / 4 + 1; w += 32) reinterpret_cast<unsigned*>(dst)[w] = 0u;
            __syncwarp();
            if (at < 0) continue;
            const unsigned char* src = keys + at;
            for (unsigned j = lane; j < kept; j += 32) {
                const unsigned place = src[j];
                if (place < a.group)
                    dst[(j / a.keep) * a.group + place] = src[kept + j];
                else
                    atomicOr(fault, 1u);
            }
            if (lane < 4) dst[dim + lane] = src[2 * kept + lane];
        }
    }
    __syncthreads();
    // Warp w: rows (w % 4) * 16 .. + 16, head blocks w / 4, w / 4 + 2, ...; lane: row g (and
    // g + 8) of the 16, the four key bytes 4t .. 4t + 3 of each chunk.
    const unsigned g = lane / 4, t = lane % 4, rg = (warp % 4) * 16, set = warp / 4;
    const unsigned char* ra = rows + (rg + g) * stride + 4 * t;
    const unsigned char* rb = ra + 8 * stride;
    float acc[ORACLE_HEAD_BLOCKS][4];
#pragma unroll
    for (unsigned j = 0; j < ORACLE_HEAD_BLOCKS; ++j) {
        acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
        const unsigned hb = set + 2 * j;
        if (hb >= hbs) continue;
        const unsigned char* list = list_at + hb * (dc + 1);
        const uint2* frag = reinterpret_cast<const uint2*>(fragments) + ((size_t)i * hbs + hb) * dc * 32 + lane;
        const unsigned count = list[0];
#pragma unroll 4
        for (unsigned k = 0; k < count; ++k) {
            const unsigned c = list[1 + k];
            const unsigned x = *reinterpret_cast<const unsigned*>(ra + c * 16);
            const unsigned y = *reinterpret_cast<const unsigned*>(rb + c * 16);
            const uint2 b = frag[c * 32];
            oracle_mma(acc[j], oracle_e4m3x2(x), oracle_e4m3x2(y), oracle_e4m3x2(x >> 16), oracle_e4m3x2(y >> 16),
                       b.x, b.y);
        }
    }
    const float sa = *reinterpret_cast<const float*>(rows + (rg + g) * stride + dim);
    const float sb = *reinterpret_cast<const float*>(rows + (rg + g + 8) * stride + dim);
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
            const unsigned h = hb * 8 + 2 * t + x;
            if (h >= heads) continue;
            const float w = weights[(size_t)i * heads + h], inv = inverse[(size_t)i * heads + h];
            stage[(rg + g) * ss + h] = __fmul_rn(w, __fmul_rn(sa, __fmul_rn(acc[j][x], inv)));
            stage[(rg + g + 8) * ss + h] = __fmul_rn(w, __fmul_rn(sb, __fmul_rn(acc[j][2 + x], inv)));
        }
    }
    __syncthreads();
    const unsigned n = min(ORACLE_TILE, r.seq_len - t0);
    float* out = logits + ((size_t)r.score_offset + t0) * heads;
    for (unsigned x = tid; x < n * heads; x += ORACLE_THREADS) out[x] = stage[(x / heads) * ss + x % heads];
    // A warp per head: the tile's largest logit and the sum of exponentials below it.
    for (unsigned h = warp; h < heads; h += ORACLE_THREADS / 32) {
        float m = ORACLE_NEG_INF, s = 0.f;
        for (unsigned u = lane; u < n; u += 32) m = fmaxf(m, stage[u * ss + h]);
        for (unsigned o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        for (unsigned u = lane; u < n; u += 32) s += expf(stage[u * ss + h] - m);
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
    // A warp per 32 positions: a lane per head (and per head 32 further on) reads one position's
    // row of logits at a time (one coalesced load), the warp combines the heads' weights, and the
    // position's lane keeps the result; the warp writes its 32 scores at once.
    const unsigned i = blockIdx.y, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const IndexerReq r = reqs[i];
    const unsigned n = r.seq_len, heads = a.heads;
    const float* st = stats + (size_t)i * heads * 2;
    float m[ORACLE_MAX_HEADS / 32], inv[ORACLE_MAX_HEADS / 32];
#pragma unroll
    for (unsigned u = 0; u < ORACLE_MAX_HEADS / 32; ++u) {
        const unsigned h = lane + 32 * u;
        m[u] = h < heads ? st[2 * h] : 0.f;
        inv[u] = h < heads ? st[2 * h + 1] : 0.f;
    }
    const unsigned warps = gridDim.x * (ORACLE_THREADS / 32);
    for (unsigned base = (blockIdx.x * (ORACLE_THREADS / 32) + warp) * 32; base < n; base += warps * 32) {
        float mine = 0.f;
        const unsigned end = min(32u, n - base);
        for (unsigned p = 0; p < end; ++p) {
            const float* l = logits + ((size_t)r.score_offset + base + p) * heads;
            float o = a.combine_max ? 0.f : -0.f;
#pragma unroll
            for (unsigned u = 0; u < ORACLE_MAX_HEADS / 32; ++u) {
                const unsigned h = lane + 32 * u;
                if (h < heads) {
                    const float w = __fmul_rn(expf(l[h] - m[u]), inv[u]);
                    o = a.combine_max ? fmaxf(o, w) : __fadd_rn(o, w);
                }
            }
            for (unsigned s = 16; s > 0; s /= 2) {
                const float y = __shfl_xor_sync(0xffffffffu, o, s);
                o = a.combine_max ? fmaxf(o, y) : __fadd_rn(o, y);
            }
            if (lane == p) mine = o;
        }
        const unsigned t = base + lane;
        if (t < n) {
            const bool kept = t < a.sink || t + a.window >= n || (a.pin_newest && t + 1 == n);
            scores[r.score_offset + t] = kept ? ORACLE_INF : mine;
        }
    }
}
