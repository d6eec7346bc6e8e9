// Top-k over several blocks per request (small batches, where one block per request leaves most
// SMs idle): the same selection as top_k_select (the k largest keys in the float's total order,
// ascending positions, ties to the lower positions), in four launches over G chunks of C
// consecutive positions per request:
//   1. topk_hist (R x G blocks): the top 11 bits of every key, counted per block in shared
//      memory and merged into the request's histogram in global memory (zeroed before);
//   2. topk_filter (R x G): every block finds the bin b holding the k-th largest key from that
//      histogram, counts its keys above b and appends those in b (position and key) to the
//      request's candidates — the only keys whose order still matters;
//   3. topk_resolve (R): radix selection among the candidates (the lower 21 bits, early exit when
//      a whole bin is taken) gives the k-th largest key T on the bits of a mask and how many keys
//      equal to it there to take; then, per chunk, how many keys are above T, how many ties the
//      chunk takes (the lowest positions first, so the earlier chunks first) and where its
//      positions start in the output;
//   4. topk_place (R x G): every block writes its chunk's selected positions from there, in
//      rounds of consecutive positions with a block-wide prefix sum (as top_k_select's last pass).
// Spliced after topk.cu (Span, ordered_bits, BINS, UNROLL, V).
//
// Scratch, per request r (offsets from the launcher): hist[r][BINS] and the candidate count
// (zeroed before launch 1), candidates at the request's own score offsets (as many as it has
// positions), per chunk three words (above, ties taken, first output index) and per request
// three words (prefix, mask, ties left after the chunks above).

#define SPLIT_COPIES 4  // histogram copies of topk_hist (32 KB of static shared memory)

// SplitArgs, SPLIT_THREADS: the generated prelude (src/cuda/facts.rs).

// Exclusive prefix sum over a block of SPLIT_THREADS threads (16 warps); `sums` is 33 words of
// shared memory; `*total` gets the sum.
__device__ unsigned split_scan(unsigned v, unsigned* sums, unsigned* total) {
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = SPLIT_THREADS / 32;
    unsigned x = v;
    #pragma unroll
    for (unsigned d = 1; d < 32; d <<= 1) {
        const unsigned y = __shfl_up_sync(0xffffffffu, x, d);
        if (lane >= d) x += y;
    }
    if (lane == 31) sums[warp] = x;
    __syncthreads();
    if (warp == 0) {
        unsigned w = lane < warps ? sums[lane] : 0u;
        #pragma unroll
        for (unsigned d = 1; d < 32; d <<= 1) {
            const unsigned y = __shfl_up_sync(0xffffffffu, w, d);
            if (lane >= d) w += y;
        }
        if (lane < warps) sums[lane] = w;
        if (lane == 31) sums[32] = w;
    }
    __syncthreads();
    const unsigned before = (warp == 0 ? 0u : sums[warp - 1]) + x - v;
    *total = sums[32];
    __syncthreads();
    return before;
}

// The bin (top 11 bits) holding the k-th largest key, from a request's merged histogram: sets
// *bin, *above (keys in higher bins) and *in_bin. All threads of the block call it; `sums` is
// 33 words of shared memory. Thread j owns bins BINS-1-4j .. BINS-4-4j (4 per thread, 512
// threads).
__device__ void split_find_bin(const unsigned* h, unsigned k, unsigned* sums, unsigned* found) {
    unsigned c[4], own = 0;
    #pragma unroll
    for (unsigned i = 0; i < 4; ++i) {
        c[i] = h[BINS - 1 - 4 * threadIdx.x - i];
        own += c[i];
    }
    unsigned total;
    unsigned above = split_scan(own, sums, &total);
    #pragma unroll
    for (unsigned i = 0; i < 4; ++i) {
        if (above < k && above + c[i] >= k) {
            found[0] = BINS - 1 - 4 * threadIdx.x - i;
            found[1] = above;
            found[2] = c[i];
        }
        above += c[i];
    }
    __syncthreads();
}

