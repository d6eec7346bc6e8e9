// Small kernels of the decode step: `fill_unit_bf16` generates an emulated model's data where it
// is used (the unit stream of hisparse_kernels::unit_stream, bit for bit: integer mixing, then
// one rounded multiply and one rounded subtract); `write_rows` scatters a batch of new rows (KV rows,
// index keys) to their pool rows in one launch, a warp per row, 4 bytes per lane (rows are
// multiples of 4 bytes: 132 B keys, 656/1152 B KV rows); `locate_rows` maps selected positions
// to pool rows through each request's page table (the resident mode), flagging positions past a
// request's pages instead of reading there.

#include <cuda_bf16.h>

struct LocateReq {
    unsigned long long sel_offset;
    unsigned long long sel_len;
    unsigned long long first_page;
    unsigned long long pages;
};

// `packed`: n destination rows (u32), then n rows of `row_words` words of data.
extern "C" __global__ void write_rows(const unsigned* __restrict__ packed, unsigned n, unsigned row_words,
                                      unsigned long long pool_rows, unsigned* __restrict__ pool,
                                      unsigned* __restrict__ fault) {
    const unsigned lane = threadIdx.x & 31;
    const unsigned warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const unsigned warps = (gridDim.x * blockDim.x) >> 5;
    const unsigned* src = packed + n;
    for (unsigned i = warp; i < n; i += warps) {
        unsigned r = packed[i];
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
