// MQ, batch form (hisparse_policy::policy::Mq): record a = LRU's stamp, b = uses; token word =
// uses when last evicted. MQ_QUEUES and MQ_LIFETIME come from the config.
__device__ unsigned policy_mq_queue(unsigned uses, unsigned stamp, unsigned step) {
    unsigned u = uses > 1u ? uses : 1u;
    unsigned q = 31u - __clz(u);
    if (q > MQ_QUEUES - 1u) q = MQ_QUEUES - 1u;
    unsigned now = step * 2u;
    unsigned idle = (now > stamp ? now - stamp : 0u) / 2u;
    unsigned drop = idle / MQ_LIFETIME;
    return q > drop ? q - drop : 0u;
}
#define POLICY_PRIORITY
__device__ unsigned long long policy_priority(const SlotRecord& r, const PolicyEnv& e) {
    return ((unsigned long long)policy_mq_queue(r.b, r.a, e.ctx.step) << 32) | r.a;
}
#define POLICY_ON_HIT
__device__ void policy_on_hit(SlotRecord& r, const PolicyEnv& e) {
    r.a = e.ctx.step * 2u + 1u;
    r.b = r.b + 1u < 65536u ? r.b + 1u : 65536u;
}
#define POLICY_ON_INSERT
__device__ void policy_on_insert(SlotRecord& r, const PolicyEnv& e) {
    r.a = e.ctx.step * 2u;
    r.b = e.token_word + 1u < 65536u ? e.token_word + 1u : 65536u;
}
#define POLICY_ON_EVICT
__device__ unsigned policy_on_evict(const SlotRecord& r, const PolicyEnv&) { return r.b; }
