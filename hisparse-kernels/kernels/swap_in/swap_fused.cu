// The swap-in as one launch (for small batches, where a second launch and its gap cost more than
// the copies): gridDim.y blocks per request; the first block of a request to start makes the
// decisions (swap_decide, exactly the two-launch swap-in's), then every block of the request,
// that one included, copies its share of the misses (copy_request_misses). Roles are handed
// out by arrival (a ticket per request in `sync`), not by block index, so a copier only ever
// waits for a block that is already running: no launch order or co-residency is assumed. The
// last block of a request to leave clears its three sync words (arrivals, decided flag,
// departures) for the next launch, which the stream orders after this one.

// Its arguments: one FusedSwapArgs (the generated prelude), passed by value.
extern "C" __global__ void swap_in_fused(const FusedSwapArgs a) {
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
    unsigned char* __restrict__ hot_rows = a.hot_rows;
    unsigned* __restrict__ sync = a.sync;
    unsigned* __restrict__ fault = a.fault;
    const SwapParams p = a.p;
    __shared__ unsigned s_role;
    unsigned* arrived = sync + 3ull * blockIdx.x;
    unsigned* decided = arrived + 1;
    unsigned* left = arrived + 2;
    if (threadIdx.x == 0) s_role = atomicAdd(arrived, 1u);
    __syncthreads();
    const unsigned role = s_role;
    if (role == 0) {
        swap_decide(reqs, selections, slot_tokens, records, scalars, ready, prefetched_g, words_g, scores, locations,
                    counts, miss_tokens, miss_slots, evicted, host_pages, nullptr, fault, p);
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) atomicExch(decided, 1u);
    } else {
        if (threadIdx.x == 0) {
            while (atomicAdd(decided, 0u) == 0u) __nanosleep(256);
            __threadfence();
        }
        __syncthreads();
    }
    const SwapReq r = reqs[blockIdx.x];
    const unsigned misses = __ldcg(counts + COUNTS * blockIdx.x + 1);
    const unsigned warps = blockDim.x >> 5;
    copy_request_misses(r, misses, miss_tokens, miss_slots, host_pages, hot_rows, fault, p,
                        role * warps + (threadIdx.x >> 5), gridDim.y * warps);
    __syncthreads();
    if (threadIdx.x == 0 && atomicAdd(left, 1u) == gridDim.y - 1) {
        *arrived = 0u;
        *decided = 0u;
        *left = 0u;
    }
}
