// Sparse MLA decode attention on tensor cores (mma.sync.m16n8k16, bf16 in, fp32 accumulate),
// flash-decoding style. A block of 8 warps takes one request, 64 of its heads and one split of its
// selected rows; it walks the split in tiles of 32 rows:
//   - the tile's rows are gathered by location (cp.async, one tile ahead) and dequantized into
//     shared memory as bf16 [32][576] (fp8: e4m3 * pow2 scale, exact in bf16; bf16: copied);
//   - S = Q K^T: warp w computes heads 16*(w%4).. x all 32 rows over dims 288*(w/4)..+287 (four
//     independent MMA chains); the two halves are added through shared memory, so both warps
//     of a head tile hold the same S;
//   - online softmax in base 2, each warp for its 16 heads (no further exchange), with the
//     running maximum raised lazily (only when scores exceed it by 2^8);
//   - O += P V: warp w owns heads 16*(w%4).. x value dims 256*(w/4).., P rounded to bf16.
// One split writes out/lse directly; several write normalised partials that `merge_splits`
// combines by their LSE. Rows past a selection's end are masked.
//
// Given `fills` (one word per location: 0, or a host-tier row plus one), the kernel also brings
// in the misses the swap-in left to it: such a row is gathered straight from the mapped host tier
// (zero-copy, by the same cp.async as the others, so the host reads of one tile overlap the math
// of the one before), and written from shared memory to its hot-buffer location for the steps
// after (by head group 0) unless `write_back` is 0 (miss_fill = "deferred": the swap-in copies
// them later, off the critical path). The rows and their order are those of the copy-then-attend
// path, so the output is bit-identical to it.
//
// Invariant: d_latent is 512 and d_rope 64 (d_qk 576), rows 16-byte aligned (the launcher checks).

#include <cuda_bf16.h>
#include <cuda_fp8.h>

// Span and AttnParams, and HB, TILE, THREADS, LDS, LDP, LDX, RAW_BYTES, the row's DQK, DV,
// ROW_BF16, ROW_FP8 and FP8_ROPE_AT: the generated prelude (hisparse-kernels/src/cuda/facts.rs).

#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void ldsm_x4(unsigned* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldsm_x4_t(unsigned* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

__device__ __forceinline__ void mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src));
}

__device__ __forceinline__ unsigned pack_bf16(float a, float b) {
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<unsigned*>(&v);
}

// Copies the locations of tile `t` of the split into `tl` (32 entries; threads 0..31), and its
// fill words into `tf` where there are any.
__device__ void fetch_locs(int* tl, unsigned long long* tf, const int* locs, const unsigned long long* fills,
                           unsigned first, unsigned end, unsigned t) {
    unsigned idx = first + t * TILE + threadIdx.x;
    if (threadIdx.x < TILE && idx < end) {
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(tl + threadIdx.x)), "l"(locs + idx));
        if (fills)
            asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(smem_addr(tf + threadIdx.x)),
                         "l"(fills + idx));
    }
}

// Row `r`'s fill word in a tile: its host-tier row plus one, 0 when it is in the hot buffer.
__device__ __forceinline__ unsigned long long fill_of(const unsigned long long* tf, bool filling, unsigned r) {
    return filling ? tf[r] : 0ull;
}

// Issues the copies of tile `t`'s rows (locations in `tl`, `valid` of them) into `raw`: warp w
// copies rows w, w+8, ..., 16 bytes per lane.
__device__ void fetch_tile(unsigned char* raw, const unsigned char* rows, const int* tl, const unsigned long long* tf,
                           bool filling, unsigned valid, const AttnParams& p, unsigned* fault) {
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5, chunks = p.row_bytes / 16;
    for (unsigned r = warp; r < valid; r += THREADS / 32) {
        int loc = tl[r];
        const unsigned long long f = fill_of(tf, filling, r);
        if (loc < 0 || (unsigned long long)loc >= p.pool_rows || (f != 0ull && f - 1ull >= p.host_rows)) {
            if (lane == 0) atomicOr(fault, 1u);
            continue;
        }
        const unsigned char* src = f != 0ull
            ? reinterpret_cast<const unsigned char*>(p.host_base) + (size_t)(f - 1ull) * p.row_bytes
            : rows + (size_t)loc * p.row_bytes;
        unsigned char* dst = raw + r * p.row_bytes;
        for (unsigned c = lane; c < chunks; c += 32) cp_async16(dst + 16 * c, src + 16 * c);
    }
}