extern "C" __global__ void __launch_bounds__(SPLIT_THREADS) topk_hist(
    const float* __restrict__ scores, const Span* __restrict__ spans, SplitArgs a, unsigned* __restrict__ hist_g) {
    __shared__ unsigned hist[SPLIT_COPIES * BINS];
    const Span sp = spans[blockIdx.x];
    const unsigned n = (unsigned)sp.len, first = blockIdx.y * a.chunk, end = min(n, first + a.chunk);
    for (unsigned b = threadIdx.x; b < SPLIT_COPIES * BINS; b += SPLIT_THREADS) hist[b] = 0;
    __syncthreads();
    const float* s = scores + sp.offset;
    unsigned* mine = hist + (threadIdx.x % SPLIT_COPIES) * BINS;
    for (unsigned base = first; base < end; base += SPLIT_THREADS * UNROLL) {
        unsigned keys[UNROLL];
        #pragma unroll
        for (unsigned u = 0; u < UNROLL; ++u) {
            const unsigned t = base + u * SPLIT_THREADS + threadIdx.x;
            keys[u] = t < end ? ordered_bits(__ldg(s + t)) : 0u;
        }
        #pragma unroll
        for (unsigned u = 0; u < UNROLL; ++u)
            if (base + u * SPLIT_THREADS + threadIdx.x < end) atomicAdd(&mine[keys[u] >> 21], 1u);
    }
    __syncthreads();
    unsigned* h = hist_g + (size_t)blockIdx.x * (BINS + 1);
    for (unsigned b = threadIdx.x; b < BINS; b += SPLIT_THREADS) {
        unsigned c = 0;
        #pragma unroll
        for (unsigned x = 0; x < SPLIT_COPIES; ++x) c += hist[x * BINS + b];
        if (c) atomicAdd(&h[b], c);
    }
}

extern "C" __global__ void __launch_bounds__(SPLIT_THREADS) topk_filter(
    const float* __restrict__ scores, const Span* __restrict__ spans, SplitArgs a, unsigned* __restrict__ hist_g,
    unsigned* __restrict__ cand_pos, unsigned* __restrict__ cand_key, unsigned* __restrict__ chunk_words) {
    __shared__ unsigned sums[33];
    __shared__ unsigned found[3];
    __shared__ unsigned s_above;
    const Span sp = spans[blockIdx.x];
    const unsigned n = (unsigned)sp.len, first = blockIdx.y * a.chunk, end = min(n, first + a.chunk);
    unsigned* h = hist_g + (size_t)blockIdx.x * (BINS + 1);
    split_find_bin(h, a.k, sums, found);
    const unsigned bin = found[0];
    if (threadIdx.x == 0) s_above = 0;
    __syncthreads();
    const float* s = scores + sp.offset;
    unsigned above = 0;
    const unsigned lane = threadIdx.x & 31;
    for (unsigned base = first; base < end; base += SPLIT_THREADS) {
        const unsigned t = base + threadIdx.x;
        const unsigned key = t < end ? ordered_bits(__ldg(s + t)) : 0u;
        above += t < end && (key >> 21) > bin;
        const bool cand = t < end && (key >> 21) == bin;
        // One atomic per warp for its candidates.
        const unsigned ballot = __ballot_sync(0xffffffffu, cand);
        unsigned at = 0;
        if (lane == 0 && ballot) at = atomicAdd(&h[BINS], (unsigned)__popc(ballot));
        at = __shfl_sync(0xffffffffu, at, 0);
        if (cand) {
            const unsigned i = at + (unsigned)__popc(ballot & ((1u << lane) - 1u));
            cand_pos[sp.offset + i] = t;
            cand_key[sp.offset + i] = key;
        }
    }
    atomicAdd(&s_above, above);
    __syncthreads();
    if (threadIdx.x == 0) chunk_words[((size_t)blockIdx.x * a.blocks + blockIdx.y) * 3] = s_above;
}

