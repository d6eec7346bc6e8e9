// Where each selected token is before any decision is made (miss_fill = "deferred"): a hit's
// (or the newest token's) hot-buffer row, or for a miss its host-tier row plus one in `fills`
// (its location then names the request's reserved slot, a placeholder the attention checks only
// for range: it reads the row from the host tier and writes nothing). The swap-in proper
// (swap_decide and the copies) follows on another stream, making exactly the decisions it would
// have made here, for the steps after; this kernel changes no state.
//
// Grid (requests, chunks of LOCATE_CHUNK selected positions), any multiple of 32 threads: each
// block scans the whole slot table for the tokens of its own chunk (ascending, so a token
// outside the chunk's first..last is passed over without a search), so no block waits for
// another. It also copies its chunk's positions to `sel_copy`, which the deferred swap-in reads
// after the next layer has overwritten the selection buffer. A position at or beyond seq_len,
// or a miss whose page id is out of range, gets location -1 and raises the fault flag. An
// unsorted selection (the device's data) can only turn hits into misses, read from the host
// tier, whose rows are the same bytes.
//
// Given `staging` (miss_fill = "deferred-gather"), the block also copies its chunk's missed rows
// from the mapped host tier into `staging` at their selection index (row sel_offset + j, its
// warps one row each, so that many host reads are in flight), and a miss's fill word names that
// staging row plus one instead of its host row: the attention then reads every row from device
// memory.

// LOCATE_CHUNK: the generated prelude.

extern "C" __global__ void locate_in_hot(const SwapReq* __restrict__ reqs, const unsigned* __restrict__ selections,
                                         const int* __restrict__ slot_tokens, const unsigned* __restrict__ host_pages,
                                         int* __restrict__ locations, unsigned long long* __restrict__ fills,
                                         unsigned* __restrict__ sel_copy, unsigned char* __restrict__ staging,
                                         unsigned* __restrict__ fault, SwapParams p) {
    __shared__ unsigned sel[LOCATE_CHUNK];
    __shared__ int hit[LOCATE_CHUNK];
    __shared__ unsigned long long miss_row[LOCATE_CHUNK];  // host row of the chunk's q-th miss
    __shared__ unsigned miss_at[LOCATE_CHUNK];             // and its index in the chunk
    __shared__ unsigned misses;
    const SwapReq r = reqs[blockIdx.x];
    const unsigned j0 = blockIdx.y * LOCATE_CHUNK;
    if (j0 >= r.sel_len) return;  // uniform over the block
    const unsigned n = min((unsigned)LOCATE_CHUNK, r.sel_len - j0);
    const unsigned B = p.device_buffer_size, tid = threadIdx.x, T = blockDim.x;
    const long long base = (long long)hot_seat_base(r.seat, B);
    const unsigned o = r.sel_offset + j0;
    for (unsigned i = tid; i < n; i += T) {
        const unsigned t = selections[o + i];
        sel[i] = t;
        hit[i] = -1;
        sel_copy[o + i] = t;
    }
    if (tid == 0) misses = 0;
    __syncthreads();
    if (r.seq_len > B) {
        const int* st = slot_tokens + ((unsigned long long)r.seat * p.layers + p.layer) * B;
        const unsigned lo = sel[0], hi = sel[n - 1];
        for (unsigned s = tid; s < B; s += T) {
            const int t = st[s];
            if (t >= 0 && (unsigned)t >= lo && (unsigned)t <= hi) {
                const int k = find_sorted(sel, n, (unsigned)t);
                if (k >= 0) hit[k] = (int)s;
            }
        }
        __syncthreads();
    }
    for (unsigned i = tid; i < n; i += T) {
        const unsigned t = sel[i];
        long long loc = base + B;
        unsigned long long f = 0ull;
        if (t >= r.seq_len) {
            loc = -1;
            atomicOr(fault, 1u);
        } else if (r.seq_len <= B) {
            loc = base + t;  // the fast path: token t lives in slot t
        } else if (t != r.seq_len - 1 && hit[i] >= 0) {
            loc = base + hit[i];
        } else if (t != r.seq_len - 1) {
            f = host_row_plus_one(r, t, host_pages, p);
            if (f == 0ull) {
                loc = -1;
                atomicOr(fault, 1u);
            } else if (staging) {
                const unsigned q = atomicAdd(&misses, 1u);
                miss_row[q] = f - 1ull;
                miss_at[q] = i;
                f = (unsigned long long)(o + i) + 1ull;
            }
        }
        locations[o + i] = (int)loc;
        fills[o + i] = f;
    }
    if (!staging) return;  // uniform over the block
    __syncthreads();
    const unsigned lane = tid & 31, warps = T >> 5;
    const unsigned char* host = reinterpret_cast<const unsigned char*>(p.host_base);
    for (unsigned q = tid >> 5; q < misses; q += warps)
        copy_row(host + miss_row[q] * p.row_bytes, staging + (unsigned long long)(o + miss_at[q]) * p.row_bytes,
                 p.row_bytes, lane);
}

