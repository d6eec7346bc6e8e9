// The GPU swap-in: one block per request, one launch per layer for the whole batch. It makes
// exactly the decisions of hisparse_policy::SwapInState::step (the semantics are written down in
// hisparse_policy::policy): hits keep their slots, victims are the misses' count of smallest
// (occupied, priority, slot) keys among the non-selected slots, misses in ascending position take
// them in ascending slot order, and each hook touches only its own slot. A second kernel,
// copy_misses, then copies every missed row from the mapped host tier into the hot buffer.
//
// What the host validated (seats, selection ranges, output sizes) is trusted; what only the
// device holds is checked: a selected position at or beyond seq_len, or a host page id outside
// the page list or the tier, is never dereferenced — it is skipped (its location is -1, which
// attention reads as a fault) and the fault flag is raised for the host to turn into an error.
//
// The eviction policy's hooks are spliced in below (after the prelude's types) by
// cuda/sources.rs; the block size is a multiple of 32 (the launcher rounds it up).

//@POLICY@

struct SwapReq {
    unsigned seat;          // hot-buffer seat of the request
    unsigned seq_len;       // tokens, the newest (seq_len - 1) included
    unsigned step;          // the request's decode step (from 1)
    unsigned sel_offset;    // first selected position in `selections`
    unsigned sel_len;       // selected positions (ascending)
    unsigned page_offset;   // first host page of the request in `host_pages`
    unsigned long long request;
};

struct SwapParams {
    unsigned layer;
    unsigned layers;
    unsigned buffer_slots;        // regular slots B; the reserved newest slot is B
    unsigned row_bytes;           // a multiple of 16
    unsigned page_tokens;
    unsigned host_pages_per_layer;
    unsigned host_pages_len;      // entries of host_pages
    unsigned pad;
    unsigned long long host_base; // mapped host-tier address (layer-major pages)
    unsigned long long seed;
};

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

__device__ int find_sorted(const unsigned* a, unsigned n, unsigned x) {
    unsigned lo = 0, hi = n;
    while (lo < hi) {
        unsigned mid = (lo + hi) >> 1;
        if (a[mid] < x) lo = mid + 1; else hi = mid;
    }
    return (lo < n && a[lo] == x) ? (int)lo : -1;
}

