// Top-k by radix selection: one block of 1024 threads per request. Scores map to 32-bit keys
// whose unsigned order is the float's total order (as the CPU twin's f32::total_cmp); three
// histogram passes (11, 11 and 10 bits, in shared memory) find the k-th largest key T and how
// many keys equal to T to take. A last pass gives each thread a contiguous run of positions, so
// two block-wide prefix sums (of the ties, then of the selected) place every selected position
// at its rank: the output is ascending, and ties go to the lower positions — exactly the CPU
// twin's selection.

struct Span {
    unsigned long long offset;
    unsigned long long len;
};

#define THREADS 1024
#define BINS 2048
#define UNROLL 8

__device__ __forceinline__ unsigned ordered_bits(float x) {
    unsigned b = __float_as_uint(x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Exclusive prefix sum over the block; `sums` is 33 words of shared memory; `*total` gets the sum.
__device__ unsigned scan_block(unsigned v, unsigned* sums, unsigned* total) {
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned x = v;
    #pragma unroll
    for (unsigned d = 1; d < 32; d <<= 1) {
        unsigned y = __shfl_up_sync(0xffffffffu, x, d);
        if (lane >= d) x += y;
    }
    if (lane == 31) sums[warp] = x;
    __syncthreads();
    if (warp == 0) {
        unsigned s = sums[lane];
        #pragma unroll
        for (unsigned d = 1; d < 32; d <<= 1) {
            unsigned y = __shfl_up_sync(0xffffffffu, s, d);
            if (lane >= d) s += y;
        }
        sums[lane] = s;
        if (lane == 31) sums[32] = s;
    }
    __syncthreads();
    unsigned before = (warp == 0 ? 0u : sums[warp - 1]) + x - v;
    *total = sums[32];
    __syncthreads();
    return before;
}

extern "C" __global__ void __launch_bounds__(THREADS) top_k_select(
    const float* __restrict__ scores,
    const Span* __restrict__ spans,
    unsigned k,
    int* __restrict__ out) {
    __shared__ unsigned hist[BINS];
    __shared__ unsigned sums[33];
    __shared__ unsigned found[2];
    const Span sp = spans[blockIdx.x];
    const float* s = scores + sp.offset;
    const unsigned n = (unsigned)sp.len;
    int* o = out + (size_t)blockIdx.x * k;
    if (k == 0) return;

    unsigned prefix = 0, mask = 0, remaining = k;
    const unsigned shifts[3] = {21, 10, 0};
    const unsigned widths[3] = {11, 11, 10};
    #pragma unroll
    for (int pass = 0; pass < 3; ++pass) {
        const unsigned shift = shifts[pass], digit_mask = (1u << widths[pass]) - 1;
        for (unsigned b = threadIdx.x; b < BINS; b += THREADS) hist[b] = 0;
        __syncthreads();
        // Whole warps iterate together so that lanes adding to the same bin combine first (the
        // top digit of real scores falls in few bins: one atomic per bin per warp, not per lane);
        // each lane loads UNROLL scores before using any (loads in flight hide the latency).
        for (unsigned base = 0; base < n; base += THREADS * UNROLL) {
            unsigned keys[UNROLL];
            #pragma unroll
            for (unsigned u = 0; u < UNROLL; ++u) {
                unsigned t = base + u * THREADS + threadIdx.x;
                keys[u] = t < n ? ordered_bits(__ldg(s + t)) : 0u;
            }
            #pragma unroll
            for (unsigned u = 0; u < UNROLL; ++u) {
                unsigned t = base + u * THREADS + threadIdx.x;
                unsigned bin = (t < n && (keys[u] & mask) == prefix) ? (keys[u] >> shift) & digit_mask : 0xffffffffu;
                unsigned peers = __match_any_sync(0xffffffffu, bin);
                if (bin != 0xffffffffu && (unsigned)(__ffs(peers) - 1) == (threadIdx.x & 31))
                    atomicAdd(&hist[bin], (unsigned)__popc(peers));
            }
        }
        __syncthreads();
        // Thread j owns bins BINS-1-2j and BINS-2-2j (from the top): counts above each bin.
        unsigned hi = hist[BINS - 1 - 2 * threadIdx.x], lo = hist[BINS - 2 - 2 * threadIdx.x];
        unsigned total;
        unsigned above = scan_block(hi + lo, sums, &total);
        if (above < remaining && above + hi >= remaining) {
            found[0] = BINS - 1 - 2 * threadIdx.x;
            found[1] = above;
        } else if (above + hi < remaining && above + hi + lo >= remaining) {
            found[0] = BINS - 2 - 2 * threadIdx.x;
            found[1] = above + hi;
        }
        __syncthreads();
        prefix |= found[0] << shift;
        mask |= digit_mask << shift;
        remaining -= found[1];
        __syncthreads();
    }
    // prefix is the k-th largest key; `remaining` keys equal to it are taken, lowest first.
    const unsigned per = (n + THREADS - 1) / THREADS;
    const unsigned begin = min(n, threadIdx.x * per), end = min(n, begin + per);
    unsigned gt = 0, eq = 0;
    for (unsigned t0 = begin; t0 < end; t0 += UNROLL) {
        float v[UNROLL];
        #pragma unroll
        for (unsigned u = 0; u < UNROLL; ++u) v[u] = t0 + u < end ? __ldg(s + t0 + u) : 0.f;
        #pragma unroll
        for (unsigned u = 0; u < UNROLL; ++u) {
            unsigned key = ordered_bits(v[u]);
            gt += t0 + u < end && key > prefix;
            eq += t0 + u < end && key == prefix;
        }
    }
    unsigned total;
    unsigned eq_before = scan_block(eq, sums, &total);
    unsigned take = remaining > eq_before ? min(eq, remaining - eq_before) : 0u;
    unsigned at = scan_block(gt + take, sums, &total);
    for (unsigned t = begin; t < end; ++t) {
        unsigned key = ordered_bits(s[t]);
        if (key > prefix || (key == prefix && take > 0)) {
            if (key == prefix) --take;
            o[at++] = (int)t;
        }
    }
}
