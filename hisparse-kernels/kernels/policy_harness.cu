// Harness around one eviction policy's CUDA hooks (spliced in below by cuda/sources.rs, after the
// types of hisparse_policy::policy::CUDA_PRELUDE): runs every hook once per slot so that a GPU
// test can compare the results with the Rust form of the same policy on random records. The
// swap-in kernel splices the same hooks.

//@POLICY@

extern "C" __global__ void policy_hooks(const SlotRecord* __restrict__ records, const unsigned* __restrict__ tokens,
                                        unsigned n, PolicyScalars scalars, StepCtx ctx, VictimKey victim,
                                        unsigned long long* __restrict__ priority, SlotRecord* __restrict__ after_hit,
                                        SlotRecord* __restrict__ after_insert, SlotRecord* __restrict__ after_keep,
                                        PolicyScalars* __restrict__ after_finish) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    priority[i] = policy_priority(records[i], i, tokens[i], scalars, ctx);
    SlotRecord r = records[i];
    policy_on_hit(r, ctx);
    after_hit[i] = r;
    r = records[i];
    policy_on_insert(r, ctx);
    after_insert[i] = r;
    r = records[i];
    policy_on_keep(r, i, scalars, victim, ctx);
    after_keep[i] = r;
    if (i == 0) {
        PolicyScalars s = scalars;
        policy_finish(s, victim, ctx);
        *after_finish = s;
    }
}
