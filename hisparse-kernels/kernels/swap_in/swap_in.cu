// The GPU swap-in: one block per request, one launch per layer for the whole batch. It makes
// exactly the decisions of hisparse_policy::SwapInState::step (the semantics are written down in
// hisparse_policy::policy): hits keep their slots, victims are the misses' count of smallest
// (occupied, priority, slot) keys among the non-selected slots, misses in ascending position take
// them in ascending slot order, and each hook touches only its own slot. A second kernel,
// copy_misses, then copies every missed row from the mapped host tier into the hot buffer —
// or, given `fills`, the decisions name each miss's host row there (0 for a hit) and the
// attention (attention.cu) brings the rows in as it reads them.
//
// What the host validated (seats, selection ranges, output sizes) is trusted; what only the
// device holds is checked: a selected position at or beyond seq_len, or a host page id outside
// the page list or the tier, is never dereferenced — it is skipped (its location is -1, which
// attention reads as a fault) and the fault flag is raised for the host to turn into an error.
//
// The eviction policy's program (prelude, hooks, defaults) is spliced in below by
// cuda/sources.rs; the block size is a multiple of 32 (the launcher rounds it up). Every hook
// gets a PolicyEnv: the step, the scalars, the largest victim, and for its slot the token, the
// token's score (NaN without scores), whether a prefetch filled the slot unused, and the
// token's history word (0 where the policy keeps none). Per request the kernel counts hits,
// misses, evictions, useful prefetches (hits on prefetched slots) and wasted ones (prefetched
// slots evicted unused): COUNTS words. A second kernel, prefetch_in, brings nominated tokens in
// before a selection is known, as misses would come (prefetch.rs's semantics).

//@POLICY@
//@COMMON@

