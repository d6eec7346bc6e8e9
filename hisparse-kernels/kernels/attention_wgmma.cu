// Sparse MLA decode attention on Hopper's warpgroup MMA, compiled after attention.cu
// and wgmma_common.cu (their Span, AttnParams and helpers). A block of two warpgroups takes one
// request, 64 of its heads and one split of its selected rows, in tiles of 64 rows:
//   - bf16 rows: a tile's rows are gathered by location with cp.async straight into shared
//     memory in the 128-byte-swizzled K-major layout ([64][576], nine atoms of 64 dims), the
//     next tile's while this one is computed (two buffers);
//   - fp8 rows (FlashMLA's 656 B): gathered raw into a staging tile, the next one while this
//     one is computed, and dequantised (e4m3 * pow2 scale, exact in bf16) into the one K tile;
//   - warpgroup 0: S[64 heads][64 rows] = Q K^T, 36 m64n64k16 wgmmas with Q and K in shared
//     memory; online softmax in base 2 in its registers; P (bf16) and the per-head rescale
//     written to shared memory;
//   - both warpgroups: O[64][256 of the 512 value dims] = alpha O + P V, four m64n256k16 wgmmas
//     over the same K tile read MN-major (its first 512 dims are V), P from shared memory.
// One split writes out/lse directly; several write normalised partials for merge_splits (the
// same layout as sparse_mla_decode's). Rows past a selection's end are masked and zeroed.
// Given `fills` (one word per location: 0, or a host-tier or staging row plus one), a row whose
// word is set is gathered from there by the same cp.async (the misses the swap-in left to the
// attention, as sparse_mla_decode takes them), and with `write_back` written to its pool
// location once its tile has landed (by head group 0), so that outputs do not depend on where
// a row was read. With `skip_filled` (miss_fill = "hits-first": the attention over the hits,
// while the misses are still being copied) such a row is instead left out: not read, its score
// masked, its flag kept per tile in shared memory; `part_stride` then places this launch's
// partials among those of the launch over the misses, and merge_splits combines both.
// Descriptors: leading byte offset 8192 (between 64-dim atoms), stride 1024 (between 8-row
// groups) — the encodings tests/gpu_wgmma.rs holds to a plain product (WG_K_* and WG_MN_*).
//
// Invariant: rows of 1152 B (sparse_mla_decode_wgmma) or 656 B (_fp8), in the pool or named by
// their fill word (host_base/host_rows bound those rows); d_qk 576, d_v 512; 256 threads; WG_SMEM
// or WG_SMEM_FP8 bytes of dynamic shared memory, 1024-aligned.

// WG_TILE, WG_ATOM (one 64-dim atom of a 64-row operand), WG_RAW_FP8 (the fp8 staging tile),
// WG_SMEM and WG_SMEM_FP8: the generated prelude (src/cuda/facts.rs).
#define WG_OPERAND (9 * WG_ATOM)           // [64][576] bf16
// Shared memory: Q | K tiles | (fp8: raw tile) | P | alpha[64], l[64], m[64] | skip[2][64].
#define WG_P_OFF_OF(fp8) ((fp8) ? 2 * WG_OPERAND + WG_RAW_FP8 : 3 * WG_OPERAND)
// Descriptor offsets: K-major operands (Q, K, P) and the MN-major one (V), as
// tests/gpu_wgmma.rs's `layout` gives them for 64-row swizzled operands.
#define WG_K_LBO 8192
#define WG_K_SBO 1024
#define WG_MN_LBO 8192
#define WG_MN_SBO 1024

// Byte offset of 16-byte chunk c (8 values) of row o in a swizzled 64-row operand.
__device__ __forceinline__ unsigned wg_chunk(unsigned o, unsigned c) {
    return (c / 8) * WG_ATOM + (o / 8) * 1024 + (o % 8) * 128 + (((c % 8) ^ (o % 8)) * 16);
}

// Each thread gathers, converts and writes back the same two rows of every tile, rows
// tid / 8 and tid / 8 + 32, 16-byte chunks tid % 8, + 8, ...: their location and fill words are
// loaded once per tile, a tile ahead (`WgWords`), and checked into read addresses when the tile
// is fetched (`WgRows`), so that no copy waits on a dependent load.
struct WgWords {
    int loc[2];
    unsigned long long fill[2];  // 0: in the pool; else a host-tier or staging row plus one
};

struct WgRows {
    const unsigned char* src[2];  // null: zeros (past the tile's valid rows, or out of range)
    int loc[2];
    bool filled[2];               // read from a fill row (written back under `write_back`)
};

