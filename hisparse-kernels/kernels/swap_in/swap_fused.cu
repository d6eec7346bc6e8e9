// The swap-in as one launch (for small batches, where a second launch and its gap cost more than
// the copies): gridDim.y blocks per request; the first block of a request to start makes the
// decisions (swap_decide, exactly the two-launch swap-in's), then every block of the request,
// that one included, copies its share of the misses (copy_request_misses). Roles are handed
// out by arrival (a ticket per request in `sync`), not by block index, so a copier only ever
// waits for a block that is already running: no launch order or co-residency is assumed. The
// last block of a request to leave clears its three sync words (arrivals, decided flag,
// departures) for the next launch, which the stream orders after this one.

// Its arguments: one FusedSwapArgs (the generated prelude: the decisions' SwapArgs, with no
// fills, and the copies' pool and sync words), passed by value.
extern "C" __global__ void swap_in_fused(const FusedSwapArgs a) {
    const SwapArgs& d = a.decide;
    const SwapParams p = d.p;
    __shared__ unsigned s_role;
    unsigned* arrived = a.sync + 3ull * blockIdx.x;
    unsigned* decided = arrived + 1;
    unsigned* left = arrived + 2;
    if (threadIdx.x == 0) s_role = atomicAdd(arrived, 1u);
    __syncthreads();
    const unsigned role = s_role;
    if (role == 0) {
        swap_decide(d);
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
    const SwapReq r = d.reqs[blockIdx.x];
    const unsigned misses = __ldcg(d.counts + COUNTS * blockIdx.x + 1);
    const unsigned warps = blockDim.x >> 5;
    copy_request_misses(r, misses, d.miss_tokens, d.miss_slots, d.host_pages, a.hot_rows, d.fault, p,
                        role * warps + (threadIdx.x >> 5), gridDim.y * warps);
    __syncthreads();
    if (threadIdx.x == 0 && atomicAdd(left, 1u) == gridDim.y - 1) {
        *arrived = 0u;
        *decided = 0u;
        *left = 0u;
    }
}
