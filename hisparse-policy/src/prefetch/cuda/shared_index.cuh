// Exact IndexShare prefetch (hisparse_policy::prefetch::SharedIndex): after a full layer, every
// later layer that shares its selection gets all of it.
__device__ unsigned prefetch_nominate(const PrefetchSource& s, const unsigned* src, Nomination* out, unsigned cap) {
    if (prefetch_source_of(src, s.layers, s.layer) != s.layer) return 0u;
    unsigned n = 0u;
    for (unsigned t = s.layer + 1u; t < s.layers && n < cap; ++t) {
        if (prefetch_source_of(src, s.layers, t) == s.layer) out[n++] = Nomination{t, 0u, 0u, s.n_selected};
    }
    return n;
}