// 8 e4m3 codes times a power-of-two scale, as 8 bf16 (exact).
__device__ __forceinline__ uint4 dequant8(uint2 codes, float s) {
    unsigned cw[2] = {codes.x, codes.y};
    unsigned o[4];
    #pragma unroll
    for (int j = 0; j < 2; ++j) {
        __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(cw[j] & 0xffff), __NV_E4M3);
        __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(cw[j] >> 16), __NV_E4M3);
        float2 a = __half22float2(*reinterpret_cast<__half2*>(&lo));
        float2 b = __half22float2(*reinterpret_cast<__half2*>(&hi));
        o[2 * j] = pack_bf16(a.x * s, a.y * s);
        o[2 * j + 1] = pack_bf16(b.x * s, b.y * s);
    }
    return make_uint4(o[0], o[1], o[2], o[3]);
}

// Dequantizes the fetched tile into K ([TILE][LDS] bf16); rows past `valid` (or with a bad
// location or fill) become zeros. Warp w converts rows w, w+8, ...: 72 chunks of 8 values per
// row; a filled row is first written back to its hot-buffer location (`hot`, when non-null).
__device__ void convert_tile(__nv_bfloat16* K, const unsigned char* raw, unsigned valid, const AttnParams& p,
                             const int* tl, const unsigned long long* tf, bool filling, unsigned char* hot) {
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (unsigned r = warp; r < TILE; r += THREADS / 32) {
        const int loc = r < valid ? tl[r] : -1;
        const unsigned long long f = r < valid ? fill_of(tf, filling, r) : 0ull;
        const bool ok = loc >= 0 && (unsigned long long)loc < p.pool_rows && (f == 0ull || f - 1ull < p.host_rows);
        const unsigned char* row = raw + r * p.row_bytes;
        if (ok && f != 0ull && hot) {
            uint4* dst = reinterpret_cast<uint4*>(hot + (size_t)loc * p.row_bytes);
            for (unsigned c = lane; c < p.row_bytes / 16; c += 32) __stcg(dst + c, reinterpret_cast<const uint4*>(row)[c]);
        }
        __nv_bfloat16* dst = K + r * LDS;
        #pragma unroll
        for (unsigned i = 0; i < 3; ++i) {
            const unsigned c = lane + 32 * i;
            if (c >= DQK / 8) break;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (ok) {
                if (!p.fp8) v = *reinterpret_cast<const uint4*>(row + 16 * c);
                else if (c >= 64) v = *reinterpret_cast<const uint4*>(row + FP8_ROPE_AT + 16 * (c - 64));
                else v = dequant8(*reinterpret_cast<const uint2*>(row + 8 * c),
                                  *reinterpret_cast<const float*>(row + DV + 4 * (c / 16)));
            }
            *reinterpret_cast<uint4*>(dst + 8 * c) = v;
        }
    }
}

