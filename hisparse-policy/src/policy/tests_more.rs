//! Unit tests of the score-aware, S3-FIFO and MQ policies and of the policy config, through the
//! CPU swap-in step.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use super::*;
use crate::swap_in::{SwapInPlan, SwapInState, SwapInputs};

/// Runs `steps` (selection, scores as (token, score)) over sequences growing by one from 100;
/// returns the plans.
/// A step: its selection and some tokens' scores.
type Scored<'a> = (&'a [u32], &'a [(u32, f32)]);

fn run_scored(policy: &dyn EvictionPolicy, slots: usize, steps: &[Scored<'_>]) -> Vec<SwapInPlan> {
    let mut st = SwapInState::new(slots).unwrap();
    let mut out = Vec::new();
    for (i, (sel, scored)) in steps.iter().enumerate() {
        let mut scores = vec![f32::NAN; 200];
        for &(t, v) in *scored {
            scores[t as usize] = v;
        }
        let mut p = SwapInPlan::default();
        let ctx = StepCtx { step: i as u32 + 1, layer: 0, request: 1, device_buffer_size: slots as u32, seed: 0 };
        st.step(policy, sel, 100 + i, &ctx, SwapInputs { next_use: None, scores: Some(&scores) }, &mut p).unwrap();
        out.push(p);
    }
    out
}

#[test]
fn score_keys_order_like_the_scores_with_unknown_lowest() {
    let xs = [-1e30f32, -2.5, -0.0, 0.0, 1e-9, 3.0, 7e20];
    for w in xs.windows(2) {
        assert!(score_key(w[0]) <= score_key(w[1]), "{} {}", w[0], w[1]);
    }
    assert!(score_key(f32::NAN) < score_key(-1e30), "unknown scores rank below every score");
    assert!(score_key(f32::NEG_INFINITY) > 0);
}

#[test]
fn score_evicts_the_lowest_score_and_unknown_first() {
    let p = ScoreAware { mix: ScoreMix::Score };
    // Fill 4 slots, then select 5: one victim among 1..4 (all unselected). Token 3 has no
    // score (unknown: lowest) so it goes, though it is the most recent fill.
    let plans = run_scored(&p, 4, &[(&[1, 2], &[]), (&[3, 4], &[]), (&[5], &[(1, 0.5), (2, -1.0), (4, 0.1)])]);
    assert_eq!(plans[2].evictions, vec![(3, 2)]);
    // With every score known, the lowest (token 2) goes; LRU would evict token 1.
    let plans =
        run_scored(&p, 4, &[(&[1, 2], &[]), (&[3, 4], &[]), (&[5], &[(1, 0.5), (2, -1.0), (3, 0.2), (4, 0.1)])]);
    assert_eq!(plans[2].evictions, vec![(2, 1)]);
    let plans = run_scored(&Lru, 4, &[(&[1, 2], &[]), (&[3, 4], &[]), (&[5], &[])]);
    assert_eq!(plans[2].evictions, vec![(1, 0)]);
}

#[test]
fn score_lru_counts_near_cut_candidates_as_used() {
    let p = ScoreAware { mix: ScoreMix::Recency };
    // Step 3: token 1 (oldest) is a near-cut candidate, so it ranks as filled at step 3 and
    // token 2 (step 1, unscored) goes; ties among this step's candidates fall to the lower score.
    let plans = run_scored(&p, 4, &[(&[1, 2], &[]), (&[3, 4], &[]), (&[5], &[(1, 0.5)])]);
    assert_eq!(plans[2].evictions, vec![(2, 1)]);
    let plans = run_scored(&p, 4, &[(&[1, 2], &[]), (&[3, 4], &[]), (&[5, 6], &[(1, 0.5), (2, 0.7)])]);
    assert_eq!(plans[2].evictions, vec![(3, 2), (4, 3)], "steps-2 fills go before this step's candidates");
}

#[test]
fn mq_keeps_often_used_tokens_and_remembers_them_after_eviction() {
    let mq = Mq { queues: 4, lifetime: 100 };
    // Token 1 is selected four times (queue 2); 2, 3 once. A new token evicts the least used
    // (2, LRU among queue 0) although 1 is the least recent.
    let plans =
        run_scored(&mq, 3, &[(&[1], &[]), (&[1], &[]), (&[1], &[]), (&[1, 2, 3], &[]), (&[2, 3], &[]), (&[4], &[])]);
    assert!(plans[5].evictions.iter().all(|&(t, _)| t != 1), "{:?}", plans[5].evictions);
    let lru =
        run_scored(&Lru, 3, &[(&[1], &[]), (&[1], &[]), (&[1], &[]), (&[1, 2, 3], &[]), (&[2, 3], &[]), (&[4], &[])]);
    assert_eq!(lru[5].evictions, vec![(1, 0)], "LRU evicts the frequent token");
    // A token's uses survive its eviction in its history word.
    let mut st = SwapInState::new(2).unwrap();
    let mut plan = SwapInPlan::default();
    for (i, sel) in [&[1u32][..], &[1], &[1], &[2, 3], &[1]].iter().enumerate() {
        let ctx = StepCtx { step: i as u32 + 1, layer: 0, request: 1, device_buffer_size: 2, seed: 0 };
        st.step(&mq, sel, 100 + i, &ctx, SwapInputs::default(), &mut plan).unwrap();
    }
    assert_eq!(st.token_word(1), 3, "evicted after three uses");
    let s = st.table().slot_of(1).unwrap();
    assert_eq!(st.records()[s as usize].b, 4, "refilled with its history plus this use");
}

#[test]
fn s3fifo_drops_one_time_tokens_first_and_promotes_ghosts() {
    let s3 = S3Fifo { ghost_steps: 8 };
    // 1, 2 enter probation; 1 is used again (still probation, used). 3 arrives: 2 (probation,
    // unused) goes first even though 1 is older.
    let plans = run_scored(&s3, 2, &[(&[1, 2], &[]), (&[1], &[]), (&[3], &[])]);
    assert_eq!(plans[2].evictions, vec![(2, 1)]);
    // A token dropped from probation and back within the ghost's reach enters main.
    let mut st = SwapInState::new(2).unwrap();
    let mut plan = SwapInPlan::default();
    // Step 2 drops token 1 (slot 0) from probation; step 3 brings it back.
    for (i, sel) in [&[1u32, 2][..], &[3], &[1]].iter().enumerate() {
        let ctx = StepCtx { step: i as u32 + 1, layer: 0, request: 1, device_buffer_size: 2, seed: 0 };
        st.step(&s3, sel, 100 + i, &ctx, SwapInputs::default(), &mut plan).unwrap();
    }
    assert_eq!(plan.evictions, vec![(2, 1)]);
    let s = st.table().slot_of(1).unwrap();
    assert_eq!(st.records()[s as usize].b & (1 << 8), 1 << 8, "back from the ghost: main");
    let s = st.table().slot_of(3).unwrap();
    assert_eq!(st.records()[s as usize].b & (1 << 8), 0, "a new token: probation");
    // Past the ghost's reach, a returning token is new again.
    let s3 = S3Fifo { ghost_steps: 0 };
    let mut st = SwapInState::new(2).unwrap();
    for (i, sel) in [&[1u32, 2][..], &[3], &[4], &[1]].iter().enumerate() {
        let ctx = StepCtx { step: i as u32 + 1, layer: 0, request: 1, device_buffer_size: 2, seed: 0 };
        st.step(&s3, sel, 100 + i, &ctx, SwapInputs::default(), &mut plan).unwrap();
    }
    let s = st.table().slot_of(1).unwrap();
    assert_eq!(st.records()[s as usize].b & (1 << 8), 0, "the ghost forgot it");
}

#[test]
fn policy_config_reads_json_and_refuses_bad_fields() {
    let c: PolicyConfig = serde_json::from_str(r#"{"seed": 4, "clock_bits": 3}"#).unwrap();
    assert_eq!((c.seed, c.clock_bits, c.mq_queues), (4, 3, 4));
    let back: PolicyConfig = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
    assert_eq!(back, c);
    assert!(serde_json::from_str::<PolicyConfig>(r#"{"clock_bit": 3}"#).is_err(), "unknown keys are refused");
    for (json, field) in [
        (r#"{"clock_bits": 0}"#, "clock_bits"),
        (r#"{"clock_bits": 9}"#, "clock_bits"),
        (r#"{"mq_queues": 17}"#, "mq_queues"),
        (r#"{"mq_lifetime": 0}"#, "mq_lifetime"),
        (r#"{"s3fifo_ghost_steps": 0}"#, "s3fifo_ghost_steps"),
    ] {
        let c: PolicyConfig = serde_json::from_str(json).unwrap();
        let e = make("clock", &c).unwrap_err();
        assert!(e.to_string().contains(field), "{json}: {e}");
    }
    // The config reaches the policy: CLOCK's counter width is in its CUDA form.
    let c = PolicyConfig { clock_bits: 3, ..PolicyConfig::default() };
    assert!(make("clock", &c).unwrap().cuda().unwrap().contains("CLOCK_MAX 7u"));
    for b in BuiltinPolicy::ALL {
        let json = serde_json::to_string(&b).unwrap();
        assert_eq!(json, format!("\"{}\"", b.name()));
        assert_eq!(serde_json::from_str::<BuiltinPolicy>(&json).unwrap(), b);
        assert_eq!(make(b.name(), &PolicyConfig::default()).unwrap().name(), b.name());
    }
}
