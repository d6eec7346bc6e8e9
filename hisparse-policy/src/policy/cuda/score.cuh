// Score-aware eviction (hisparse_policy::policy::ScoreAware): record a = LRU's stamp. Without
// SCORE_MIX_RECENCY (`score`): lowest score first, ties by stamp; with it (`score-lru`): stamp
// first, a near-cut candidate (known score) counting as filled this step, ties by score.
__device__ unsigned policy_score_key(float s) {
    if (isnan(s)) return 0u;
    unsigned bits = __float_as_uint(s);
    unsigned k = (bits >> 31) ? ~bits : (bits | 0x80000000u);
    return k > 1u ? k : 1u;
}
#define POLICY_PRIORITY
__device__ unsigned long long policy_priority(const SlotRecord& r, const PolicyEnv& e) {
    unsigned long long s = policy_score_key(e.score);
#ifdef SCORE_MIX_RECENCY
    unsigned stamp = r.a;
    if (!isnan(e.score)) { unsigned f = e.ctx.step * 2u; stamp = stamp > f ? stamp : f; }
    return ((unsigned long long)stamp << 32) | s;
#else
    return (s << 32) | r.a;
#endif
}
#define POLICY_ON_HIT
__device__ void policy_on_hit(SlotRecord& r, const PolicyEnv& e) { r.a = e.ctx.step * 2u + 1u; }
#define POLICY_ON_INSERT
__device__ void policy_on_insert(SlotRecord& r, const PolicyEnv& e) { r.a = e.ctx.step * 2u; }
#ifdef SCORE_MIX_RECENCY
#define POLICY_ON_KEEP
__device__ void policy_on_keep(SlotRecord& r, const PolicyEnv& e) {
    if (!isnan(e.score)) { unsigned f = e.ctx.step * 2u; r.a = r.a > f ? r.a : f; }
}
#endif
