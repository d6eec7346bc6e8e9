// The lightning indexer on tensor cores: s_t = scale_t * sum_h w_h * relu(q_h . k~_t) for every
// position t of every request, k~_t the key's e4m3 values. Two forms of one body:
// - indexer_scores (exact queries): keys converted exactly to f16 (one instruction per pair),
//   q_h bf16 scaled by a power of two into f16 range, mma.sync.m16n8k16;
// - indexer_scores_fp8 (fp8 queries): each head's q_h scaled by 2^-e (the smallest power of two
//   that brings its largest magnitude to <= 448) and rounded to e4m3, w_h times 2^e; keys used
//   as stored, mma.sync.m16n8k32 e4m3 x e4m3 (the CPU twin quantises the same way:
//   hisparse_kernels::index_queries).
// Products are summed in fp32 by the MMA (the sum order differs from the CPU twin's, so scores
// agree within rounding, not bit for bit).
//
// Work split: a warp scores 32 positions at a time (two 16-row MMA tiles) for all heads; the
// block's warps stride over a request's 32-position chunks; gridDim.x blocks share a request.
// Keys (132 B: 128 e4m3 + f32 scale) are read a row per load instruction (coalesced 128 B) into
// a per-warp staging tile, transposed through shared memory into MMA fragments. The dot product
// is order-free, so dims are permuted: thread (g, tig) of the warp owns dims 32*tig..32*tig+31 of
// rows g and g+8, and k-step kk uses its dims 32*tig + 4*kk .. +3 — the same permutation is
// applied to the queries (stored in shared memory in fragment order, conflict-free). The fp8
// form's k-step kk (32 dims) takes words 8 tig + 2 kk and + 1 of rows g and g + 8 (dims
// 32 tig + 8 kk .. + 7) as they lie in the staging tile: no conversion at all.
//
// Invariant: index_dim is 128 and heads a multiple of 8 (the launcher checks).

#include <cuda_bf16.h>
#include <cuda_fp8.h>

// IndexerReq, the key row's KEY_BYTES and KEY_DIM, and the warpgroup-MMA form's WGI_TILE and
// WGI_STAGES: the generated prelude (src/cuda/facts.rs).

#define DIM KEY_DIM
#define KEY_WORDS (KEY_BYTES / 4)
#define WARPS 4

__device__ __forceinline__ unsigned f16x2_from_e4m3x2(unsigned short v) {
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)v, __NV_E4M3);  // exact
    return *reinterpret_cast<unsigned*>(&h);
}

__device__ __forceinline__ unsigned f16x2_from_scaled(__nv_bfloat16 a, __nv_bfloat16 b, float scale) {
    __half2 h = __floats2half2_rn(__bfloat162float(a) * scale, __bfloat162float(b) * scale);
    return *reinterpret_cast<unsigned*>(&h);
}

__device__ __forceinline__ void cp_async4(void* dst, const void* src, unsigned bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(bytes));
}

__device__ __forceinline__ void mma_e4m3(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The fp8 form's scale exponent of a head whose largest magnitude is amax (NaNs skipped by
// fmaxf): the smallest e with amax <= 448 * 2^e, within [-120, 120]; 0 for an all-zero head.
// ldexpf is exact. The CPU twin: index_queries::query_exponent.
__device__ __forceinline__ int fp8_query_exponent(float amax) {
    if (!(amax > 0.f)) return 0;
    if (isinf(amax)) return 120;
    int e = ilogbf(amax) - 8;
    if (ldexpf(amax, -e) > 448.f) e += 1;
    return max(-120, min(120, e));
}

// The exact form's exponent for the request's n queries at q (16-byte aligned; every thread of
// the WARPS-warp block calls it, amax_w WARPS floats of shared memory): e with the largest |q|
// times 2^e in [2^13, 2^14), 0 for all-zero queries. Scaling by 2^e is exact, and every bf16
// value keeps its bits in f16 (more mantissa) unless it is 2^-27 below the largest.
__device__ __forceinline__ int exact_query_exponent(const __nv_bfloat16* q, unsigned n, float* amax_w) {
    float amax = 0.f;
    // 16-byte loads: 8 values each.
    for (unsigned e = threadIdx.x; e < n / 8; e += blockDim.x) {
        uint4 v = reinterpret_cast<const uint4*>(q)[e];
        unsigned wv[4] = {v.x, v.y, v.z, v.w};
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            __nv_bfloat162 b = *reinterpret_cast<__nv_bfloat162*>(&wv[j]);
            float2 f = __bfloat1622float2(b);
            amax = fmaxf(amax, fmaxf(fabsf(f.x), fabsf(f.y)));
        }
    }
    #pragma unroll
    for (unsigned d = 16; d > 0; d >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, d));
    if ((threadIdx.x & 31) == 0) amax_w[threadIdx.x >> 5] = amax;
    __syncthreads();
    amax = fmaxf(fmaxf(amax_w[0], amax_w[1]), fmaxf(amax_w[2], amax_w[3]));
    return amax > 0.f ? max(-126, min(126, 13 - ilogbf(amax))) : 0;
}

