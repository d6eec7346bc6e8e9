// What the swap-in (swap_in.cu) and the prefetch (prefetch.cu) kernels share: the request and
// parameter structs, block-wide scans, row copies, the hooks' environment, the choice of victims
// and the rebuilding of records. Spliced after the policy's program by cuda/swap_in.rs.


// COUNTS, SwapReq, SwapParams (and Span, hot_seat_base, the shared-memory formulas): the generated
// prelude (src/cuda/facts.rs), at the head of the module.

// The per-(seat, layer) state the hooks read besides records: prefetched flags per slot, the
// tokens' history words, this step's scores.
struct HookState {
    const unsigned char* prefetched;  // B flags
    const unsigned* words;            // word_tokens words, or null
    const float* scores;              // the request's scores by position, or null
    unsigned word_tokens;
    unsigned seq_len;
};

__device__ PolicyEnv hook_env(const PolicyEnv& base, const HookState& h, unsigned slot, unsigned token) {
    PolicyEnv e = base;
    e.slot = slot;
    e.token = token;
    e.next_use = 0xffffffffu;
    e.score = (h.scores && token < h.seq_len) ? h.scores[token] : __int_as_float(0x7fc00000);
    e.prefetched = h.prefetched[slot];
    e.token_word = (h.words && token < h.word_tokens) ? h.words[token] : 0u;
    return e;
}

#define FLAG_OCCUPIED 1
#define FLAG_HIT 2
#define FLAG_VICTIM 4

// Exclusive prefix sum of `v` over the block (blockDim.x a multiple of 32); `warp_sums` holds 33
// words of shared memory. Returns the prefix; `*total` gets the block's sum. All threads call it.
__device__ unsigned block_scan(unsigned v, unsigned* warp_sums, unsigned* total) {
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    unsigned x = v;
    for (unsigned d = 1; d < 32; d <<= 1) {
        unsigned y = __shfl_up_sync(0xffffffffu, x, d);
        if (lane >= d) x += y;
    }
    if (lane == 31) warp_sums[warp] = x;
    __syncthreads();
    if (warp == 0) {
        unsigned w = lane < warps ? warp_sums[lane] : 0u;
        for (unsigned d = 1; d < 32; d <<= 1) {
            unsigned y = __shfl_up_sync(0xffffffffu, w, d);
            if (lane >= d) w += y;
        }
        if (lane < warps) warp_sums[lane] = w;  // inclusive
        if (lane == 31) warp_sums[32] = w;
    }
    __syncthreads();
    unsigned before = warp == 0 ? 0u : warp_sums[warp - 1];
    *total = warp_sums[32];
    __syncthreads();
    return before + x - v;
}

// Copies one row (row_bytes, a multiple of 16) with the lanes of a warp: each lane issues all
// its 16-byte loads (up to three: rows of up to 1536 B) before its stores, so that a warp keeps
// several host reads in flight.
__device__ __forceinline__ void copy_row(const unsigned char* src, unsigned char* dst, unsigned row_bytes, unsigned lane) {
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    const unsigned n = row_bytes / 16;
    uint4 v[3];
#pragma unroll
    for (unsigned i = 0; i < 3; ++i)
        if (lane + 32 * i < n) v[i] = __ldg(s + lane + 32 * i);
#pragma unroll
    for (unsigned i = 0; i < 3; ++i)
        if (lane + 32 * i < n) __stcg(d + lane + 32 * i, v[i]);
    for (unsigned c = lane + 96; c < n; c += 32) __stcg(d + c, __ldg(s + c));
}

// The host-tier row of token `tok` of request `r` in layer p.layer, plus one; 0 where its page
// index runs past the page list or its page id past the tier (the caller raises the fault).
__device__ __forceinline__ unsigned long long host_row_plus_one(const SwapReq& r, unsigned tok,
                                                                const unsigned* __restrict__ host_pages,
                                                                const SwapParams& p) {
    const unsigned long long at = (unsigned long long)r.page_offset + tok / p.page_tokens;
    if (at >= p.host_pages_len) return 0ull;
    const unsigned page = host_pages[at];
    if (page >= p.host_pages_per_layer) return 0ull;
    return ((unsigned long long)p.layer * p.host_pages_per_layer + page) * p.page_tokens + tok % p.page_tokens + 1ull;
}

