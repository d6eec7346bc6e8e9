// The prefetch kernel (hisparse_policy::SwapInState::prefetch, exactly): a prefetcher's
// nominated tokens enter a (request, layer)'s buffer before its selection is known, as misses
// would — victims the smallest (occupied, priority, slot) keys among the slots whose token is not
// protected, fills in ascending position taking them in ascending slot order, on_evict and
// on_insert for the refilled slots and on_keep for the evictable slots passed over (all with the
// largest victim), then finish_step, and the slots marked prefetched. One block
// per request. A request is a SwapReq whose sel_offset/sel_len name its candidates (in order of
// preference) and whose `prefetch_budget` is its budget; prot[2 i], prot[2 i + 1] are the offset and length
// of its protected positions (ascending) in `protect`. The fills (ascending) go to
// miss_tokens/miss_slots from sel_offset, and counts to {0, fills, evictions, 0, wasted}, so that
// copy_misses copies their rows. A candidate at or beyond seq_len is skipped and raises the
// fault flag. Shared memory: tok[Kp] u32 | rank[Kp] u32 | fills[K] u32 | vslot[K] u32 | prio[B]
// u64 | flags[B] u8 | elig[K] u8, with Kp the power of two at or above K = sel_len.

__device__ void bitonic_sort_pairs(unsigned* key, unsigned* val, unsigned n) {
    const unsigned tid = threadIdx.x, T = blockDim.x;
    for (unsigned size = 2; size <= n; size <<= 1) {
        for (unsigned stride = size >> 1; stride > 0; stride >>= 1) {
            for (unsigned i = tid; i < n; i += T) {
                const unsigned j = i ^ stride;
                if (j > i) {
                    const bool up = (i & size) == 0;
                    const bool greater = key[i] > key[j] || (key[i] == key[j] && val[i] > val[j]);
                    if (greater == up) {
                        unsigned k = key[i];
                        key[i] = key[j];
                        key[j] = k;
                        k = val[i];
                        val[i] = val[j];
                        val[j] = k;
                    }
                }
            }
            __syncthreads();
        }
    }
}