// The fp8 form's quantisation of one head's 128 queries qh, by a whole warp: lane j's word holds
// the e4m3 codes of dims 4 j .. 4 j + 3 (byte k of dim 4 j + k), *ex the head's exponent
// (fp8_query_exponent of its largest magnitude; the codes are q * 2^-e).
__device__ __forceinline__ unsigned fp8_head_codes(const __nv_bfloat16* qh, unsigned lane, int* ex) {
    const uint2 v = reinterpret_cast<const uint2*>(qh)[lane];
    float2 f0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v.x));
    float2 f1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v.y));
    float amax = fmaxf(fmaxf(fabsf(f0.x), fabsf(f0.y)), fmaxf(fabsf(f1.x), fabsf(f1.y)));
    #pragma unroll
    for (unsigned d = 16; d > 0; d >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, d));
    *ex = fp8_query_exponent(amax);
    const float dn = ldexpf(1.f, -*ex);
    const float x[4] = {f0.x * dn, f0.y * dn, f1.x * dn, f1.y * dn};
    unsigned word = 0;
    #pragma unroll
    for (int j = 0; j < 4; ++j) word |= (unsigned)__nv_cvt_float_to_fp8(x[j], __NV_SATFINITE, __NV_E4M3) << (8 * j);
    return word;
}