// The decisions of request blockIdx.x (all threads of the block call it): see above.
__device__ void swap_decide(const SwapArgs& a) {
    const SwapReq* __restrict__ reqs = a.reqs;
    const unsigned* __restrict__ selections = a.selections;
    int* __restrict__ slot_tokens = a.slot_tokens;
    SlotRecord* __restrict__ records = a.records;
    PolicyScalars* __restrict__ scalars = a.scalars;
    unsigned* __restrict__ ready = a.ready;
    unsigned char* __restrict__ prefetched_g = a.prefetched;
    unsigned* __restrict__ words_g = a.words;
    const float* __restrict__ scores = a.scores;
    int* __restrict__ locations = a.locations;
    unsigned* __restrict__ counts = a.counts;
    unsigned* __restrict__ miss_tokens = a.miss_tokens;
    unsigned* __restrict__ miss_slots = a.miss_slots;
    int* __restrict__ evicted = a.evicted;
    const unsigned* __restrict__ host_pages = a.host_pages;
    unsigned long long* __restrict__ fills = a.fills;
    unsigned* __restrict__ fault = a.fault;
    const SwapParams& p = a.p;
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ unsigned warp_sums[33];

    const SwapReq r = reqs[blockIdx.x];
    const unsigned B = p.device_buffer_size, K = r.sel_len, T = blockDim.x, tid = threadIdx.x;
    const unsigned long long state = (unsigned long long)r.seat * p.layers + p.layer;
    int* st = slot_tokens + state * B;
    SlotRecord* rec = records + state * B;
    const unsigned* sel_g = selections + r.sel_offset;
    int* loc = locations + r.sel_offset;
    const long long base = (long long)hot_seat_base(r.seat, B);
    StepCtx ctx;
    ctx.step = r.step;
    ctx.layer = p.layer;
    ctx.request = r.request;
    ctx.device_buffer_size = B;
    ctx.seed = p.seed;
    unsigned char* pf = prefetched_g + state * B;
    unsigned* words = (words_g && p.word_tokens) ? words_g + state * p.word_tokens : nullptr;
    HookState hs;
    hs.prefetched = pf;
    hs.words = words;
    hs.scores = scores ? scores + r.score_offset : nullptr;
    hs.word_tokens = words ? p.word_tokens : 0u;
    hs.seq_len = r.seq_len;

    if (r.seq_len <= B) {
        // Fast path: token t lives in slot t; place the tokens generated since.
        for (unsigned s = tid; s < r.seq_len; s += T)
            if (st[s] < 0) st[s] = (int)s;
        for (unsigned j = tid; j < K; j += T) {
            const unsigned t = sel_g[j];
            if (t < r.seq_len) {
                loc[j] = (int)(base + t);
            } else {
                loc[j] = -1;
                atomicOr(fault, 1u);
            }
        }
        if (fills)
            for (unsigned j = tid; j < K; j += T) fills[j + r.sel_offset] = 0ull;
        if (tid == 0) {
            counts[COUNTS * blockIdx.x] = K;
            for (unsigned c = 1; c < COUNTS; ++c) counts[COUNTS * blockIdx.x + c] = 0;
        }
        return;
    }

    // Shared layout: sel[K] u32 | prio[B] u64 | rec[B] SlotRecord | vslot[K] u32 | st[B] i32 |
    // flags[B] u8 | selflag[K] u8 | pf[B] u8: swap_smem_bytes(B, K) in all (both generated from Rust).
    unsigned* sel = reinterpret_cast<unsigned*>(smem);
    unsigned long long* prio = reinterpret_cast<unsigned long long*>(smem + swap_smem_after_sel(K));
    SlotRecord* rec_s = reinterpret_cast<SlotRecord*>(prio + B);
    unsigned* vslot = reinterpret_cast<unsigned*>(rec_s + B);
    int* st_s = reinterpret_cast<int*>(vslot + K);
    unsigned char* flags = reinterpret_cast<unsigned char*>(st_s + B);
    unsigned char* selflag = flags + B;
    unsigned char* pf_s = selflag + K;

    ready_records(st, rec, scalars, ready, state, B, ctx, hs);
    // The buffer's state (slot table, records, prefetched flags) is staged in shared memory, its
    // loads issued eight slots at a time per thread so that they overlap; every access below is
    // there, and it is written back at the end.
    int* const st_g = st;
    SlotRecord* const rec_g = rec;
    unsigned char* const pf_g = pf;
    for (unsigned s0 = tid; s0 < B; s0 += 8u * T) {
        int t8[8];
        SlotRecord x8[8];
        unsigned char f8[8];
#pragma unroll
        for (unsigned i = 0; i < 8; ++i) {
            const unsigned s = s0 + i * T;
            if (s < B) {
                t8[i] = st_g[s];
                x8[i] = rec_g[s];
                f8[i] = pf_g[s];
            }
        }
#pragma unroll
        for (unsigned i = 0; i < 8; ++i) {
            const unsigned s = s0 + i * T;
            if (s < B) {
                st_s[s] = t8[i];
                rec_s[s] = x8[i];
                pf_s[s] = f8[i];
            }
        }
    }
    st = st_s;
    rec = rec_s;
    pf = pf_s;
    hs.prefetched = pf_s;
    __syncthreads();
    const PolicyScalars scal = scalars[state];
    const unsigned newest = r.seq_len - 1;
    PolicyEnv env0;
    env0.ctx = ctx;
    env0.scalars = scal;
    env0.victim.any = false;
    env0.victim.occupied = false;
    env0.victim.priority = 0ull;
    env0.victim.slot = 0u;

    // 1. Hits and misses.
    for (unsigned j = tid; j < K; j += T) {
        const unsigned t = sel_g[j];
        // Out of range: kept out of the buffer's state (marked as a hit on nothing) and faulted.
        sel[j] = t < r.seq_len ? t : 0xffffffffu;
        selflag[j] = t < r.seq_len ? 0 : 1;
        if (t >= r.seq_len) {
            loc[j] = -1;
            atomicOr(fault, 1u);
        }
    }
    __syncthreads();
    for (unsigned s = tid; s < B; s += T) {
        int t = st[s];
        unsigned char f = 0;
        if (t >= 0) {
            f = FLAG_OCCUPIED;
            int j = find_sorted(sel, K, (unsigned)t);
            if (j >= 0) {
                f |= FLAG_HIT;
                selflag[j] = 1;
                loc[j] = (int)(base + s);
            }
        }
        flags[s] = f;
    }
    for (unsigned j = tid; j < K; j += T) {
        if (sel[j] == newest) {
            selflag[j] = 1;
            loc[j] = (int)(base + B);
        }
    }
    __syncthreads();
    // Misses left for the attention to bring in: each one's host row (plus one), hits 0.
    if (fills) {
        for (unsigned j = tid; j < K; j += T) {
            unsigned long long f = 0ull;
            if (!selflag[j]) {
                f = host_row_plus_one(r, sel[j], host_pages, p);
                if (f == 0ull) atomicOr(fault, 1u);
            }
            fills[r.sel_offset + j] = f;
        }
    }
    // 2. Priorities of the occupied evictables, before any record changes.
    for (unsigned s = tid; s < B; s += T)
        if (flags[s] == FLAG_OCCUPIED) prio[s] = policy_priority(rec[s], hook_env(env0, hs, s, (unsigned)st[s]));

    // Miss ranks in selection order (chunks of consecutive positions per thread).
    const unsigned kc = (K + T - 1) / T;
    unsigned mine = 0;
    for (unsigned j = tid * kc; j < min(K, (tid + 1) * kc); ++j) mine += selflag[j] == 0;
    unsigned M;
    const unsigned miss_before = block_scan(mine, warp_sums, &M);

    unsigned wasted = 0, used = 0;
    VictimKey vk = choose_victims(flags, prio, vslot, B, M, warp_sums);
    if (M > 0) {
        PolicyEnv envv = env0;
        envv.victim = vk;
        unsigned m = miss_before;
        for (unsigned j = tid * kc; j < min(K, (tid + 1) * kc); ++j) {
            if (selflag[j]) continue;
            const unsigned s = vslot[m];
            const int old = st[s];
            evicted[r.sel_offset + m] = old;
            if (old >= 0) {
                const unsigned w = policy_on_evict(rec[s], hook_env(envv, hs, s, (unsigned)old));
                if (words && (unsigned)old < p.word_tokens) words[old] = w;
                wasted += pf[s];
            }
            pf[s] = 0;
            st[s] = (int)sel[j];
            SlotRecord x = rec[s];
            policy_on_insert(x, hook_env(envv, hs, s, sel[j]));
            rec[s] = x;
            loc[j] = (int)(base + s);
            miss_tokens[r.sel_offset + m] = sel[j];
            miss_slots[r.sel_offset + m] = s;
            ++m;
        }
    }
    // 5. Hooks of hits and kept slots (each its own slot).
    PolicyEnv envs = env0;
    envs.victim = vk;
    unsigned ev = 0;
    for (unsigned s = tid; s < B; s += T) {
        const unsigned char f = flags[s];
        if (f & FLAG_HIT) {
            SlotRecord x = rec[s];
            policy_on_hit(x, hook_env(envs, hs, s, (unsigned)st[s]));
            rec[s] = x;
            used += pf[s];
            pf[s] = 0;
        } else if (f == FLAG_OCCUPIED && M > 0) {
            SlotRecord x = rec[s];
            policy_on_keep(x, hook_env(envs, hs, s, (unsigned)st[s]));
            rec[s] = x;
        }
        ev += (f & (FLAG_VICTIM | FLAG_OCCUPIED)) == (FLAG_VICTIM | FLAG_OCCUPIED);
    }
    unsigned evictions, used_total, wasted_total;
    block_scan(ev, warp_sums, &evictions);
    block_scan(used, warp_sums, &used_total);
    block_scan(wasted, warp_sums, &wasted_total);
    __syncthreads();
    for (unsigned s = tid; s < B; s += T) {
        st_g[s] = st_s[s];
        rec_g[s] = rec_s[s];
        pf_g[s] = pf_s[s];
    }
    if (tid == 0) {
        PolicyScalars x = scal;
        policy_finish(x, envs);
        scalars[state] = x;
        counts[COUNTS * blockIdx.x] = K - M;
        counts[COUNTS * blockIdx.x + 1] = M;
        counts[COUNTS * blockIdx.x + 2] = evictions;
        counts[COUNTS * blockIdx.x + 3] = used_total;
        counts[COUNTS * blockIdx.x + 4] = wasted_total;
    }
}

