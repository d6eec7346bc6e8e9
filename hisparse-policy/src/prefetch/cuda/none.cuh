// No prefetch (hisparse_policy::prefetch::NoPrefetch).
__device__ unsigned prefetch_nominate(const PrefetchSource&, const unsigned*, Nomination*, unsigned) { return 0u; }
