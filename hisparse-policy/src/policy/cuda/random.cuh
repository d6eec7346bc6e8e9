// Seeded random eviction (hisparse_policy::policy::Random): a hash of (seed, request, layer,
// step, slot) ranks the evictable slots.
__device__ unsigned long long policy_mix64(unsigned long long x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
#define POLICY_PRIORITY
__device__ unsigned long long policy_priority(const SlotRecord&, const PolicyEnv& e) {
    unsigned long long h = policy_mix64(e.ctx.seed ^ policy_mix64(e.ctx.request));
    h = policy_mix64(h ^ (((unsigned long long)e.ctx.layer << 32) | e.ctx.step));
    return policy_mix64(h ^ (unsigned long long)e.slot);
}
#define POLICY_ON_INSERT
__device__ void policy_on_insert(SlotRecord&, const PolicyEnv&) {}