// Its arguments: one SwapArgs (the generated prelude), passed by value.
extern "C" __global__ void swap_in(const SwapArgs a) { swap_decide(a); }

// Copies misses first, first + stride, ... of request r (one warp each; `first` and `stride`
// count warps) from the mapped host tier into its hot buffer. The miss lists are read through
// L2 (another block of the same launch may have written them).
__device__ void copy_request_misses(const SwapReq& r, unsigned misses, const unsigned* miss_tokens,
                                    const unsigned* miss_slots, const unsigned* __restrict__ host_pages,
                                    unsigned char* __restrict__ hot_rows, unsigned* __restrict__ fault,
                                    const SwapParams& p, unsigned first, unsigned stride) {
    const unsigned lane = threadIdx.x & 31;
    const long long base = (long long)hot_seat_base(r.seat, p.device_buffer_size);
    const unsigned char* host = reinterpret_cast<const unsigned char*>(p.host_base);
    for (unsigned m = first; m < misses; m += stride) {
        const unsigned tok = __ldcg(miss_tokens + r.sel_offset + m);
        const unsigned s = __ldcg(miss_slots + r.sel_offset + m);
        const unsigned long long row = tok < r.seq_len ? host_row_plus_one(r, tok, host_pages, p) : 0ull;
        if (row == 0ull) {
            if (lane == 0) atomicOr(fault, 1u);
            continue;
        }
        copy_row(host + (row - 1ull) * p.row_bytes, hot_rows + (unsigned long long)(base + s) * p.row_bytes, p.row_bytes, lane);
    }
}