__device__ int find_sorted(const unsigned* a, unsigned n, unsigned x) {
    unsigned lo = 0, hi = n;
    while (lo < hi) {
        unsigned mid = (lo + hi) >> 1;
        if (a[mid] < x) lo = mid + 1; else hi = mid;
    }
    return (lo < n && a[lo] == x) ? (int)lo : -1;
}


// One radix pass's choice, by warp 0 (all 32 lanes call it): the first bin b of `hist` at which
// the running count reaches *need (b = 255 when none does); *need becomes what is left to take
// within b, and *prefix gets b at `shift`. Each lane scans 8 bins; the warp scans the lanes.
__device__ void radix_pick(const unsigned* hist, unsigned* need, unsigned long long* prefix, int shift) {
    const unsigned lane = threadIdx.x & 31;
    unsigned own = 0;
#pragma unroll
    for (unsigned i = 0; i < 8; ++i) own += hist[lane * 8 + i];
    unsigned incl = own;
    for (unsigned d = 1; d < 32; d <<= 1) {
        const unsigned y = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += y;
    }
    const unsigned want = *need;
    const unsigned reach = __ballot_sync(0xffffffffu, incl >= want);
    const unsigned at = reach ? (unsigned)(__ffs(reach) - 1) : 31u;
    if (lane == at) {
        unsigned cum = incl - own, b = lane * 8;
        for (; b < 255u && cum + hist[b] < want; ++b) cum += hist[b];
        *need = want - cum;
        *prefix |= (unsigned long long)b << shift;
    }
}