// Grid (splits, head groups, requests); THREADS threads; dynamic shared memory: see the layout.
extern "C" __global__ void __launch_bounds__(THREADS, 1) sparse_mla_decode(
    const __nv_bfloat16* __restrict__ queries,  // [n, heads, 576]
    unsigned char* __restrict__ rows,           // written only at filled locations
    const int* __restrict__ locations,
    const unsigned long long* __restrict__ fills,  // null: every row is in `rows`
    const Span* __restrict__ sels,
    AttnParams p,
    float* __restrict__ out,       // splits == 1: [n, heads, 512]; else partials [n, heads, splits, 512]
    float* __restrict__ lse,       // splits == 1: [n, heads];      else partials [n, heads, splits]
    unsigned* __restrict__ fault) {
    extern __shared__ __align__(16) unsigned char smem[];
    __nv_bfloat16* Q = reinterpret_cast<__nv_bfloat16*>(smem);              // [HB][LDS]
    __nv_bfloat16* K = Q + HB * LDS;                                        // [TILE][LDS]
    __nv_bfloat16* P = K + TILE * LDS;                                      // [HB][LDP]
    float* SX = reinterpret_cast<float*>(P + HB * LDP);                     // [2][HB][LDX] partial S
    int* TL = reinterpret_cast<int*>(SX + 2 * HB * LDX);                      // [2][TILE] locations
    unsigned long long* TF = reinterpret_cast<unsigned long long*>(TL + 2 * TILE);  // [2][TILE] fills
    unsigned char* raw = reinterpret_cast<unsigned char*>(TF + 2 * TILE);      // [RAW_BYTES]

    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned g = lane >> 2, tig = lane & 3;
    const unsigned hg = warp & 3, kh = warp >> 2;  // head tile; dim half (S) and value half (O)
    const unsigned split = blockIdx.x, group = blockIdx.y, i = blockIdx.z;
    const unsigned h0 = group * HB;
    const Span sel = sels[i];
    const unsigned len = (unsigned)sel.len;
    const unsigned per = ((len + p.splits - 1) / p.splits + TILE - 1) / TILE * TILE;
    const unsigned first = min(len, split * per), end = min(len, first + per);
    const int* locs = locations + sel.offset;
    const unsigned long long* fl = fills ? fills + sel.offset : nullptr;
    const bool filling = fills != nullptr;
    unsigned char* hot = (filling && p.write_back && group == 0) ? rows : nullptr;
    const unsigned tiles = (end - first + TILE - 1) / TILE;

    // Locations run one tile ahead of rows: tile t's rows are fetched from the locations that
    // landed with tile t-1's rows (TL[t & 1]).
    if (tiles > 0) {
        fetch_locs(TL, TF, locs, fl, first, end, 0);
        asm volatile("cp.async.commit_group;\n" ::);
        asm volatile("cp.async.wait_all;\n" ::);
        __syncthreads();
        if (tiles > 1) fetch_locs(TL + TILE, TF + TILE, locs, fl, first, end, 1);
        fetch_tile(raw, rows, TL, TF, filling, min(TILE, end - first), p, fault);
        asm volatile("cp.async.commit_group;\n" ::);
    }
    // Queries of the group (zeros past the request's heads).
    for (unsigned e = threadIdx.x; e < HB * (DQK / 8); e += THREADS) {
        unsigned h = e / (DQK / 8), c = e % (DQK / 8);
        uint4 v = make_uint4(0, 0, 0, 0);
        if (h0 + h < p.heads)
            v = *reinterpret_cast<const uint4*>(queries + ((size_t)i * p.heads + h0 + h) * DQK + 8 * c);
        *reinterpret_cast<uint4*>(Q + h * LDS + 8 * c) = v;
    }

    float o[32][4];
    #pragma unroll
    for (int j = 0; j < 32; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};

    for (unsigned t = 0; t < tiles; ++t) {
        asm volatile("cp.async.wait_all;\n" ::);
        __syncthreads();  // the raw tile has landed; K, P and SX are free
        const unsigned base = first + t * TILE;
        const unsigned valid = min(TILE, end - base);
        convert_tile(K, raw, valid, p, TL + (t & 1) * TILE, TF + (t & 1) * TILE, filling, hot);
        __syncthreads();
        if (t + 1 < tiles) {
            if (t + 2 < tiles) fetch_locs(TL + (t & 1) * TILE, TF + (t & 1) * TILE, locs, fl, first, end, t + 2);
            fetch_tile(raw, rows, TL + ((t + 1) & 1) * TILE, TF + ((t + 1) & 1) * TILE, filling,
                       min(TILE, end - base - TILE), p, fault);
            asm volatile("cp.async.commit_group;\n" ::);
        }

        // Partial S = Q K^T for heads 16hg.. x all 32 rows over dims 288kh..288kh+287: four
        // independent accumulator chains of 18 k-steps.
        float s[4][4];
        #pragma unroll
        for (int j = 0; j < 4; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
        const __nv_bfloat16* qa = Q + (16 * hg + (lane & 15)) * LDS + 8 * (lane >> 4) + 288 * kh;
        const __nv_bfloat16* kb = K + ((lane & 7) + 8 * (lane >> 4)) * LDS + 8 * ((lane >> 3) & 1) + 288 * kh;
        #pragma unroll 3
        for (int kk = 0; kk < 18; ++kk) {
            unsigned a[4], b0[4], b1[4];
            ldsm_x4(a, qa + 16 * kk);
            ldsm_x4(b0, kb + 16 * kk);
            ldsm_x4(b1, kb + 16 * LDS + 16 * kk);
            mma(s[0], a, b0[0], b0[1]);
            mma(s[1], a, b0[2], b0[3]);
            mma(s[2], a, b1[0], b1[1]);
            mma(s[3], a, b1[2], b1[3]);
        }
        // Exchange halves: both warps of a head tile then hold the same full S (a + b == b + a).
        float* mine = SX + (kh * HB + 16 * hg) * LDX;
        float* other = SX + ((1 - kh) * HB + 16 * hg) * LDX;
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            *reinterpret_cast<float2*>(mine + g * LDX + 8 * j + 2 * tig) = make_float2(s[j][0], s[j][1]);
            *reinterpret_cast<float2*>(mine + (g + 8) * LDX + 8 * j + 2 * tig) = make_float2(s[j][2], s[j][3]);
        }
        __syncthreads();
        float mx[2] = {NEG_INF, NEG_INF};
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            float2 u = *reinterpret_cast<const float2*>(other + g * LDX + 8 * j + 2 * tig);
            float2 v = *reinterpret_cast<const float2*>(other + (g + 8) * LDX + 8 * j + 2 * tig);
            s[j][0] += u.x;
            s[j][1] += u.y;
            s[j][2] += v.x;
            s[j][3] += v.y;
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                unsigned key = 8 * j + 2 * tig + (e & 1);
                s[j][e] = key < valid ? s[j][e] * p.scale_log2 : NEG_INF;
                mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
            }
        }
        // Lazy rescaling: the running maximum moves only when a row's new scores exceed it by
        // more than 2^8 (P then stays below 256), so most tiles skip rescaling O. The decision
        // is per warp, and both warps of a head tile hold the same S, so they agree.
        float alpha[2] = {1.f, 1.f};
        #pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            mx[hf] = fmaxf(mx[hf], __shfl_xor_sync(0xffffffffu, mx[hf], 1));
            mx[hf] = fmaxf(mx[hf], __shfl_xor_sync(0xffffffffu, mx[hf], 2));
        }
        const bool grow = __any_sync(0xffffffffu, mx[0] > m[0] + 8.f || mx[1] > m[1] + 8.f);
        if (grow) {
            #pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                float mn = fmaxf(m[hf], mx[hf]);
                alpha[hf] = exp2f(m[hf] - mn);  // m = -inf at first: 0
                m[hf] = mn;
                l[hf] *= alpha[hf];
            }
        }
        // P = 2^(s - m): full row sums here; this warp writes its half of the rows to P.
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            float p0 = exp2f(s[j][0] - m[0]), p1 = exp2f(s[j][1] - m[0]);
            float p2 = exp2f(s[j][2] - m[1]), p3 = exp2f(s[j][3] - m[1]);
            l[0] += p0 + p1;
            l[1] += p2 + p3;
            if ((unsigned)(j >> 1) == kh) {
                unsigned col = 8 * j + 2 * tig;
                *reinterpret_cast<unsigned*>(P + (16 * hg + g) * LDP + col) = pack_bf16(p0, p1);
                *reinterpret_cast<unsigned*>(P + (16 * hg + g + 8) * LDP + col) = pack_bf16(p2, p3);
            }
        }
        __syncthreads();
        // O = alpha O + P V over value dims 256kh..
        if (grow) {
            #pragma unroll
            for (int j = 0; j < 32; ++j) {
                o[j][0] *= alpha[0];
                o[j][1] *= alpha[0];
                o[j][2] *= alpha[1];
                o[j][3] *= alpha[1];
            }
        }
        const __nv_bfloat16* pa = P + (16 * hg + (lane & 15)) * LDP + 8 * (lane >> 4);
        const __nv_bfloat16* vb = K + ((lane & 7) + 8 * ((lane >> 3) & 1)) * LDS + 256 * kh + 8 * (lane >> 4);
        #pragma unroll
        for (int kk = 0; kk < TILE / 16; ++kk) {
            unsigned a[4];
            ldsm_x4(a, pa + 16 * kk);
            #pragma unroll
            for (int j = 0; j < 16; ++j) {
                unsigned b[4];
                ldsm_x4_t(b, vb + 16 * kk * LDS + 16 * j);
                mma(o[2 * j], a, b[0], b[1]);
                mma(o[2 * j + 1], a, b[2], b[3]);
            }
        }
    }

    #pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        l[hf] += __shfl_xor_sync(0xffffffffu, l[hf], 1);
        l[hf] += __shfl_xor_sync(0xffffffffu, l[hf], 2);
    }
    #pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        unsigned row = 16 * hg + 8 * hf + g;
        unsigned h = h0 + row;
        if (h >= p.heads) continue;
        float sum = l[hf];
        float inv = sum > 0.f ? 1.f / sum : 0.f;
        float lse_v = sum > 0.f ? (m[hf] + log2f(sum)) * 0.69314718055994530942f : NEG_INF;
        size_t ob, lb;
        if (p.splits == 1) {
            ob = ((size_t)i * p.heads + h) * DV;
            lb = (size_t)i * p.heads + h;
        } else {
            ob = (((size_t)i * p.heads + h) * p.splits + split) * DV;
            lb = ((size_t)i * p.heads + h) * p.splits + split;
        }
        #pragma unroll
        for (int j = 0; j < 32; ++j) {
            unsigned col = 256 * kh + 8 * j + 2 * tig;
            float2 v = make_float2(o[j][2 * hf] * inv, o[j][2 * hf + 1] * inv);
            *reinterpret_cast<float2*>(out + ob + col) = v;
        }
        if (kh == 0 && tig == 0) lse[lb] = lse_v;
    }
}