// The deferred swap-in's copies under "deferred-gather": every miss of request x comes from the
// staging row the locate gathered it into (its selection index, found again in the selection
// copy), device to device, block (x, y) taking misses y, y + gridDim.y, ... (in warps). The
// locate and the decisions read the same slot table, so each miss was gathered; a token the
// selection copy lacks (which cannot happen) is skipped.
extern "C" __global__ void copy_staged_misses(const SwapReq* __restrict__ reqs, const unsigned* __restrict__ counts,
                                              const unsigned* __restrict__ miss_tokens,
                                              const unsigned* __restrict__ miss_slots,
                                              const unsigned* __restrict__ sel_copy,
                                              const unsigned char* __restrict__ staging,
                                              unsigned char* __restrict__ hot_rows, SwapParams p) {
    const SwapReq r = reqs[blockIdx.x];
    const unsigned misses = __ldcg(counts + COUNTS * blockIdx.x + 1);
    const unsigned lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const long long base = (long long)hot_seat_base(r.seat, p.device_buffer_size);
    const unsigned* sel = sel_copy + r.sel_offset;
    for (unsigned m = blockIdx.y * warps + (threadIdx.x >> 5); m < misses; m += gridDim.y * warps) {
        const unsigned tok = __ldcg(miss_tokens + r.sel_offset + m), s = __ldcg(miss_slots + r.sel_offset + m);
        const int j = find_sorted(sel, r.sel_len, tok);
        if (j < 0) continue;
        copy_row(staging + (unsigned long long)(r.sel_offset + (unsigned)j) * p.row_bytes,
                 hot_rows + (unsigned long long)(base + s) * p.row_bytes, p.row_bytes, lane);
    }
}

// The misses of `miss_fill = "hits-first"`, on the transfer stream while the attention over the
// hits runs on the main stream: for every selected position whose fill word the locate set (a
// host-tier row plus one), its row is copied from the mapped host tier into `staging` at its
// selection index, as "deferred-gather" places it; and the misses are listed in selection order,
// request by request (`list[sel_offset + q]` the staging row of request x's q-th miss, and
// `spans[x]` = {sel_offset, misses}), for the attention over the misses that follows.
//
// Grid (requests, chunks of LOCATE_CHUNK positions), 128 threads and no shared memory but a few
// words, so that a block fits on an SM beside an attention block. Each block counts the misses of
// the chunks before its own (reading their fill words), ranks its own by ballots in order, and
// its warps copy one row each at a time. The order, and so the list, depends only on the fills.
// A fill word past the host tier raises the fault flag and its staging row is left as it was.
//
// Without `staging` (miss_fill = "copy-engine") nothing is copied: the list and spans are
// written as above, and for the host's gather also each listed miss's host-tier row
// (`host_rows[sel_offset + q]`, ~0u past the tier) and the request count (`header[0]`), into
// mapped host memory.
// GATHER_THREADS: the generated prelude.


extern "C" __global__ void __launch_bounds__(GATHER_THREADS) gather_misses(
    const SwapReq* __restrict__ reqs, const unsigned long long* __restrict__ fills, unsigned char* __restrict__ staging,
    int* __restrict__ list, Span* __restrict__ spans, unsigned* __restrict__ host_rows,
    unsigned* __restrict__ header, unsigned* __restrict__ fault, SwapParams p) {
    __shared__ unsigned warp_misses[GATHER_THREADS / 32];
    const SwapReq r = reqs[blockIdx.x];
    const unsigned j0 = blockIdx.y * LOCATE_CHUNK, tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
    if (header && blockIdx.x == 0 && blockIdx.y == 0 && tid == 0) header[0] = gridDim.x;
    if (j0 >= r.sel_len) {
        if (blockIdx.y == 0 && tid == 0) spans[blockIdx.x] = Span{r.sel_offset, 0ull};
        return;  // uniform over the block
    }
    const unsigned long long* f = fills + r.sel_offset;
    unsigned before = 0;
    for (unsigned k = 0; k < j0; k += GATHER_THREADS) before += __syncthreads_count(k + tid < j0 && f[k + tid] != 0ull);
    const unsigned n = min((unsigned)LOCATE_CHUNK, r.sel_len - j0);
    const unsigned char* host = reinterpret_cast<const unsigned char*>(p.host_base);
    const unsigned long long host_rows_n = (unsigned long long)p.layers * p.host_pages_per_layer * p.page_tokens;
    unsigned q0 = before;
    for (unsigned k = 0; k < n; k += GATHER_THREADS) {
        const unsigned i = k + tid;
        const unsigned long long fw = i < n ? f[j0 + i] : 0ull;
        const unsigned ballot = __ballot_sync(0xffffffffu, fw != 0ull);
        if (lane == 0) warp_misses[wid] = __popc(ballot);
        __syncthreads();
        unsigned q = q0, total = 0;
        for (unsigned w = 0; w < GATHER_THREADS / 32; ++w) {
            if (w < wid) q += warp_misses[w];
            total += warp_misses[w];
        }
        q += __popc(ballot & ((1u << lane) - 1u));
        if (fw != 0ull) {
            list[r.sel_offset + q] = (int)(r.sel_offset + j0 + i);
            // For the host's gather: the row, or ~0u for a fill word past the tier (skipped).
            if (host_rows) host_rows[r.sel_offset + q] = fw - 1ull < host_rows_n ? (unsigned)(fw - 1ull) : ~0u;
        }
        if (!staging) {  // the host gathers (copy-engine): list only
            if (fw != 0ull && fw - 1ull >= host_rows_n) atomicOr(fault, 1u);
            q0 += total;
            __syncthreads();
            continue;
        }
        // The warp copies its own misses, one row at a time, in ballot order.
        for (unsigned b = ballot; b != 0u; b &= b - 1u) {
            const unsigned src_lane = __ffs(b) - 1u;
            const unsigned long long row = __shfl_sync(0xffffffffu, fw, src_lane) - 1ull;
            const unsigned at = j0 + k + 32 * wid + src_lane;
            if (row >= host_rows_n) {  // not a fill word the locate wrote: the row reads as zeros
                if (lane == 0) atomicOr(fault, 1u);
                continue;
            }
            copy_row(host + row * p.row_bytes, staging + (unsigned long long)(r.sel_offset + at) * p.row_bytes,
                     p.row_bytes, lane);
        }
        q0 += total;
        __syncthreads();  // warp_misses is rewritten next round
    }
    if (j0 + n == r.sel_len && tid == 0) spans[blockIdx.x] = Span{r.sel_offset, q0};
}

