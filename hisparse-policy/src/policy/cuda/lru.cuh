// LRU (hisparse_policy::policy::Lru): record a = 2 * step + 1 when last hit, 2 * step when filled.
#define POLICY_PRIORITY
__device__ unsigned long long policy_priority(const SlotRecord& r, const PolicyEnv&) { return r.a; }
#define POLICY_ON_HIT
__device__ void policy_on_hit(SlotRecord& r, const PolicyEnv& e) { r.a = e.ctx.step * 2u + 1u; }
#define POLICY_ON_INSERT
__device__ void policy_on_insert(SlotRecord& r, const PolicyEnv& e) { r.a = e.ctx.step * 2u; }