// Chooses the M victims of a step (or a prefetch) among the evictable slots — flags 0 (empty)
// or exactly FLAG_OCCUPIED (occupied; prio holds its priority); a slot with any other bit set is
// not evictable — as the smallest (occupied, priority, slot) keys: empties first in slot order,
// then the smallest priorities, ties by slot. Sets FLAG_VICTIM on them, writes their slots in
// ascending order to vslot[0..M), and returns the largest victim's key. All threads of the
// block call it; M is at most the number of evictable slots.
__device__ VictimKey choose_victims(unsigned char* flags, const unsigned long long* prio, unsigned* vslot,
                                    unsigned B, unsigned M, unsigned* warp_sums) {
    __shared__ unsigned hist[256];
    __shared__ unsigned s_need, s_eq_slot;
    __shared__ unsigned long long s_prefix, s_min, s_max;
    const unsigned tid = threadIdx.x, T = blockDim.x;
    VictimKey vk;
    vk.any = M > 0;
    vk.occupied = false;
    vk.priority = 0ull;
    vk.slot = 0u;
    // Empty slots in slot order (chunks of consecutive slots per thread).
    const unsigned bc = (B + T - 1) / T;
    const unsigned s0 = min(B, tid * bc), s1 = min(B, (tid + 1) * bc);
    unsigned empties = 0;
    for (unsigned s = s0; s < s1; ++s) empties += flags[s] == 0;
    unsigned E;
    const unsigned empty_before = block_scan(empties, warp_sums, &E);
    if (M == 0) return vk;
    unsigned e = empty_before;
    for (unsigned s = s0; s < s1; ++s) {
        if (flags[s] == 0) {
            if (e < M) {
                flags[s] |= FLAG_VICTIM;
                if (e == M - 1) s_eq_slot = s;
            }
            ++e;
        }
    }
    __syncthreads();
    if (M <= E) {
        vk.slot = s_eq_slot;
    } else {
        // Radix select the (M - E)-th smallest priority among occupied evictables, 8 bits a pass,
        // starting below the bits every candidate shares (those of the smallest and the largest).
        if (tid == 0) {
            s_need = M - E;
            s_min = ~0ull;
            s_max = 0ull;
        }
        __syncthreads();
        unsigned long long lo = ~0ull, hi = 0ull;
        for (unsigned s = tid; s < B; s += T)
            if (flags[s] == FLAG_OCCUPIED) {
                lo = min(lo, prio[s]);
                hi = max(hi, prio[s]);
            }
        if (lo <= hi) {
            atomicMin(&s_min, lo);
            atomicMax(&s_max, hi);
        }
        __syncthreads();
        const unsigned long long diff = s_min ^ s_max;
        const int top = diff == 0ull ? -1 : 63 - __clzll((long long)diff);
        if (tid == 0) s_prefix = top < 0 ? s_min : (top >= 56 ? 0ull : s_min & (~0ull << ((top / 8) * 8 + 8)));
        __syncthreads();
        for (int shift = top < 0 ? -8 : (top / 8) * 8; shift >= 0; shift -= 8) {
            for (unsigned i = tid; i < 256; i += T) hist[i] = 0u;
            __syncthreads();
            const unsigned long long prefix = s_prefix;
            const unsigned long long mask = shift == 56 ? 0ull : (~0ull << (shift + 8));
            // Warp-uniform trips; lanes with the same bin add once (priorities often repeat).
            const unsigned lane = tid & 31;
            for (unsigned w = tid - lane; w < B; w += T) {
                const unsigned s = w + lane;
                const bool in = s < B && flags[s] == FLAG_OCCUPIED && ((prio[s] ^ prefix) & mask) == 0ull;
                const unsigned bin = in ? (unsigned)(prio[s] >> shift) & 255u : 256u;
                const unsigned same = __match_any_sync(0xffffffffu, bin);
                if (in && lane == (unsigned)__ffs(same) - 1) atomicAdd(&hist[bin], (unsigned)__popc(same));
            }
            __syncthreads();
            if (tid < 32) radix_pick(hist, &s_need, &s_prefix, shift);
            __syncthreads();
        }
        const unsigned long long thr = s_prefix;
        const unsigned need_eq = s_need;
        // Ties at the threshold: the lowest slots first.
        unsigned eq = 0;
        for (unsigned s = s0; s < s1; ++s) eq += flags[s] == FLAG_OCCUPIED && prio[s] == thr;
        unsigned eq_total;
        unsigned q = block_scan(eq, warp_sums, &eq_total);
        for (unsigned s = s0; s < s1; ++s) {
            if (flags[s] != FLAG_OCCUPIED) continue;
            if (prio[s] < thr) {
                flags[s] |= FLAG_VICTIM;
            } else if (prio[s] == thr) {
                if (q < need_eq) {
                    flags[s] |= FLAG_VICTIM;
                    if (q == need_eq - 1) s_eq_slot = s;
                }
                ++q;
            }
        }
        __syncthreads();
        vk.occupied = true;
        vk.priority = thr;
        vk.slot = s_eq_slot;
    }
    // Victim ranks in slot order.
    unsigned v = 0;
    for (unsigned s = s0; s < s1; ++s) v += (flags[s] & FLAG_VICTIM) != 0;
    unsigned vt;
    unsigned vr = block_scan(v, warp_sums, &vt);
    for (unsigned s = s0; s < s1; ++s)
        if (flags[s] & FLAG_VICTIM) vslot[vr++] = s;
    __syncthreads();
    return vk;
}

// On a buffer's first policy-managed step (or after a policy change) every occupied slot's
// record is rebuilt by on_insert at the step before (as SwapInState::ready_policy does). All
// threads call it.
__device__ void ready_records(const int* st, SlotRecord* rec, PolicyScalars* scalars, unsigned* ready,
                              unsigned long long state, unsigned B, const StepCtx& ctx, const HookState& hs) {
    __shared__ unsigned s_ready;
    const unsigned tid = threadIdx.x, T = blockDim.x;
    if (tid == 0) s_ready = ready[state];
    __syncthreads();
    if (!s_ready) {
        PolicyEnv init;
        init.ctx = ctx;
        init.ctx.step = ctx.step - 1;
        init.scalars.a = 0u;
        init.scalars.b = 0u;
        init.victim.any = false;
        init.victim.occupied = false;
        init.victim.priority = 0ull;
        init.victim.slot = 0u;
        for (unsigned s = tid; s < B; s += T) {
            SlotRecord x;
            x.a = 0u;
            x.b = 0u;
            if (st[s] >= 0) policy_on_insert(x, hook_env(init, hs, s, (unsigned)st[s]));
            rec[s] = x;
        }
        if (tid == 0) {
            scalars[state].a = 0u;
            scalars[state].b = 0u;
            ready[state] = 1u;
        }
    }
    __syncthreads();
}
