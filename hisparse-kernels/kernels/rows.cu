// Small kernels of the decode step: `fill_unit_bf16` generates an emulated model's data where it
// is used (the unit stream of hisparse_kernels::unit_stream, bit for bit: integer mixing, then
// one rounded multiply and one rounded subtract); `fill_new_rows` encodes an emulated model's new
// KV rows and index keys from that stream (bit for bit hisparse_kernels::new_rows); `write_rows`
// scatters a batch of new rows (KV rows, index keys) to their pool rows in one launch, a warp per
// row, 4 bytes per lane (rows are multiples of 4 bytes: 132 B keys, 656/1152 B KV rows);
// `locate_rows` maps selected positions to pool rows through each request's page table (the
// resident mode), flagging positions past a request's pages instead of reading there.

#include <cuda_bf16.h>

// LocateReq: the generated prelude (src/cuda/facts.rs).

// Row i of `src` (`row_words` words) goes to row `idx[i]` of the pool.
extern "C" __global__ void write_rows(const unsigned* __restrict__ idx, const unsigned* __restrict__ src,
                                      unsigned n, unsigned row_words, unsigned long long pool_rows,
                                      unsigned* __restrict__ pool, unsigned* __restrict__ fault) {
    const unsigned lane = threadIdx.x & 31;
    const unsigned warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const unsigned warps = (gridDim.x * blockDim.x) >> 5;
    for (unsigned i = warp; i < n; i += warps) {
        unsigned r = idx[i];
        if (r >= pool_rows) {
            if (lane == 0) atomicOr(fault, 1u);
            continue;
        }
        for (unsigned c = lane; c < row_words; c += 32)
            pool[(unsigned long long)r * row_words + c] = src[(unsigned long long)i * row_words + c];
    }
}

extern "C" __global__ void locate_rows(const int* __restrict__ sel, const LocateReq* __restrict__ reqs,
                                       const unsigned* __restrict__ table, unsigned page_tokens,
                                       int* __restrict__ out, unsigned* __restrict__ fault) {
    const LocateReq r = reqs[blockIdx.x];
    for (unsigned long long j = threadIdx.x; j < r.sel_len; j += blockDim.x) {
        int x = sel[r.sel_offset + j];
        unsigned long long page = x < 0 ? ~0ull : (unsigned long long)x / page_tokens;
        if (page >= r.pages) {
            atomicOr(fault, 1u);
            out[r.sel_offset + j] = 0;
            continue;
        }
        out[r.sel_offset + j] = (int)(table[r.first_page + page] * page_tokens + (unsigned)x % page_tokens);
    }
}

__device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

extern "C" __global__ void fill_unit_bf16(const unsigned long long* __restrict__ seeds, unsigned segments,
                                          unsigned len, float step, float half_width,
                                          __nv_bfloat16* __restrict__ out) {
    const unsigned pairs = (len + 1) / 2;
    const unsigned long long total = (unsigned long long)segments * pairs;
    for (unsigned long long idx = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned seg = (unsigned)(idx / pairs), p = (unsigned)(idx % pairs);
        unsigned long long r = mix64(seeds[seg] + (unsigned long long)(p + 1) * 0x9e3779b97f4a7c15ull);
        #pragma unroll
        for (unsigned i = 0; i < 2; ++i) {
            unsigned e = 2 * p + i;
            if (e < len) {
                float bits = (float)(unsigned)((r >> (32 * i)) & 0xffffffull);
                out[(unsigned long long)seg * len + e] = __float2bfloat16_rn(__fsub_rn(__fmul_rn(bits, step), half_width));
            }
        }
    }
}

// Element `e` of the unit stream seeded `seed` (hisparse_kernels::unit_stream::fill_unit).
__device__ __forceinline__ float unit_at(unsigned long long seed, unsigned e, float step, float half_width) {
    unsigned long long r = mix64(seed + (unsigned long long)(e / 2 + 1) * 0x9e3779b97f4a7c15ull);
    float bits = (float)(unsigned)((r >> (32 * (e & 1))) & 0xffffffull);
    return __fsub_rn(__fmul_rn(bits, step), half_width);
}

// hisparse_memory::fp8::encode_e4m3, bit for bit.
__device__ __forceinline__ unsigned char encode_e4m3(float x) {
    unsigned bits = __float_as_uint(x);
    unsigned char sign = (unsigned char)((bits >> 24) & 0x80);
    unsigned a = bits & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7f;
    if (a >= 0x43e00000u) return sign | 0x7e;
    if (a < 0x3c800000u) {
        float m = __fmul_rn(__uint_as_float(a), 512.0f);
        float q = __fsub_rn(__fadd_rn(m, 8388608.0f), 8388608.0f);
        return sign | (unsigned char)q;
    }
    unsigned r = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20;
    unsigned code = r - (120u << 3);
    return sign | (unsigned char)(code < 0x7eu ? code : 0x7eu);
}

