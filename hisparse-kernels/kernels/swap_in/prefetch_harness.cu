// Harness around one prefetcher's CUDA form (the prelude of hisparse_policy::prefetch::cuda and
// the prefetcher's rule, spliced in below by cuda/sources.rs): one thread per source asks
// `prefetch_nominate` for at most `cap` nominations, so that a GPU test can compare them with
// the Rust form on random selections and layer structures.

//@PREFETCHER@

extern "C" __global__ void prefetch_nominations(const PrefetchSource* __restrict__ sources, unsigned n,
                                                const unsigned* __restrict__ index_source, unsigned cap,
                                                Nomination* __restrict__ out, unsigned* __restrict__ counts) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    counts[i] = prefetch_nominate(sources[i], index_source, out + (unsigned long long)i * cap, cap);
}
