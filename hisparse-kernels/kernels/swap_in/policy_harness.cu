// Harness around one eviction policy's CUDA hooks (its program — the prelude of
// hisparse_policy::policy::cuda, the hooks, the defaults — is spliced in below by
// cuda/sources.rs): runs every hook once per slot, each with its own environment, so that a GPU
// test can compare the results with the Rust form of the same policy on random records and
// environments. The swap-in kernel splices the same program.

//@POLICY@

extern "C" __global__ void policy_hooks(const SlotRecord* __restrict__ records, const PolicyEnv* __restrict__ envs,
                                        unsigned n, unsigned long long* __restrict__ priority,
                                        SlotRecord* __restrict__ after_hit, SlotRecord* __restrict__ after_insert,
                                        SlotRecord* __restrict__ after_keep, unsigned* __restrict__ evict_word,
                                        PolicyScalars* __restrict__ after_finish) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const PolicyEnv e = envs[i];
    priority[i] = policy_priority(records[i], e);
    SlotRecord r = records[i];
    policy_on_hit(r, e);
    after_hit[i] = r;
    r = records[i];
    policy_on_insert(r, e);
    after_insert[i] = r;
    r = records[i];
    policy_on_keep(r, e);
    after_keep[i] = r;
    evict_word[i] = policy_on_evict(records[i], e);
    if (i == 0) {
        PolicyScalars s = e.scalars;
        policy_finish(s, e);
        *after_finish = s;
    }
}
