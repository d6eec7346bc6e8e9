// Top-k by radix selection: one block of 1024 threads per request. Scores map to 32-bit keys
// whose unsigned order is the float's total order (as the CPU twin's f32::total_cmp); three
// histogram passes (11, 11 and 10 bits; eight copies of the histogram in shared memory) find
// the k-th largest key T and how many keys equal to T to take.
//
// Usually (at most FAST_N positions, k below 65536, and at most CAP keys in the threshold bin of
// the first pass, or else of the second) only one or two passes read every score: the next one
// marks the keys above the bin in a bitmap of positions and keeps the bin's keys (with their
// positions) as candidates in shared memory, the finer passes run over the candidates alone,
// the chosen candidates join the bitmap (the ties a second one), and one block-wide prefix sum
// over the bitmaps' counts places every selected position. Else every pass reads every score,
// and a last pass in rounds of consecutive positions places every selected position at its rank
// with one block-wide prefix sum per round. Either way the output is ascending, and ties go to
// the lower positions — exactly the CPU twin's selection.


// THREADS, BINS, COPIES, CAP (candidates kept in shared memory) and FAST_N (positions the bitmaps
// cover), Span: the generated prelude (src/cuda/facts.rs).
#define UNROLL 8
#define V 4
// Dynamic shared memory: [COPIES][BINS] histograms (then the ties' bitmap), CAP candidate keys,
// CAP candidate positions and the selected positions' bitmap (TOPK_SMEM in the launcher).

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

// The usual case's pass after the one whose bin was small enough: positions whose key lies
// above that bin (`prefix` on `mask`) are marked in `bits` (a warp's 32 lanes read the 32 positions of one
// word); those in it are candidates (`ck` keys and `cp` positions, counted by `*cands`: one
// atomic per warp and UNROLL rounds).
__device__ void keep_candidates(const float* s, unsigned n, unsigned prefix, unsigned mask, unsigned* bits,
                                unsigned* ck, unsigned* cp, unsigned* cands) {
    const unsigned lane = threadIdx.x & 31, below = (1u << lane) - 1u;
    for (unsigned base = 0; base < n; base += THREADS * UNROLL) {
        unsigned keys[UNROLL], eq[UNROLL], total = 0;
        #pragma unroll
        for (unsigned u = 0; u < UNROLL; ++u) {
            const unsigned t = base + u * THREADS + threadIdx.x;
            keys[u] = t < n ? ordered_bits(__ldg(s + t)) : 0u;
        }
        #pragma unroll
        for (unsigned u = 0; u < UNROLL; ++u) {
            const unsigned t = base + u * THREADS + threadIdx.x;
            const unsigned gt = __ballot_sync(0xffffffffu, t < n && (keys[u] & mask) > prefix);
            eq[u] = __ballot_sync(0xffffffffu, t < n && (keys[u] & mask) == prefix);
            total += __popc(eq[u]);
            if (lane == 0 && t < n) bits[t / 32] = gt;  // t is the word's first position here
        }
        if (total == 0u) continue;
        unsigned at = 0u;
        if (lane == 0) at = atomicAdd(cands, total);
        at = __shfl_sync(0xffffffffu, at, 0);
        #pragma unroll
        for (unsigned u = 0; u < UNROLL; ++u) {
            if (eq[u] & (1u << lane)) {
                const unsigned c = at + __popc(eq[u] & below);
                ck[c] = keys[u];
                cp[c] = base + u * THREADS + threadIdx.x;
            }
            at += __popc(eq[u]);
        }
    }
}