__device__ __forceinline__ void mma_f16(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

#define INDEXER_PARAMS                                                                            \
    const __nv_bfloat16 *__restrict__ queries, /* [n, heads, 128] */                              \
        const float *__restrict__ weights,     /* [n, heads] */                                   \
        const unsigned char *__restrict__ keys, /* pool of 132 B rows */                          \
        const unsigned *__restrict__ page_table, const IndexerReq *__restrict__ reqs,             \
        float *__restrict__ scores, unsigned heads, unsigned page_tokens, unsigned pool_pages,    \
        unsigned pin_newest, unsigned *__restrict__ fault
#define INDEXER_ARGS queries, weights, keys, page_table, reqs, scores, heads, page_tokens, pool_pages, pin_newest, fault

// Grid (blocks_per_request, requests); WARPS warps per block. Dynamic shared memory:
// heads * QB B of query fragments (QB = 256, or 128 in the fixed-head fp8 forms), heads * 4 B of
// weights, WARPS * 2 * 32 * 33 words of staging. HT: head tiles (heads / 8) fixed at compile time
// (the tile loop fully unrolled), or 0 for any multiple of 8 (heads as given).
template <bool FP8, unsigned HT>
__device__ __forceinline__ void indexer_body(INDEXER_PARAMS) {
    extern __shared__ __align__(16) unsigned char smem[];
    constexpr unsigned QB = FP8 && HT ? 128 : 256;
    if (HT) heads = 8 * HT;
    uint2* qfrag = reinterpret_cast<uint2*>(smem);                        // [heads/8][8 or 4][32]
    float* w = reinterpret_cast<float*>(smem + heads * QB);              // [heads]
    unsigned* stage = reinterpret_cast<unsigned*>(smem + heads * (QB + 4));  // [WARPS][2][32][33]
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned g = lane >> 2, tig = lane & 3;
    const unsigned i = blockIdx.y;
    const IndexerReq r = reqs[i];

    const __nv_bfloat16* q = queries + (size_t)i * heads * DIM;
    __shared__ float amax_w[WARPS];
    float down = 1.f;
    if (!FP8) {
        // The queries go to f16 times 2^e (exact_query_exponent; rows of 128 bf16 are 256 B, so
        // 16-byte aligned), and scores are scaled back by 2^-e.
        const int ex = exact_query_exponent(q, heads * DIM, amax_w);
        const float up = ldexpf(1.f, ex);
        down = ldexpf(1.f, -ex);
        // Query fragments: entry (nt, kk, lane') holds q[8nt + g'][32 tig' + 4 kk .. +3].
        for (unsigned e = threadIdx.x; e < heads * 32; e += blockDim.x) {
            unsigned l2 = e & 31, kk = (e >> 5) & 7, nt = e >> 8;
            unsigned h = 8 * nt + (l2 >> 2), d = 32 * (l2 & 3) + 4 * kk;
            const __nv_bfloat16* src = q + (size_t)h * DIM + d;
            qfrag[e] = make_uint2(f16x2_from_scaled(src[0], src[1], up), f16x2_from_scaled(src[2], src[3], up));
        }
        for (unsigned h = threadIdx.x; h < heads; h += blockDim.x) w[h] = weights[(size_t)i * heads + h];
    } else {
        // A warp per head: lane j quantises dims 4j..4j+3 into word j of the head's 32, stored
        // in fragment order (entry (nt, kk, lane') of uint2s: words 8 tig' + 2 kk and + 1 of
        // head 8 nt + g'); lane 0 writes the head's weight times its scale.
        unsigned* qw = reinterpret_cast<unsigned*>(smem);
        for (unsigned h = warp; h < heads; h += WARPS) {
            int ex;
            const unsigned word = fp8_head_codes(q + (size_t)h * DIM, lane, &ex);
            const unsigned nt = h >> 3, g2 = h & 7, tig2 = lane >> 3, kk = (lane & 7) >> 1;
            qw[2 * ((nt * 4 + kk) * 32 + g2 * 4 + tig2) + (lane & 1)] = word;
            if (lane == 0) w[h] = weights[(size_t)i * heads + h] * ldexpf(1.f, ex);
        }
    }
    __syncthreads();

    // Two staging tiles per warp: the next chunk's rows are copied (cp.async, 4 B each, zero
    // filled past the end) while this one is computed.
    unsigned* st2 = stage + warp * 2 * 32 * KEY_WORDS;
    const unsigned chunks = (r.seq_len + 31) / 32;
    const unsigned stride = gridDim.x * WARPS;
    // Lane j's page of chunk c (past the end: pool_pages, read as no row): loaded one chunk ahead
    // of its copies and checked only there (row_of), so that nothing waits for the load between.
    auto lookup = [&](unsigned c) -> unsigned {
        const unsigned t = c * 32 + lane;
        return c >= chunks || t >= r.seq_len ? pool_pages : page_table[r.first_page + t / page_tokens];
    };
    // Lane j's row of chunk c on `page` (-1 past the end or on a bad page, which raises the fault).
    auto row_of = [&](unsigned c, unsigned page) -> long long {
        const unsigned t = c * 32 + lane;
        if (c >= chunks || t >= r.seq_len) return -1;
        if (page < pool_pages) return (long long)page * page_tokens + t % page_tokens;
        atomicOr(fault, 1u);
        return -1;
    };
    // With pages of a multiple of 32 positions a chunk's 32 rows are one contiguous 4224-byte
    // run (16-byte aligned): 16-byte copies, 8.25 per lane. Otherwise row by row, 4 bytes a lane.
    const bool contiguous = page_tokens % 32 == 0;
    auto issue = [&](long long row, unsigned buf) {
        unsigned* st = st2 + buf * 32 * KEY_WORDS;
        const long long r0 = __shfl_sync(0xffffffffu, row, 0);
        if (contiguous && r0 >= 0) {
            const unsigned char* src = keys + r0 * KEY_BYTES;
            for (unsigned i = lane; i < 32 * KEY_WORDS / 4; i += 32)
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(
                                 (unsigned)__cvta_generic_to_shared(st + 4 * i)),
                             "l"(src + 16 * i));
            asm volatile("cp.async.commit_group;\n" ::);
            return;
        }
        #pragma unroll 8
        for (unsigned j = 0; j < 32; ++j) {
            long long rj = __shfl_sync(0xffffffffu, row, j);
            const unsigned char* src = rj >= 0 ? keys + rj * KEY_BYTES + 4 * lane : keys;
            cp_async4(st + j * KEY_WORDS + lane, src, rj >= 0 ? 4u : 0u);
        }
        cp_async4(st + lane * KEY_WORDS + 32, row >= 0 ? keys + row * KEY_BYTES + KEY_DIM : keys, row >= 0 ? 4u : 0u);
        asm volatile("cp.async.commit_group;\n" ::);
    };
    unsigned c = blockIdx.x * WARPS + warp;
    if (c < chunks) issue(row_of(c, lookup(c)), 0);
    unsigned ahead = lookup(c + stride);
    for (unsigned buf = 0; c < chunks; c += stride, buf ^= 1) {
        if (c + stride < chunks) {
            issue(row_of(c + stride, ahead), buf ^ 1);
            ahead = lookup(c + 2 * stride);
            asm volatile("cp.async.wait_group 1;\n" ::);
        } else {
            asm volatile("cp.async.wait_group 0;\n" ::);
        }
        __syncwarp();
        const unsigned* st = st2 + buf * 32 * KEY_WORDS;
        float part[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
        // Adds head tile nt's weighted relu of both 16-row tiles' accumulators to part.
        auto add_heads = [&](unsigned nt, const float (*acc)[4]) {
            float w0 = w[8 * nt + 2 * tig], w1 = w[8 * nt + 2 * tig + 1];
            #pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
                part[mt][0] += w0 * fmaxf(acc[mt][0], 0.f) + w1 * fmaxf(acc[mt][1], 0.f);
                part[mt][1] += w0 * fmaxf(acc[mt][2], 0.f) + w1 * fmaxf(acc[mt][3], 0.f);
            }
        };
        if (FP8) {
            // A fragments of both 16-row tiles, the keys' bytes as they are.
            unsigned a[2][4][4];
            #pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
                #pragma unroll
                for (int kk = 0; kk < 4; ++kk) {
                    const unsigned* lo = st + (16 * mt + g) * KEY_WORDS + 8 * tig + 2 * kk;
                    const unsigned* hi = lo + 8 * KEY_WORDS;
                    a[mt][kk][0] = lo[0];
                    a[mt][kk][1] = hi[0];
                    a[mt][kk][2] = lo[1];
                    a[mt][kk][3] = hi[1];
                }
            }
            auto head_tile = [&](unsigned nt) {
                float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
                #pragma unroll
                for (int kk = 0; kk < 4; ++kk) {
                    uint2 b = qfrag[(nt * 4 + kk) * 32 + lane];
                    mma_e4m3(acc[0], a[0][kk], b.x, b.y);
                    mma_e4m3(acc[1], a[1][kk], b.x, b.y);
                }
                add_heads(nt, acc);
            };
            if (HT) {
                #pragma unroll
                for (unsigned nt = 0; nt < HT; ++nt) head_tile(nt);
            } else {
                #pragma unroll 2
                for (unsigned nt = 0; nt < heads / 8; ++nt) head_tile(nt);
            }
        } else {
            // A fragments of both 16-row tiles.
            unsigned a[2][8][4];
            #pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
                #pragma unroll
                for (int kk = 0; kk < 8; ++kk) {
                    unsigned lo = st[(16 * mt + g) * KEY_WORDS + 8 * tig + kk];
                    unsigned hi = st[(16 * mt + g + 8) * KEY_WORDS + 8 * tig + kk];
                    a[mt][kk][0] = f16x2_from_e4m3x2((unsigned short)(lo & 0xffff));
                    a[mt][kk][1] = f16x2_from_e4m3x2((unsigned short)(hi & 0xffff));
                    a[mt][kk][2] = f16x2_from_e4m3x2((unsigned short)(lo >> 16));
                    a[mt][kk][3] = f16x2_from_e4m3x2((unsigned short)(hi >> 16));
                }
            }
            #pragma unroll 2
            for (unsigned nt = 0; nt < heads / 8; ++nt) {
                float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
                #pragma unroll
                for (int kk = 0; kk < 8; ++kk) {
                    uint2 b = qfrag[(nt * 8 + kk) * 32 + lane];
                    mma_f16(acc[0], a[0][kk], b.x, b.y);
                    mma_f16(acc[1], a[1][kk], b.x, b.y);
                }
                add_heads(nt, acc);
            }
        }
        #pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
            #pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                float v = part[mt][hf];
                v += __shfl_xor_sync(0xffffffffu, v, 1);
                v += __shfl_xor_sync(0xffffffffu, v, 2);
                unsigned rr = 16 * mt + 8 * hf + g;
                unsigned pos = c * 32 + rr;
                if (tig == 0 && pos < r.seq_len) {
                    float scale = __uint_as_float(st[rr * KEY_WORDS + 32]) * down;
                    scores[r.score_offset + pos] = pin_newest && pos + 1 == r.seq_len ? __int_as_float(0x7f800000) : scale * v;
                }
            }
        }
        __syncwarp();
    }
}

extern "C" __global__ void __launch_bounds__(WARPS * 32, 4) indexer_scores(INDEXER_PARAMS) {
    indexer_body<false, 0>(INDEXER_ARGS);
}

extern "C" __global__ void __launch_bounds__(WARPS * 32, 4) indexer_scores_fp8(INDEXER_PARAMS) {
    indexer_body<true, 0>(INDEXER_ARGS);
}

// The fp8 form for 32 and 64 heads: the head tiles unrolled, query fragments in 128 B a head, so
// that five blocks fit an SM (42 KB of shared memory a block at 64 heads, at most 102 registers a
// thread). Used for 32 heads by default (FixedHeadIndexer::Auto); CudaBackend::with_indexer_fixed_heads
// chooses.
extern "C" __global__ void __launch_bounds__(WARPS * 32, 5) indexer_scores_fp8_h32(INDEXER_PARAMS) {
    indexer_body<true, 4>(INDEXER_ARGS);
}

extern "C" __global__ void __launch_bounds__(WARPS * 32, 5) indexer_scores_fp8_h64(INDEXER_PARAMS) {
    indexer_body<true, 8>(INDEXER_ARGS);
}