// Combines the splits of each (request, head): weights 2^(lse_s - max) normalised. Grid
// (n * heads); 128 threads, each 4 of the 512 value dims.
extern "C" __global__ void merge_splits(const float* __restrict__ part_out, const float* __restrict__ part_lse,
                                        unsigned splits, float* __restrict__ out, float* __restrict__ lse) {
    const size_t rh = blockIdx.x;
    const float* pl = part_lse + rh * splits;
    float mx = NEG_INF;
    for (unsigned s = 0; s < splits; ++s) mx = fmaxf(mx, pl[s]);
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    float total = 0.f;
    if (mx != NEG_INF) {
        for (unsigned s = 0; s < splits; ++s) {
            float w = __expf(pl[s] - mx);
            total += w;
            float4 v = reinterpret_cast<const float4*>(part_out + (rh * splits + s) * DV)[threadIdx.x];
            acc.x += w * v.x;
            acc.y += w * v.y;
            acc.z += w * v.z;
            acc.w += w * v.w;
        }
        float inv = 1.f / total;
        acc = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
    }
    reinterpret_cast<float4*>(out + rh * DV)[threadIdx.x] = acc;
    if (threadIdx.x == 0) lse[rh] = mx == NEG_INF ? NEG_INF : mx + logf(total);
}