// The usual case's end: candidates above `prefix` (on `mask`) join `bits`, those equal to it
// are marked in `ties` (free histogram memory); one block scan of both bitmaps' counts then
// places the selected positions and the lowest `remaining` ties, ascending.
__device__ void place_selected(unsigned n, unsigned cands, unsigned prefix, unsigned mask, unsigned remaining,
                               unsigned* bits, const unsigned* ck, const unsigned* cp, unsigned* ties,
                               unsigned* sums, int* o) {
    const unsigned words = (n + 31) / 32;
    for (unsigned w = threadIdx.x; w < words; w += THREADS) ties[w] = 0u;
    __syncthreads();
    for (unsigned c = threadIdx.x; c < cands; c += THREADS) {
        const unsigned key = ck[c] & mask, t = cp[c];
        if (key > prefix) atomicOr(&bits[t / 32], 1u << (t % 32));
        else if (key == prefix) atomicOr(&ties[t / 32], 1u << (t % 32));
    }
    __syncthreads();
    // Thread j owns `per` consecutive words. Counts: selected (< 65536: k is) in the high half,
    // ties (at most CAP) in the low one.
    const unsigned per = (words + THREADS - 1) / THREADS, w0 = threadIdx.x * per, w1 = min(words, w0 + per);
    unsigned mine = 0u;
    for (unsigned w = w0; w < w1; ++w) mine += (__popc(bits[w]) << 16) + __popc(ties[w]);
    unsigned total;
    const unsigned before = scan_block(mine, sums, &total);
    unsigned at = (before >> 16) + min(before & 0xffffu, remaining), tie = before & 0xffffu;
    for (unsigned w = w0; w < w1; ++w) {
        const unsigned sb = bits[w], tb = ties[w];
        unsigned m = sb | tb;
        while (m != 0u) {
            const unsigned b = __ffs(m) - 1;
            m &= m - 1u;
            if (tb & (1u << b)) {
                if (tie++ < remaining) o[at++] = (int)(w * 32 + b);
            } else {
                o[at++] = (int)(w * 32 + b);
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, 1) top_k_select(
    const float* __restrict__ scores,
    const Span* __restrict__ spans,
    unsigned k,
    int* __restrict__ out) {
    extern __shared__ unsigned hist[];  // [COPIES][BINS], then the usual case's lists
    unsigned* ck = hist + COPIES * BINS;
    unsigned* cp = ck + CAP;
    unsigned* bits = cp + CAP;
    __shared__ unsigned sums[33];
    __shared__ unsigned found[3];
    __shared__ unsigned cand_count;
    const Span sp = spans[blockIdx.x];
    const float* s = scores + sp.offset;
    const unsigned n = (unsigned)sp.len;
    int* o = out + (size_t)blockIdx.x * k;
    if (k == 0) return;
    if (threadIdx.x == 0) cand_count = 0;

    unsigned prefix = 0, mask = 0, remaining = k;
    // Once kept (`fast`), the candidates alone are read (`cands` of them in ck/cp).
    bool fast = false;
    unsigned cands = 0;
    const unsigned shifts[3] = {21, 10, 0};
    const unsigned widths[3] = {11, 11, 10};
    #pragma unroll
    for (int pass = 0; pass < 3; ++pass) {
        const unsigned shift = shifts[pass], digit_mask = (1u << widths[pass]) - 1;
        for (unsigned b = threadIdx.x; b < COPIES * BINS; b += THREADS) hist[b] = 0;
        __syncthreads();
        // Lanes add into COPIES copies of the histogram (lane % COPIES), so that lanes of a warp
        // hitting the same bin (the top digit of real scores falls in few bins) conflict at most
        // 32 / COPIES ways; each lane loads UNROLL scores before using any.
        unsigned* mine = hist + (threadIdx.x % COPIES) * BINS;
        if (fast) {
            for (unsigned c = threadIdx.x; c < cands; c += THREADS) {
                const unsigned key = ck[c];
                if ((key & mask) == prefix) atomicAdd(&mine[(key >> shift) & digit_mask], 1u);
            }
        } else {
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
                    if (t < n && (keys[u] & mask) == prefix) atomicAdd(&mine[(keys[u] >> shift) & digit_mask], 1u);
                }
            }
        }
        __syncthreads();
        // Thread j owns bins BINS-1-2j and BINS-2-2j (from the top): counts above each bin.
        unsigned hi = 0, lo = 0;
        #pragma unroll
        for (unsigned c = 0; c < COPIES; ++c) {
            hi += hist[c * BINS + BINS - 1 - 2 * threadIdx.x];
            lo += hist[c * BINS + BINS - 2 - 2 * threadIdx.x];
        }
        unsigned total;
        unsigned above = scan_block(hi + lo, sums, &total);
        if (above < remaining && above + hi >= remaining) {
            found[0] = BINS - 1 - 2 * threadIdx.x;
            found[1] = above;
            found[2] = hi;
        } else if (above + hi < remaining && above + hi + lo >= remaining) {
            found[0] = BINS - 2 - 2 * threadIdx.x;
            found[1] = above + hi;
            found[2] = lo;
        }
        __syncthreads();
        prefix |= found[0] << shift;
        mask |= digit_mask << shift;
        remaining -= found[1];
        const unsigned in_bin = found[2];
        const bool whole_bin = remaining == in_bin;
        __syncthreads();
        if (!fast && pass < 2 && n <= FAST_N && k < 65536u && in_bin <= CAP) {
            keep_candidates(s, n, prefix, mask, bits, ck, cp, &cand_count);
            fast = true;
            cands = in_bin;
            __syncthreads();
        }
        // Every key of the bin is taken: its order inside the bin does not matter, so the keys
        // need no finer digits (the usual case after two passes over continuous scores).
        if (whole_bin) break;
    }
    if (fast) {
        // The histograms are free: they hold the ties.
        place_selected(n, cands, prefix, mask, remaining, bits, ck, cp, hist, sums, o);
        return;
    }
    // `prefix` is the k-th largest key on the bits of `mask`; `remaining` keys equal to it there
    // are taken, lowest positions first (all of them when the passes stopped early).
    // Rounds of THREADS * V consecutive positions (coalesced; thread t owns V in a row): one
    // block scan of the (greater, equal) counts packed in 16-bit halves places each thread's
    // selected positions; the output is ascending and the ties taken are the lowest ones.
    unsigned ties_seen = 0, written = 0;
    for (unsigned base = 0; base < n && written < k; base += THREADS * V) {
        const unsigned first = base + threadIdx.x * V;
        unsigned keys[V], gt = 0, eq = 0;
        #pragma unroll
        for (unsigned u = 0; u < V; ++u) {
            keys[u] = first + u < n ? ordered_bits(__ldg(s + first + u)) & mask : 0u;
            gt += first + u < n && keys[u] > prefix;
            eq += first + u < n && keys[u] == prefix;
        }
        unsigned total;
        const unsigned before = scan_block((gt << 16) | eq, sums, &total);
        const unsigned gt_before = before >> 16, eq_before = before & 0xffffu;
        const unsigned quota = remaining > ties_seen ? remaining - ties_seen : 0u;
        unsigned take = quota > eq_before ? min(eq, quota - eq_before) : 0u;
        unsigned at = written + gt_before + min(eq_before, quota);
        #pragma unroll
        for (unsigned u = 0; u < V; ++u) {
            bool tie = first + u < n && keys[u] == prefix;
            if ((first + u < n && keys[u] > prefix) || (tie && take > 0)) {
                if (tie) --take;
                o[at++] = (int)(first + u);
            }
        }
        ties_seen += total & 0xffffu;
        written += (total >> 16) + min(total & 0xffffu, quota);
    }
}
