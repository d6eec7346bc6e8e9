// Step-batched CLOCK (hisparse_policy::policy::Clock): record a = reference bit, scalar a = the
// hand. `CLOCK_CLEAR_ON_INSERT` (defined by the variant that wants it) leaves a filled slot's
// bit clear.
__device__ unsigned policy_distance(unsigned slot, unsigned hand, unsigned slots) {
    slots = slots ? slots : 1u;
    return (slot + slots - hand % slots) % slots;
}
#define POLICY_PRIORITY
__device__ unsigned long long policy_priority(const SlotRecord& r, const PolicyEnv& e) {
    return ((unsigned long long)(r.a & 1u) << 32) | policy_distance(e.slot, e.scalars.a, e.ctx.buffer_slots);
}
#define POLICY_ON_HIT
__device__ void policy_on_hit(SlotRecord& r, const PolicyEnv&) { r.a = 1u; }
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
    if (v.any && v.occupied && r.a == 1u) {
        bool wrapped = (v.priority >> 32) == 1ull;
        if (wrapped || (unsigned long long)policy_distance(e.slot, e.scalars.a, e.ctx.buffer_slots) < (v.priority & 0xffffffffull)) r.a = 0u;
    }
}
#define POLICY_FINISH
__device__ void policy_finish(PolicyScalars& s, const PolicyEnv& e) {
    const VictimKey& v = e.victim;
    if (v.any && v.occupied) s.a = (v.slot + 1u) % (e.ctx.buffer_slots ? e.ctx.buffer_slots : 1u);
}
