// Eager backup on the GPU: each new token's KV row, copied from its hot-buffer slot into the
// mapped host tier by a small kernel on a side stream (a warp per row, 16 bytes per lane), and a
// delay kernel that tests put in front of it to prove that the engine's events order things.

extern "C" __global__ void scatter_rows(const unsigned char* __restrict__ dev_rows, const unsigned* __restrict__ dev_row,
                                        const unsigned long long* __restrict__ host_row, unsigned n, unsigned row_bytes,
                                        unsigned long long host_base) {
    const unsigned lane = threadIdx.x & 31;
    const unsigned warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const unsigned warps = (gridDim.x * blockDim.x) >> 5;
    unsigned char* host = reinterpret_cast<unsigned char*>(host_base);
    for (unsigned i = warp; i < n; i += warps) {
        const uint4* s = reinterpret_cast<const uint4*>(dev_rows + (unsigned long long)dev_row[i] * row_bytes);
        uint4* d = reinterpret_cast<uint4*>(host + host_row[i] * row_bytes);
        for (unsigned c = lane; c < row_bytes / 16; c += 32) d[c] = __ldcg(s + c);
    }
}

// Spins for `ns` nanoseconds of wall time (one thread).
extern "C" __global__ void delay_ns(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