// hisparse_memory's pow2_scale: the smallest power of two >= amax / 448 (at least FLT_MIN).
__device__ __forceinline__ float pow2_scale(float amax) {
    if (amax <= 0.0f) return 1.0f;
    float r = __fdiv_rn(amax, 448.0f);
    if (r <= 1.17549435e-38f) return 1.17549435e-38f;
    unsigned b = __float_as_uint(r);
    if ((b & 0x7fffffu) == 0) return r;
    return __uint_as_float((b & 0x7f800000u) + 0x800000u);
}

// The largest |v| over the block (every thread passes its own; every thread gets the result).
__device__ __forceinline__ float block_amax(float v, float* red) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float m = 0.0f;
    for (unsigned w = 0; w < (blockDim.x + 31) / 32; ++w) m = fmaxf(m, red[w]);
    return m;
}

// One values block of `count` <= 128 values (value j from `vals`), quantised with one power-of-two
// scale into `codes`; returns the scale. Thread j handles value j.
__device__ __forceinline__ float quantize(float v, bool live, unsigned char* codes, float* red) {
    float s = pow2_scale(block_amax(live ? fabsf(v) : 0.0f, red));
    if (live) codes[threadIdx.x] = encode_e4m3(__fmul_rn(v, __frcp_rn(s)));
    return s;
}

// NewRowsArgs and NEW_ROWS_KEY_PER_THREAD: the generated prelude (src/cuda/facts.rs).

// Block i: request i's new KV row from the stream kv_seeds[i] and, with keys, its index key from
// the streams key_seeds[2i], key_seeds[2i+1]. 128 threads.
extern "C" __global__ void fill_new_rows(NewRowsArgs a, const unsigned long long* __restrict__ kv_seeds,
                                         const unsigned long long* __restrict__ key_seeds,
                                         unsigned char* __restrict__ rows, unsigned char* __restrict__ keys) {
    __shared__ float red[32];
    const unsigned i = blockIdx.x, t = threadIdx.x;
    if (i >= a.n) return;
    unsigned char* row = rows + (unsigned long long)i * a.row_bytes;
    const unsigned long long seed = kv_seeds[i];
    if (a.fp8) {
        const unsigned blocks = a.blocked_dims / 128;
        for (unsigned blk = 0; blk < blocks; ++blk) {
            float v = unit_at(seed, blk * 128 + t, a.step, a.half_width);
            float s = quantize(v, true, row + blk * 128, red);
            if (t == 0) reinterpret_cast<float*>(row + a.blocked_dims)[blk] = s;
        }
        __nv_bfloat16* rope = reinterpret_cast<__nv_bfloat16*>(row + a.blocked_dims + 4 * blocks);
        for (unsigned e = t; e < a.bf16_dims; e += blockDim.x)
            rope[e] = __float2bfloat16_rn(unit_at(seed, a.blocked_dims + e, a.step, a.half_width));
    } else {
        __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(row);
        for (unsigned e = t; e < a.blocked_dims + a.bf16_dims; e += blockDim.x)
            out[e] = __float2bfloat16_rn(unit_at(seed, e, a.step, a.half_width));
    }
    if (a.key_dim == 0) return;
    unsigned char* key = keys + (unsigned long long)i * (a.key_dim + 4);
    // Value e = t + 128 j of the key in v[j]: one power-of-two scale over all of them.
    float v[NEW_ROWS_KEY_PER_THREAD];
    float m = 0.0f;
    #pragma unroll
    for (unsigned j = 0; j < NEW_ROWS_KEY_PER_THREAD; ++j) {
        const unsigned e = t + 128 * j;
        v[j] = 0.0f;
        if (e < a.key_dim) {
            float u = unit_at(key_seeds[2 * i], e, a.step, a.half_width);
            float w = unit_at(key_seeds[2 * i + 1], e, a.step, a.half_width);
            v[j] = __fadd_rn(__fmul_rn(a.key_c, u), __fmul_rn(a.key_b, w));
            m = fmaxf(m, fabsf(v[j]));
        }
    }
    const float s = pow2_scale(block_amax(m, red));
    const float inv = __frcp_rn(s);
    #pragma unroll
    for (unsigned j = 0; j < NEW_ROWS_KEY_PER_THREAD; ++j) {
        const unsigned e = t + 128 * j;
        if (e < a.key_dim) key[e] = encode_e4m3(__fmul_rn(v[j], inv));
    }
    if (t == 0) {
        // The scale after the codes: 4 bytes.
        unsigned bits = __float_as_uint(s);
        for (int b = 0; b < 4; ++b) key[a.key_dim + b] = (unsigned char)(bits >> (8 * b));
    }
}