// The words of this thread's rows of the tile at `base` with `valid` rows.
__device__ __forceinline__ WgWords wg_words(const int* locs, const unsigned long long* fl, unsigned base,
                                            unsigned valid) {
    WgWords w;
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
        const unsigned r = threadIdx.x / 8 + 32 * h;
        w.loc[h] = r < valid ? locs[base + r] : -1;
        w.fill[h] = (fl != nullptr && r < valid) ? fl[base + r] : 0ull;
    }
    return w;
}

// Where this thread's rows are read: the fill row when the fill word is set, else the pool
// location; a valid row out of range (location or fill row) raises the fault and reads zeros.
// Given `skip` (the tile's 64 flags, under skip_filled), a row whose fill word is set is not
// read and its flag is raised (by the row's first thread); every other flag is cleared.
__device__ __forceinline__ WgRows wg_rows(const WgWords& w, const unsigned char* rows, unsigned valid,
                                          const AttnParams& p, unsigned rb, unsigned* fault,
                                          unsigned char* skip) {
    WgRows r;
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int loc = w.loc[h];
        const unsigned long long f = w.fill[h];
        const bool left_out = skip != nullptr && f != 0ull;
        if (skip != nullptr && threadIdx.x % 8 == 0) skip[threadIdx.x / 8 + 32 * h] = left_out;
        const bool bad = loc < 0 || (unsigned long long)loc >= p.pool_rows || (f != 0ull && f - 1ull >= p.host_rows);
        r.loc[h] = loc;
        r.filled[h] = f != 0ull && !left_out;
        if (threadIdx.x / 8 + 32 * h >= valid || left_out) {
            r.src[h] = nullptr;
        } else if (bad) {
            if (threadIdx.x % 8 == 0) atomicOr(fault, 1u);
            r.src[h] = nullptr;
        } else {
            r.src[h] = f != 0ull ? reinterpret_cast<const unsigned char*>(p.host_base) + (size_t)(f - 1ull) * rb
                                 : rows + (size_t)loc * rb;
        }
    }
    return r;
}

// Issues this thread's bf16 chunks of a tile into `kb` (cp.async; zeros where there is no row).
__device__ __forceinline__ void wg_fetch(unsigned char* kb, const WgRows& r) {
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
        const unsigned o = threadIdx.x / 8 + 32 * h;
        #pragma unroll
        for (unsigned j = 0; j < 9; ++j) {
            const unsigned c = threadIdx.x % 8 + 8 * j;
            unsigned char* dst = kb + wg_chunk(o, c);
            if (r.src[h] != nullptr) cp_async16(dst, r.src[h] + 16 * c);
            else *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
        }
    }
    asm volatile("cp.async.commit_group;\n" ::);
}

// Issues this thread's raw fp8 chunks of a tile into `raw` (row o at o * 656, 41 chunks; rows
// without a source are left alone: the conversion zeroes them).
__device__ __forceinline__ void wg_fetch_fp8(unsigned char* raw, const WgRows& r) {
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
        const unsigned o = threadIdx.x / 8 + 32 * h;
        if (r.src[h] == nullptr) continue;
        #pragma unroll
        for (unsigned j = 0; j < 6; ++j) {
            const unsigned c = threadIdx.x % 8 + 8 * j;
            if (c < ROW_FP8 / 16) cp_async16(raw + o * ROW_FP8 + 16 * c, r.src[h] + 16 * c);
        }
    }
    asm volatile("cp.async.commit_group;\n" ::);
}

// Dequantises this thread's chunks of the raw fp8 tile into the swizzled K tile (zeros where
// there is no row).
__device__ __forceinline__ void wg_convert_fp8(unsigned char* kb, const unsigned char* raw, const WgRows& r) {
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
        const unsigned o = threadIdx.x / 8 + 32 * h;
        const unsigned char* row = raw + o * ROW_FP8;
        #pragma unroll
        for (unsigned j = 0; j < 9; ++j) {
            const unsigned c = threadIdx.x % 8 + 8 * j;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (r.src[h] != nullptr)
                v = c < 64 ? dequant8(*reinterpret_cast<const uint2*>(row + 8 * c),
                                      *reinterpret_cast<const float*>(row + DV + 4 * (c / 16)))
                           : *reinterpret_cast<const uint4*>(row + FP8_ROPE_AT + 16 * (c - 64));
            *reinterpret_cast<uint4*>(kb + wg_chunk(o, c)) = v;
        }
    }
}

