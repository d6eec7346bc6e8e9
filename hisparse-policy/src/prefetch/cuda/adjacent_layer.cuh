// Speculative adjacent-layer prefetch (hisparse_policy::prefetch::AdjacentLayer): layer l's
// selection into layer l + 1, PREFETCH_BUDGET rows (0: a quarter of top-k).
__device__ unsigned prefetch_nominate(const PrefetchSource& s, const unsigned*, Nomination* out, unsigned cap) {
    if (s.layer + 1u >= s.layers || cap == 0u) return 0u;
    out[0] = Nomination{s.layer + 1u, 0u, 0u, prefetch_budget_rows(PREFETCH_BUDGET, s.top_k)};
    return 1u;
}