extern "C" __global__ void __launch_bounds__(SPLIT_THREADS) topk_resolve(
    const Span* __restrict__ spans, SplitArgs a, const unsigned* __restrict__ hist_g,
    const unsigned* __restrict__ cand_pos, const unsigned* __restrict__ cand_key, unsigned* __restrict__ chunk_words,
    unsigned* __restrict__ req_words) {
    __shared__ unsigned hist[BINS];
    __shared__ unsigned sums[33];
    __shared__ unsigned found[3];
    __shared__ unsigned gt[1024], eq[1024];  // per chunk (at most 1024 chunks)
    const Span sp = spans[blockIdx.x];
    const unsigned* h = hist_g + (size_t)blockIdx.x * (BINS + 1);
    split_find_bin(h, a.k, sums, found);
    const unsigned m = h[BINS];
    unsigned prefix = found[0] << 21, mask = 0xffe00000u, remaining = a.k - found[1];
    bool whole = remaining == found[2];
    const unsigned shifts[2] = {10, 0}, widths[2] = {11, 10};
    for (int pass = 0; pass < 2 && !whole; ++pass) {
        const unsigned shift = shifts[pass], dm = (1u << widths[pass]) - 1;
        for (unsigned b = threadIdx.x; b < BINS; b += SPLIT_THREADS) hist[b] = 0;
        __syncthreads();
        for (unsigned i = threadIdx.x; i < m; i += SPLIT_THREADS) {
            const unsigned key = cand_key[sp.offset + i];
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & dm], 1u);
        }
        __syncthreads();
        split_find_bin(hist, remaining, sums, found);
        prefix |= found[0] << shift;
        mask |= dm << shift;
        remaining -= found[1];
        whole = remaining == found[2];
        __syncthreads();
    }
    // `prefix` is the k-th largest key on the bits of `mask`; `remaining` keys equal to it there
    // are taken, the lowest positions first. Per chunk: keys above (those of higher bins and the
    // candidates above) and ties.
    for (unsigned g = threadIdx.x; g < a.blocks; g += SPLIT_THREADS) {
        gt[g] = chunk_words[((size_t)blockIdx.x * a.blocks + g) * 3];
        eq[g] = 0;
    }
    __syncthreads();
    for (unsigned i = threadIdx.x; i < m; i += SPLIT_THREADS) {
        const unsigned key = cand_key[sp.offset + i] & mask, g = cand_pos[sp.offset + i] / a.chunk;
        if (key > prefix) atomicAdd(&gt[g], 1u);
        else if (key == prefix) atomicAdd(&eq[g], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned at = 0, left = remaining;
        for (unsigned g = 0; g < a.blocks; ++g) {
            const unsigned take = min(eq[g], left);
            unsigned* w = chunk_words + ((size_t)blockIdx.x * a.blocks + g) * 3;
            w[1] = take;
            w[2] = at;
            at += gt[g] + take;
            left -= take;
        }
        req_words[blockIdx.x * 3] = prefix;
        req_words[blockIdx.x * 3 + 1] = mask;
        req_words[blockIdx.x * 3 + 2] = left;
    }
}

extern "C" __global__ void __launch_bounds__(SPLIT_THREADS) topk_place(
    const float* __restrict__ scores, const Span* __restrict__ spans, SplitArgs a,
    const unsigned* __restrict__ chunk_words, const unsigned* __restrict__ req_words, int* __restrict__ out) {
    __shared__ unsigned sums[33];
    const Span sp = spans[blockIdx.x];
    const unsigned n = (unsigned)sp.len, first = blockIdx.y * a.chunk, end = min(n, first + a.chunk);
    const unsigned* w = chunk_words + ((size_t)blockIdx.x * a.blocks + blockIdx.y) * 3;
    const unsigned quota = w[1];
    const unsigned prefix = req_words[blockIdx.x * 3], mask = req_words[blockIdx.x * 3 + 1];
    const float* s = scores + sp.offset;
    int* o = out + (size_t)blockIdx.x * a.k;
    unsigned ties_seen = 0, written = w[2];
    for (unsigned base = first; base < end; base += SPLIT_THREADS * V) {
        const unsigned at0 = base + threadIdx.x * V;
        unsigned keys[V], gtc = 0, eqc = 0;
        #pragma unroll
        for (unsigned u = 0; u < V; ++u) {
            keys[u] = at0 + u < end ? ordered_bits(__ldg(s + at0 + u)) & mask : 0u;
            gtc += at0 + u < end && keys[u] > prefix;
            eqc += at0 + u < end && keys[u] == prefix;
        }
        unsigned total;
        const unsigned before = split_scan((gtc << 16) | eqc, sums, &total);
        const unsigned gt_before = before >> 16, eq_before = before & 0xffffu;
        const unsigned q = quota > ties_seen ? quota - ties_seen : 0u;
        unsigned take = q > eq_before ? min(eqc, q - eq_before) : 0u;
        unsigned at = written + gt_before + min(eq_before, q);
        #pragma unroll
        for (unsigned u = 0; u < V; ++u) {
            const bool tie = at0 + u < end && keys[u] == prefix;
            if ((at0 + u < end && keys[u] > prefix) || (tie && take > 0)) {
                if (tie) --take;
                o[at++] = (int)(at0 + u);
            }
        }
        ties_seen += total & 0xffffu;
        written += (total >> 16) + min(total & 0xffffu, q);
    }
}