// Writes this thread's filled rows of the tile to their pool locations: chunk c of row o read
// from `tile` (the raw fp8 tile, or the swizzled bf16 K tile).
template <bool FP8>
__device__ __forceinline__ void wg_write_back(unsigned char* hot, const unsigned char* tile, const WgRows& r) {
    constexpr unsigned RB = FP8 ? ROW_FP8 : ROW_BF16, CH = RB / 16;
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
        if (r.src[h] == nullptr || !r.filled[h]) continue;
        const unsigned o = threadIdx.x / 8 + 32 * h;
        for (unsigned c = threadIdx.x % 8; c < CH; c += 8) {
            const uint4 v = *reinterpret_cast<const uint4*>(tile + (FP8 ? o * ROW_FP8 + 16 * c : wg_chunk(o, c)));
            __stcg(reinterpret_cast<uint4*>(hot + (size_t)r.loc[h] * RB) + c, v);
        }
    }
}

template <bool FP8>
__device__ __forceinline__ void wg_attention(const __nv_bfloat16* __restrict__ queries, unsigned char* rows,
                                             const int* __restrict__ locations,
                                             const unsigned long long* __restrict__ fills,
                                             const Span* __restrict__ sels, const AttnParams& p,
                                             float* __restrict__ out, float* __restrict__ lse,
                                             unsigned* __restrict__ fault) {
    extern __shared__ __align__(1024) unsigned char smem[];
    unsigned char* Qs = smem;
    unsigned char* raw = smem + 2 * WG_OPERAND;  // fp8 only
    const unsigned p_off = WG_P_OFF_OF(FP8);
    float* alpha_s = reinterpret_cast<float*>(smem + p_off + WG_ATOM);
    float* l_s = alpha_s + 64;
    float* m_s = l_s + 64;
    unsigned char* skip_s = reinterpret_cast<unsigned char*>(m_s + 64);  // [tile parity][64]
    const unsigned wg = threadIdx.x >> 7, lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3;
    const unsigned g = lane >> 2, tig = lane & 3;
    const unsigned split = blockIdx.x, group = blockIdx.y, i = blockIdx.z;
    const unsigned h0 = group * 64;
    const Span sel = sels[i];
    const unsigned len = (unsigned)sel.len;
    const unsigned per = ((len + p.splits - 1) / p.splits + WG_TILE - 1) / WG_TILE * WG_TILE;
    const unsigned first = min(len, split * per), end = min(len, first + per);
    const int* locs = locations + sel.offset;
    const unsigned tiles = (end - first + WG_TILE - 1) / WG_TILE;
    const unsigned long long* fl = fills ? fills + sel.offset : nullptr;
    unsigned char* hot = (fills && p.write_back && group == 0) ? rows : nullptr;

    constexpr unsigned RB = FP8 ? ROW_FP8 : ROW_BF16;
    // Rows of the tile being computed (cur) and of the next one (next, fetched during cur's
    // math), and the words of the one after (loaded a tile ahead of their use).
    WgRows cur = {}, next = {};
    WgWords ahead = {};
    if (tiles > 0) {
        const unsigned v0 = min(WG_TILE, end - first);
        next = wg_rows(wg_words(locs, fl, first, v0), rows, v0, p, RB, fault, p.skip_filled ? skip_s : nullptr);
        if (FP8) wg_fetch_fp8(raw, next);
        else wg_fetch(smem + WG_OPERAND, next);
        if (tiles > 1) ahead = wg_words(locs, fl, first + WG_TILE, min(WG_TILE, end - first - WG_TILE));
    }
    // Queries of the group, swizzled (zeros past the request's heads), by cp.async: all of a
    // thread's 18 chunks in flight at once (with one tile per split, at batch 1, their latency
    // is a block's), landed by the first tile's wait.
    for (unsigned e = threadIdx.x; e < 64 * (DQK / 8); e += 256) {
        const unsigned h = e / (DQK / 8), c = e % (DQK / 8);
        if (h0 + h < p.heads) cp_async16(Qs + wg_chunk(h, c), queries + ((size_t)i * p.heads + h0 + h) * DQK + 8 * c);
        else *reinterpret_cast<uint4*>(Qs + wg_chunk(h, c)) = make_uint4(0, 0, 0, 0);
    }
    asm volatile("cp.async.commit_group;\n" ::);

    float o[128];
    #pragma unroll
    for (int j = 0; j < 128; ++j) o[j] = 0.f;
    // Warpgroup 0's softmax state for its rows r0 = 16 w + g and r0 + 8 (partial row sums).
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
    const unsigned r0 = 16 * w + g;
    // Descriptors of Q, P and the first K buffer, built once: a k-step's is its byte offset / 16
    // on (the 14-bit address field does not overflow inside shared memory).
    const unsigned long long qd = wgmma_desc(Qs, WG_K_LBO, WG_K_SBO, 1);
    const unsigned long long kd0 = wgmma_desc(smem + WG_OPERAND, WG_K_LBO, WG_K_SBO, 1);
    const unsigned long long pd = wgmma_desc(smem + p_off, WG_K_LBO, WG_K_SBO, 1);
    const unsigned long long vd0 = wgmma_desc(smem + WG_OPERAND + 4 * wg * WG_ATOM, WG_MN_LBO, WG_MN_SBO, 1);

    for (unsigned t = 0; t < tiles; ++t) {
        unsigned char* Ks = smem + (1 + (FP8 ? 0 : (t & 1))) * WG_OPERAND;
        const unsigned long long kbuf = FP8 ? 0ull : (unsigned long long)((t & 1) * (WG_OPERAND / 16));
        const unsigned base = first + t * WG_TILE;
        const unsigned valid = min(WG_TILE, end - base);
        cur = next;
        asm volatile("cp.async.wait_all;\n" ::);
        if (FP8) {
            __syncthreads();  // raw tile t landed; K and P are free
            wg_convert_fp8(Ks, raw, cur);
            if (hot) wg_write_back<true>(hot, raw, cur);
        }
        fence_async_shared();
        __syncthreads();  // tile t (and Q) in place; the other buffer (raw for fp8) and P are free
        // bf16: tile t's buffer is next refetched after the next iteration's barrier.
        if (!FP8 && hot) wg_write_back<false>(hot, Ks, cur);
        if (t + 1 < tiles) {
            const unsigned nv = min(WG_TILE, end - base - WG_TILE);
            next = wg_rows(ahead, rows, nv, p, RB, fault, p.skip_filled ? skip_s + 64 * ((t + 1) & 1) : nullptr);
            if (FP8) wg_fetch_fp8(raw, next);
            else wg_fetch(smem + (1 + ((t + 1) & 1)) * WG_OPERAND, next);
            if (t + 2 < tiles) ahead = wg_words(locs, fl, base + 2 * WG_TILE, min(WG_TILE, end - base - 2 * WG_TILE));
        }
        if (wg == 0) {
            float s[32];
            wgmma_fence();
            #pragma unroll
            for (unsigned ks = 0; ks < DQK / 16; ++ks) {
                const unsigned off = (ks / 4) * WG_ATOM + (ks % 4) * 32;
                wgmma_ss(s, qd + off / 16, kd0 + kbuf + off / 16, ks > 0);
            }
            wgmma_commit();
            wgmma_wait_all();
            float mx[2] = {NEG_INF, NEG_INF};
            const unsigned char* sk = skip_s + 64 * (t & 1);
            #pragma unroll
            for (int j = 0; j < 8; ++j) {
                #pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const unsigned col = 8 * j + 2 * tig + (e & 1);
                    const bool in = col < valid && !(p.skip_filled && sk[col]);
                    s[4 * j + e] = in ? s[4 * j + e] * p.scale_log2 : NEG_INF;
                    mx[e >> 1] = fmaxf(mx[e >> 1], s[4 * j + e]);
                }
            }
            float alpha[2];
            #pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                mx[hf] = fmaxf(mx[hf], __shfl_xor_sync(0xffffffffu, mx[hf], 1));
                mx[hf] = fmaxf(mx[hf], __shfl_xor_sync(0xffffffffu, mx[hf], 2));
                const float mn = fmaxf(m[hf], mx[hf]);
                // m = -inf at first: 0; still -inf (every row so far left out): nothing to scale.
                alpha[hf] = mn == NEG_INF ? 1.f : exp2f(m[hf] - mn);
                m[hf] = mn;
                l[hf] *= alpha[hf];
            }
            unsigned char* Ps = smem + p_off;
            // A maximum still -inf has only masked scores under it: 0 for each (not NaN).
            const float mb0 = m[0] == NEG_INF ? 0.f : m[0], mb1 = m[1] == NEG_INF ? 0.f : m[1];
            #pragma unroll
            for (int j = 0; j < 8; ++j) {
                const float p0 = exp2f(s[4 * j] - mb0), p1 = exp2f(s[4 * j + 1] - mb0);
                const float p2 = exp2f(s[4 * j + 2] - mb1), p3 = exp2f(s[4 * j + 3] - mb1);
                l[0] += p0 + p1;
                l[1] += p2 + p3;
                // Element (head r, row c) of P, K-major over rows: chunk c / 8, value c % 8.
                const unsigned col = 8 * j + 2 * tig;
                *reinterpret_cast<unsigned*>(Ps + wg_chunk(r0, col / 8) + (col % 8) * 2) = pack_bf16(p0, p1);
                *reinterpret_cast<unsigned*>(Ps + wg_chunk(r0 + 8, col / 8) + (col % 8) * 2) = pack_bf16(p2, p3);
            }
            if (tig == 0) {
                alpha_s[r0] = alpha[0];
                alpha_s[r0 + 8] = alpha[1];
            }
            fence_async_shared();
        }
        __syncthreads();  // P and alpha written
        const float a0 = alpha_s[r0], a1 = alpha_s[r0 + 8];
        #pragma unroll
        for (int j = 0; j < 32; ++j) {
            o[4 * j] *= a0;
            o[4 * j + 1] *= a0;
            o[4 * j + 2] *= a1;
            o[4 * j + 3] *= a1;
        }
        wgmma_fence();
        #pragma unroll
        for (unsigned ks = 0; ks < 4; ++ks) {
            // P: K-major over rows, k-step ks at 32 B; V: MN-major, this warpgroup's four atoms,
            // k-step ks two 8-row groups on.
            wgmma_ss_t256(o, pd + 2 * ks, vd0 + kbuf + 128 * ks, 1);
        }
        wgmma_commit();
        wgmma_wait_all();
    }

    if (wg == 0) {
        #pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            l[hf] += __shfl_xor_sync(0xffffffffu, l[hf], 1);
            l[hf] += __shfl_xor_sync(0xffffffffu, l[hf], 2);
        }
        if (tig == 0) {
            l_s[r0] = l[0];
            l_s[r0 + 8] = l[1];
            m_s[r0] = m[0];
            m_s[r0 + 8] = m[1];
        }
    }
    __syncthreads();
    #pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        const unsigned row = r0 + 8 * hf, h = h0 + row;
        if (h >= p.heads) continue;
        const float sum = tiles > 0 ? l_s[row] : 0.f;
        const float inv = sum > 0.f ? 1.f / sum : 0.f;
        const float lse_v = sum > 0.f ? (m_s[row] + log2f(sum)) * 0.69314718055994530942f : NEG_INF;
        size_t ob, lb;
        if (p.part_stride != 0) {
            lb = ((size_t)i * p.heads + h) * p.part_stride + p.part_base + split;
            ob = lb * DV;
        } else if (p.splits == 1) {
            ob = ((size_t)i * p.heads + h) * DV;
            lb = (size_t)i * p.heads + h;
        } else {
            ob = (((size_t)i * p.heads + h) * p.splits + split) * DV;
            lb = ((size_t)i * p.heads + h) * p.splits + split;
        }
        #pragma unroll
        for (int j = 0; j < 32; ++j) {
            const unsigned col = 256 * wg + 8 * j + 2 * tig;
            *reinterpret_cast<float2*>(out + ob + col) = make_float2(o[4 * j + 2 * hf] * inv, o[4 * j + 2 * hf + 1] * inv);
        }
        if (wg == 0 && tig == 0) lse[lb] = lse_v;
    }
}

#define WG_PARAMS                                                                                    \
    const __nv_bfloat16 *__restrict__ queries, /* [n, heads, 576] */                                 \
        unsigned char *__restrict__ rows,      /* the pool (written only at filled locations) */     \
        const int *__restrict__ locations, const unsigned long long *__restrict__ fills, /* or null */ \
        const Span *__restrict__ sels, AttnParams p, float *__restrict__ out, float *__restrict__ lse, \
        unsigned *__restrict__ fault

extern "C" __global__ void __launch_bounds__(256, 1) sparse_mla_decode_wgmma(WG_PARAMS) {
    wg_attention<false>(queries, rows, locations, fills, sels, p, out, lse, fault);
}

extern "C" __global__ void __launch_bounds__(256, 1) sparse_mla_decode_wgmma_fp8(WG_PARAMS) {
    wg_attention<true>(queries, rows, locations, fills, sels, p, out, lse, fault);
}
