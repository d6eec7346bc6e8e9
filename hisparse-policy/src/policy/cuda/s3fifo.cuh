// S3-FIFO, batch form (hisparse_policy::policy::S3Fifo): record a = stamp, b = uses (bits 0..2)
// | main (bit 8); token word = the step it was dropped from probation. S3FIFO_GHOST_STEPS comes
// from the config.
__device__ unsigned policy_s3_class(unsigned b) {
    return 2u * ((b & 3u) != 0u ? 1u : 0u) + ((b & 256u) != 0u ? 1u : 0u);
}
#define POLICY_PRIORITY
__device__ unsigned long long policy_priority(const SlotRecord& r, const PolicyEnv&) {
    return ((unsigned long long)policy_s3_class(r.b) << 32) | r.a;
}
#define POLICY_ON_HIT
__device__ void policy_on_hit(SlotRecord& r, const PolicyEnv&) {
    unsigned u = (r.b & 3u) + 1u;
    r.b = (r.b & 256u) | (u < 3u ? u : 3u);
}
#define POLICY_ON_INSERT
__device__ void policy_on_insert(SlotRecord& r, const PolicyEnv& e) {
    r.a = e.ctx.step;
    unsigned w = e.token_word;
    bool ghost = w != 0u && (e.ctx.step > w ? e.ctx.step - w : 0u) <= S3FIFO_GHOST_STEPS;
    r.b = ghost ? 256u : 0u;
}
#define POLICY_ON_KEEP
__device__ void policy_on_keep(SlotRecord& r, const PolicyEnv& e) {
    const VictimKey& v = e.victim;
    if (!(v.any && v.occupied) || (r.b & 3u) == 0u) return;
    unsigned vc = (unsigned)(v.priority >> 32), va = (unsigned)v.priority;
    bool passed = (r.b & 256u) == 0u ? (vc >= 1u || r.a < va) : (vc >= 2u || (vc == 1u && r.a < va));
    if (passed) {
        r.a = e.ctx.step;
        r.b = (r.b & 256u) == 0u ? 256u : (256u | ((r.b & 3u) - 1u));
    }
}
#define POLICY_ON_EVICT
__device__ unsigned policy_on_evict(const SlotRecord& r, const PolicyEnv& e) {
    return (r.b & 256u) == 0u ? e.ctx.step : 0u;
}
