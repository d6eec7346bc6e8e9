// Next-step prefetch (hisparse_policy::prefetch::NextStep): the near-cut candidates, for the same
// layer next step, PREFETCH_BUDGET rows (0: a quarter of top-k).
__device__ unsigned prefetch_nominate(const PrefetchSource& s, const unsigned*, Nomination* out, unsigned cap) {
    if (s.n_near == 0u || cap == 0u) return 0u;
    out[0] = Nomination{s.layer, 1u, 1u, prefetch_budget_rows(PREFETCH_BUDGET, s.top_k)};
    return 1u;
}
