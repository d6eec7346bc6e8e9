// FIFO (hisparse_policy::policy::Fifo): record a = the step the slot was filled.
#define POLICY_PRIORITY
__device__ unsigned long long policy_priority(const SlotRecord& r, const PolicyEnv&) { return r.a; }
#define POLICY_ON_INSERT
__device__ void policy_on_insert(SlotRecord& r, const PolicyEnv& e) { r.a = e.ctx.step; }