// The device side of miss_fill = "copy-engine", after the host's gather and the copy engine's
// copy: request x's q-th listed miss (`gather_misses` without staging wrote the list and spans)
// has ordinal base(x) + q among the layer's misses, base(x) the misses of the requests before x;
// the host gathered ordinals below `landed_rows` into `landed`, in order, which the copy engine
// brought to the device. Each listed miss's row goes into `staging` at its selection index —
// from `landed` by its ordinal, or past `landed_rows` straight from the mapped host tier — and
// its fill word then names that staging row plus one, as under "deferred-gather": the attention
// and the deferred swap-in read the same rows from the same place.
//
// Grid (requests, chunks of LOCATE_CHUNK misses), any multiple of 32 threads: a warp a row. A
// span or list entry outside the step's `sel_end` selection entries, or a fill word past the
// tier, raises the fault flag and is skipped.
extern "C" __global__ void scatter_landed_misses(const Span* __restrict__ spans, const int* __restrict__ list,
                                                 unsigned long long* __restrict__ fills,
                                                 const unsigned char* __restrict__ landed,
                                                 unsigned char* __restrict__ staging, unsigned* __restrict__ fault,
                                                 SwapParams p, unsigned landed_rows, unsigned sel_end) {
    __shared__ unsigned long long base;
    const unsigned tid = threadIdx.x, lane = tid & 31, warps = blockDim.x >> 5;
    if (tid == 0) {
        unsigned long long b = 0ull;
        for (unsigned x = 0; x < blockIdx.x; ++x) b += spans[x].len;
        base = b;
    }
    __syncthreads();
    const Span sp = spans[blockIdx.x];
    if (sp.offset + sp.len > sel_end) {
        if (tid == 0 && blockIdx.y == 0) atomicOr(fault, 1u);
        return;  // uniform over the block
    }
    const unsigned long long host_rows_n = (unsigned long long)p.layers * p.host_pages_per_layer * p.page_tokens;
    const unsigned char* host = reinterpret_cast<const unsigned char*>(p.host_base);
    const unsigned m1 = (unsigned)min((unsigned long long)(blockIdx.y + 1) * LOCATE_CHUNK, sp.len);
    for (unsigned m = blockIdx.y * LOCATE_CHUNK + (tid >> 5); m < m1; m += warps) {
        const int j = list[sp.offset + m];
        if (j < 0 || (unsigned)j >= sel_end) {
            if (lane == 0) atomicOr(fault, 1u);
            continue;
        }
        const unsigned long long ord = base + m;
        const unsigned char* src;
        if (ord < landed_rows) {
            src = landed + ord * p.row_bytes;
        } else {
            const unsigned long long fw = fills[j];
            if (fw == 0ull || fw - 1ull >= host_rows_n) {
                if (lane == 0) atomicOr(fault, 1u);
                continue;
            }
            src = host + (fw - 1ull) * p.row_bytes;
        }
        copy_row(src, staging + (unsigned long long)j * p.row_bytes, p.row_bytes, lane);
        __syncwarp();
        if (lane == 0) fills[j] = (unsigned long long)j + 1ull;
    }
}
