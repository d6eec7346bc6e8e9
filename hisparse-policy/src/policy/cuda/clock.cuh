// Step-batched CLOCK with a counter (hisparse_policy::policy::Clock): record a = reference
// counter (at most CLOCK_MAX), scalar a = the hand. `CLOCK_CLEAR_ON_INSERT` (the clock-cold
// variant) leaves a filled slot's counter at zero.
__device__ unsigned policy_distance(unsigned slot, unsigned hand, unsigned slots) {
    slots = slots ? slots : 1u;
    return (slot + slots - hand % slots) % slots;
}
#define POLICY_PRIORITY
__device__ unsigned long long policy_priority(const SlotRecord& r, const PolicyEnv& e) {
    return ((unsigned long long)r.a << 32) | policy_distance(e.slot, e.scalars.a, e.ctx.device_buffer_size);
}
#define POLICY_ON_HIT
__device__ void policy_on_hit(SlotRecord& r, const PolicyEnv&) { r.a = r.a + 1u < CLOCK_MAX ? r.a + 1u : CLOCK_MAX; }
#define POLICY_ON_INSERT
__device__ void policy_on_insert(SlotRecord& r, const PolicyEnv&) {
#ifdef CLOCK_CLEAR_ON_INSERT
    r.a = 0u;
#else
    r.a = 1u;
#endif
}
#define POLICY_ON_KEEP
__device__ void policy_on_keep(SlotRecord& r, const PolicyEnv& e) {
    const VictimKey& v = e.victim;
    if (v.any && v.occupied) {
        unsigned long long d = policy_distance(e.slot, e.scalars.a, e.ctx.device_buffer_size);
        unsigned visits = (unsigned)(v.priority >> 32) + (d < (v.priority & 0xffffffffull) ? 1u : 0u);
        r.a -= visits < r.a ? visits : r.a;
    }
}
#define POLICY_FINISH
__device__ void policy_finish(PolicyScalars& s, const PolicyEnv& e) {
    const VictimKey& v = e.victim;
    if (v.any && v.occupied) s.a = (v.slot + 1u) % (e.ctx.device_buffer_size ? e.ctx.device_buffer_size : 1u);
}