// Its arguments: one PrefetchArgs (the generated prelude), passed by value.
extern "C" __global__ void prefetch_in(const PrefetchArgs a) {
    const SwapReq* __restrict__ reqs = a.reqs;
    const unsigned* __restrict__ candidates = a.candidates;
    const unsigned* __restrict__ protect = a.protect;
    const unsigned* __restrict__ prot = a.prot;
    int* __restrict__ slot_tokens = a.slot_tokens;
    SlotRecord* __restrict__ records = a.records;
    PolicyScalars* __restrict__ scalars = a.scalars;
    unsigned* __restrict__ ready = a.ready;
    unsigned char* __restrict__ prefetched_g = a.prefetched;
    unsigned* __restrict__ words_g = a.words;
    const float* __restrict__ scores = a.scores;
    unsigned* __restrict__ counts = a.counts;
    unsigned* __restrict__ miss_tokens = a.miss_tokens;
    unsigned* __restrict__ miss_slots = a.miss_slots;
    int* __restrict__ evicted = a.evicted;
    unsigned* __restrict__ fault = a.fault;
    const SwapParams p = a.p;
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ unsigned warp_sums[33];
    const SwapReq r = reqs[blockIdx.x];
    const unsigned B = p.device_buffer_size, K = r.sel_len, T = blockDim.x, tid = threadIdx.x;
    const unsigned budget = r.prefetch_budget;
    if (r.seq_len <= B || budget == 0 || K == 0) {
        if (tid == 0)
            for (unsigned c = 0; c < COUNTS; ++c) counts[COUNTS * blockIdx.x + c] = 0;
        return;
    }
    unsigned Kp = 1;
    while (Kp < K) Kp <<= 1;
    unsigned* tok = reinterpret_cast<unsigned*>(smem);
    unsigned* rank = tok + Kp;
    unsigned* fills = rank + Kp;
    unsigned* vslot = fills + K;
    unsigned long long* prio = reinterpret_cast<unsigned long long*>(smem + prefetch_smem_after_keys(Kp, K));
    unsigned char* flags = reinterpret_cast<unsigned char*>(prio + B);
    unsigned char* elig = flags + B;

    const unsigned long long state = (unsigned long long)r.seat * p.layers + p.layer;
    int* st = slot_tokens + state * B;
    SlotRecord* rec = records + state * B;
    unsigned char* pf = prefetched_g + state * B;
    unsigned* words = (words_g && p.word_tokens) ? words_g + state * p.word_tokens : nullptr;
    const unsigned* cand = candidates + r.sel_offset;
    const unsigned* prot_r = protect + prot[2 * blockIdx.x];
    const unsigned plen = prot[2 * blockIdx.x + 1];
    StepCtx ctx;
    ctx.step = r.step;
    ctx.layer = p.layer;
    ctx.request = r.request;
    ctx.device_buffer_size = B;
    ctx.seed = p.seed;
    HookState hs;
    hs.prefetched = pf;
    hs.words = words;
    hs.scores = scores ? scores + r.score_offset : nullptr;
    hs.word_tokens = words ? p.word_tokens : 0u;
    hs.seq_len = r.seq_len;
    ready_records(st, rec, scalars, ready, state, B, ctx, hs);
    const unsigned newest = r.seq_len - 1;

    // 1. The candidates sorted by (position, preference); a position out of range faults.
    for (unsigned i = tid; i < Kp; i += T) {
        unsigned t = 0xffffffffu;
        if (i < K) {
            t = cand[i];
            if (t >= r.seq_len) {
                atomicOr(fault, 1u);
                t = 0xfffffffeu;
            }
        }
        tok[i] = t;
        rank[i] = i;
    }
    __syncthreads();
    bitonic_sort_pairs(tok, rank, Kp);
    // 2. Eligible: in range, not the newest, the most preferred of its repeats, not resident.
    for (unsigned i = tid; i < Kp; i += T) {
        const unsigned t = tok[i];
        if (rank[i] < K) elig[rank[i]] = t < r.seq_len && t != newest && (i == 0 || tok[i - 1] != t);
    }
    __syncthreads();
    for (unsigned s = tid; s < B; s += T) {
        const int t = st[s];
        unsigned char f = 0;
        if (t >= 0) {
            f = FLAG_OCCUPIED;
            const int j = find_sorted(tok, Kp, (unsigned)t);
            if (j >= 0) elig[rank[j]] = 0;
            if (find_sorted(prot_r, plen, (unsigned)t) >= 0) f |= FLAG_HIT;  // protected
        }
        flags[s] = f;
    }
    __syncthreads();
    // 3. How many: the budget, the slots that may be given up, the eligible candidates.
    const unsigned bc = (B + T - 1) / T, s0 = min(B, tid * bc), s1 = min(B, (tid + 1) * bc);
    unsigned ev_mine = 0;
    for (unsigned s = s0; s < s1; ++s) ev_mine += flags[s] == 0 || flags[s] == FLAG_OCCUPIED;
    unsigned evictable;
    block_scan(ev_mine, warp_sums, &evictable);
    const unsigned kc = (K + T - 1) / T, k0 = min(K, tid * kc), k1 = min(K, (tid + 1) * kc);
    unsigned el_mine = 0;
    for (unsigned j = k0; j < k1; ++j) el_mine += elig[j];
    unsigned eligible;
    unsigned el_before = block_scan(el_mine, warp_sums, &eligible);
    const unsigned n = min(budget, min(evictable, eligible));
    // 4. The n most preferred eligible candidates are kept.
    for (unsigned j = k0; j < k1; ++j) {
        if (elig[j]) {
            elig[j] = el_before < n ? 1 : 0;
            ++el_before;
        }
    }
    __syncthreads();
    // 5. The kept positions in ascending order.
    const unsigned pc = (Kp + T - 1) / T, p0 = min(Kp, tid * pc), p1 = min(Kp, (tid + 1) * pc);
    unsigned kept_mine = 0;
    for (unsigned i = p0; i < p1; ++i) kept_mine += rank[i] < K && elig[rank[i]];
    unsigned kept_total;
    unsigned kept_before = block_scan(kept_mine, warp_sums, &kept_total);
    for (unsigned i = p0; i < p1; ++i)
        if (rank[i] < K && elig[rank[i]]) fills[kept_before++] = tok[i];
    __syncthreads();
    // 6. Victims among the slots that may be given up.
    PolicyEnv env0;
    env0.ctx = ctx;
    env0.scalars = scalars[state];
    env0.victim.any = false;
    env0.victim.occupied = false;
    env0.victim.priority = 0ull;
    env0.victim.slot = 0u;
    for (unsigned s = tid; s < B; s += T)
        if (flags[s] == FLAG_OCCUPIED) prio[s] = policy_priority(rec[s], hook_env(env0, hs, s, (unsigned)st[s]));
    __syncthreads();
    PolicyEnv envv = env0;
    envv.victim = choose_victims(flags, prio, vslot, B, n, warp_sums);
    // 7. Fill i (ascending position) takes victim i (ascending slot).
    unsigned wasted = 0, evictions = 0;
    for (unsigned i = tid; i < n; i += T) {
        const unsigned t = fills[i], s = vslot[i];
        const int old = st[s];
        evicted[r.sel_offset + i] = old;
        if (old >= 0) {
            const unsigned w = policy_on_evict(rec[s], hook_env(envv, hs, s, (unsigned)old));
            if (words && (unsigned)old < p.word_tokens) words[old] = w;
            wasted += pf[s];
            ++evictions;
        }
        st[s] = (int)t;
        PolicyEnv e = hook_env(envv, hs, s, t);
        e.prefetched = 1u;
        SlotRecord x = rec[s];
        policy_on_insert(x, e);
        rec[s] = x;
        pf[s] = 1;
        miss_tokens[r.sel_offset + i] = t;
        miss_slots[r.sel_offset + i] = s;
    }
    // 8. The evictable slots passed over age as kept slots do (each its own slot: no race with 7).
    if (n > 0) {
        for (unsigned s = tid; s < B; s += T) {
            if (flags[s] == FLAG_OCCUPIED) {
                SlotRecord x = rec[s];
                policy_on_keep(x, hook_env(envv, hs, s, (unsigned)st[s]));
                rec[s] = x;
            }
        }
    }
    unsigned wasted_total, evictions_total;
    block_scan(wasted, warp_sums, &wasted_total);
    block_scan(evictions, warp_sums, &evictions_total);
    if (tid == 0) {
        if (n > 0) {
            PolicyScalars x = scalars[state];
            policy_finish(x, envv);
            scalars[state] = x;
        }
        counts[COUNTS * blockIdx.x] = 0;
        counts[COUNTS * blockIdx.x + 1] = n;
        counts[COUNTS * blockIdx.x + 2] = evictions_total;
        counts[COUNTS * blockIdx.x + 3] = 0;
        counts[COUNTS * blockIdx.x + 4] = wasted_total;
    }
}