extern "C" __global__ void swap_in(const SwapReq* __restrict__ reqs, const unsigned* __restrict__ selections,
                                   int* __restrict__ slot_tokens, SlotRecord* __restrict__ records,
                                   PolicyScalars* __restrict__ scalars, unsigned* __restrict__ ready,
                                   unsigned char* __restrict__ hot_rows, int* __restrict__ locations,
                                   unsigned* __restrict__ counts, unsigned* __restrict__ miss_tokens,
                                   unsigned* __restrict__ miss_slots, int* __restrict__ evicted,
                                   unsigned* __restrict__ fault, SwapParams p) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ unsigned warp_sums[33];
    __shared__ unsigned hist[256];
    __shared__ unsigned s_ready, s_need, s_eq_slot;
    __shared__ unsigned long long s_prefix;

    const SwapReq r = reqs[blockIdx.x];
    const unsigned B = p.buffer_slots, K = r.sel_len, T = blockDim.x, tid = threadIdx.x;
    const unsigned long long state = (unsigned long long)r.seat * p.layers + p.layer;
    int* st = slot_tokens + state * B;
    SlotRecord* rec = records + state * B;
    const unsigned* sel_g = selections + r.sel_offset;
    int* loc = locations + r.sel_offset;
    const long long base = (long long)r.seat * (B + 1);
    StepCtx ctx;
    ctx.step = r.step;
    ctx.layer = p.layer;
    ctx.request = r.request;
    ctx.buffer_slots = B;
    ctx.seed = p.seed;

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
        if (tid == 0) {
            counts[3 * blockIdx.x] = K;
            counts[3 * blockIdx.x + 1] = 0;
            counts[3 * blockIdx.x + 2] = 0;
        }
        return;
    }

    // Shared layout: sel[K] u32 | prio[B] u64 | vslot[K] u32 | flags[B] u8 | selflag[K] u8.
    unsigned* sel = reinterpret_cast<unsigned*>(smem);
    unsigned long long* prio = reinterpret_cast<unsigned long long*>(smem + ((4u * K + 15u) & ~15u));
    unsigned* vslot = reinterpret_cast<unsigned*>(prio + B);
    unsigned char* flags = reinterpret_cast<unsigned char*>(vslot + K);
    unsigned char* selflag = flags + B;

    if (tid == 0) s_ready = ready[state];
    __syncthreads();
    if (!s_ready) {
        // First policy-managed step (or a new policy): records rebuilt from the slots.
        StepCtx init = ctx;
        init.step = ctx.step - 1;
        for (unsigned s = tid; s < B; s += T) {
            SlotRecord x;
            x.a = 0u;
            x.b = 0u;
            if (st[s] >= 0) policy_on_insert(x, init);
            rec[s] = x;
        }
        if (tid == 0) {
            scalars[state].a = 0u;
            scalars[state].b = 0u;
            ready[state] = 1u;
        }
        __syncthreads();
    }
    const PolicyScalars scal = scalars[state];
    const unsigned newest = r.seq_len - 1;

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
    // 2. Priorities of the occupied evictables, before any record changes.
    for (unsigned s = tid; s < B; s += T)
        if (flags[s] == FLAG_OCCUPIED) prio[s] = policy_priority(rec[s], s, (unsigned)st[s], scal, ctx);

    // Miss ranks in selection order (chunks of consecutive positions per thread).
    const unsigned kc = (K + T - 1) / T;
    unsigned mine = 0;
    for (unsigned j = tid * kc; j < min(K, (tid + 1) * kc); ++j) mine += selflag[j] == 0;
    unsigned M;
    const unsigned miss_before = block_scan(mine, warp_sums, &M);

    // Empty slots (not hit, not occupied), in slot order.
    const unsigned bc = (B + T - 1) / T;
    const unsigned s0 = min(B, tid * bc), s1 = min(B, (tid + 1) * bc);
    unsigned empties = 0;
    for (unsigned s = s0; s < s1; ++s) empties += flags[s] == 0;
    unsigned E;
    const unsigned empty_before = block_scan(empties, warp_sums, &E);

    VictimKey vk;
    vk.any = M > 0;
    vk.occupied = false;
    vk.priority = 0ull;
    vk.slot = 0u;
    if (M > 0) {
        // 3. Victims: empties first (slot order), then the smallest occupied keys.
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
            // Radix select the (M - E)-th smallest priority among occupied evictables, 8 bits a pass.
            if (tid == 0) {
                s_need = M - E;
                s_prefix = 0ull;
            }
            __syncthreads();
            for (int shift = 56; shift >= 0; shift -= 8) {
                for (unsigned i = tid; i < 256; i += T) hist[i] = 0u;
                __syncthreads();
                const unsigned long long prefix = s_prefix;
                const unsigned long long mask = shift == 56 ? 0ull : (~0ull << (shift + 8));
                for (unsigned s = tid; s < B; s += T)
                    if (flags[s] == FLAG_OCCUPIED && ((prio[s] ^ prefix) & mask) == 0ull)
                        atomicAdd(&hist[(unsigned)(prio[s] >> shift) & 255u], 1u);
                __syncthreads();
                if (tid == 0) {
                    unsigned need = s_need, cum = 0, b = 0;
                    for (; b < 255u && cum + hist[b] < need; ++b) cum += hist[b];
                    s_need = need - cum;
                    s_prefix = prefix | ((unsigned long long)b << shift);
                }
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
        // 4. Victim ranks in slot order; miss m takes victim m.
        unsigned v = 0;
        for (unsigned s = s0; s < s1; ++s) v += (flags[s] & FLAG_VICTIM) != 0;
        unsigned vt;
        unsigned vr = block_scan(v, warp_sums, &vt);
        for (unsigned s = s0; s < s1; ++s)
            if (flags[s] & FLAG_VICTIM) vslot[vr++] = s;
        __syncthreads();
        unsigned m = miss_before;
        for (unsigned j = tid * kc; j < min(K, (tid + 1) * kc); ++j) {
            if (selflag[j]) continue;
            const unsigned s = vslot[m];
            const int old = st[s];
            evicted[r.sel_offset + m] = old;
            st[s] = (int)sel[j];
            SlotRecord x = rec[s];
            policy_on_insert(x, ctx);
            rec[s] = x;
            loc[j] = (int)(base + s);
            miss_tokens[r.sel_offset + m] = sel[j];
            miss_slots[r.sel_offset + m] = s;
            ++m;
        }
    }
    // 5. Hooks of hits and kept slots (each its own slot).
    unsigned ev = 0;
    for (unsigned s = tid; s < B; s += T) {
        const unsigned char f = flags[s];
        if (f & FLAG_HIT) {
            SlotRecord x = rec[s];
            policy_on_hit(x, ctx);
            rec[s] = x;
        } else if (f == FLAG_OCCUPIED && M > 0) {
            SlotRecord x = rec[s];
            policy_on_keep(x, s, scal, vk, ctx);
            rec[s] = x;
        }
        ev += (f & (FLAG_VICTIM | FLAG_OCCUPIED)) == (FLAG_VICTIM | FLAG_OCCUPIED);
    }
    unsigned evictions;
    block_scan(ev, warp_sums, &evictions);
    if (tid == 0) {
        PolicyScalars x = scal;
        policy_finish(x, vk, ctx);
        scalars[state] = x;
        counts[3 * blockIdx.x] = K - M;
        counts[3 * blockIdx.x + 1] = M;
        counts[3 * blockIdx.x + 2] = evictions;
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
    const unsigned misses = counts[3 * blockIdx.x + 1];
    const unsigned lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const unsigned first = blockIdx.y * warps + (threadIdx.x >> 5), stride = gridDim.y * warps;
    const long long base = (long long)r.seat * (p.buffer_slots + 1);
    const unsigned char* host = reinterpret_cast<const unsigned char*>(p.host_base);
    for (unsigned m = first; m < misses; m += stride) {
        const unsigned tok = miss_tokens[r.sel_offset + m];
        const unsigned s = miss_slots[r.sel_offset + m];
        const unsigned long long at = (unsigned long long)r.page_offset + tok / p.page_tokens;
        if (tok >= r.seq_len || at >= p.host_pages_len) {
            if (lane == 0) atomicOr(fault, 1u);
            continue;
        }
        const unsigned page = host_pages[at];
        if (page >= p.host_pages_per_layer) {
            if (lane == 0) atomicOr(fault, 1u);
            continue;
        }
        const unsigned long long src =
            ((unsigned long long)p.layer * p.host_pages_per_layer + page) * p.page_tokens + tok % p.page_tokens;
        copy_row(host + src * p.row_bytes, hot_rows + (unsigned long long)(base + s) * p.row_bytes, p.row_bytes, lane);
    }
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