// The missed rows, host -> device, for a whole launch of the swap-in: block (x, y) copies the
// misses y, y + gridDim.y, ... (in warps) of request x, a warp per row, 16 bytes per lane. Spread
// over many blocks per request so that enough row reads are in flight to fill the PCIe link.
extern "C" __global__ void copy_misses(const SwapReq* __restrict__ reqs, const unsigned* __restrict__ counts,
                                       const unsigned* __restrict__ miss_tokens, const unsigned* __restrict__ miss_slots,
                                       const unsigned* __restrict__ host_pages, unsigned char* __restrict__ hot_rows,
                                       unsigned* __restrict__ fault, SwapParams p) {
    const SwapReq r = reqs[blockIdx.x];
    const unsigned misses = counts[COUNTS * blockIdx.x + 1];
    const unsigned warps = blockDim.x >> 5;
    copy_request_misses(r, misses, miss_tokens, miss_slots, host_pages, hot_rows, fault, p,
                        blockIdx.y * warps + (threadIdx.x >> 5), gridDim.y * warps);
}

// Gathers rows from the mapped host tier into device rows (the miss copy alone, for measuring
// its bandwidth): row i goes from host row src_rows[i] to device row dst_rows[i].
extern "C" __global__ void gather_rows(unsigned long long host_base, const unsigned long long* __restrict__ src_rows,
                                       const unsigned* __restrict__ dst_rows, unsigned n, unsigned row_bytes,
                                       unsigned char* __restrict__ dst) {
    const unsigned lane = threadIdx.x & 31;
    const unsigned warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const unsigned warps = (gridDim.x * blockDim.x) >> 5;
    const unsigned char* host = reinterpret_cast<const unsigned char*>(host_base);
    for (unsigned i = warp; i < n; i += warps)
        copy_row(host + src_rows[i] * row_bytes, dst + (unsigned long long)dst_rows[i] * row_bytes, row_bytes, lane);
}
