//! Score-aware eviction: the indexer scores every resident token at every step, which predicts
//! the next selection far better than recency (adjacent steps' selections overlap 45–80%, and a
//! token ranked just below the cut is the likeliest to enter it). Scores are known for the
//! selection and the candidates ranked just below the cut (the trace's or the engine's
//! `score_margin`); others read NaN.
//!
//! * `score`: evict the resident, non-selected token with the lowest score this step (unknown
//!   scores lowest), ties by recency (LRU's stamp).
//! * `score-lru`: LRU in which ranking among the near-cut candidates counts as a use (a weaker
//!   one than a selection), ties by score.
//!
//! Record word `a` = LRU's stamp (`2 * step + 1` when selected, `2 * step` when filled or, for
//! `score-lru`, when a near-cut candidate).

use std::borrow::Cow;

use super::{EvictionPolicy, PolicyEnv, SlotRecord};

/// A score mapped to an order-preserving `u32`, NaN (unknown) below every score.
pub fn score_key(score: f32) -> u32 {
    if score.is_nan() {
        return 0;
    }
    let bits = score.to_bits();
    // Negative scores: flip every bit; positive: set the sign bit. Never 0 for a number.
    if bits >> 31 == 1 { !bits } else { bits | 0x8000_0000 }.max(1)
}

/// How a score-aware policy weighs score against recency.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScoreMix {
    /// Score first, recency breaks ties (`score`).
    Score,
    /// Recency first, with near-cut candidates counting as used; score breaks ties (`score-lru`).
    Recency,
}

/// A score-aware policy.
#[derive(Clone, Copy, Debug)]
pub struct ScoreAware {
    /// Which order.
    pub mix: ScoreMix,
}

impl EvictionPolicy for ScoreAware {
    fn name(&self) -> &str {
        match self.mix {
            ScoreMix::Score => "score",
            ScoreMix::Recency => "score-lru",
        }
    }

    fn priority(&self, rec: &SlotRecord, env: &PolicyEnv) -> u64 {
        let s = u64::from(score_key(env.score));
        match self.mix {
            ScoreMix::Score => s << 32 | u64::from(rec.a),
            ScoreMix::Recency => {
                // A near-cut candidate this step ranks as filled this step.
                let stamp = if env.score.is_nan() { rec.a } else { rec.a.max(env.ctx.step.wrapping_mul(2)) };
                u64::from(stamp) << 32 | s
            }
        }
    }

    fn on_hit(&self, rec: &mut SlotRecord, env: &PolicyEnv) {
        rec.a = env.ctx.step.wrapping_mul(2).wrapping_add(1);
    }

    fn on_insert(&self, rec: &mut SlotRecord, env: &PolicyEnv) {
        rec.a = env.ctx.step.wrapping_mul(2);
    }

    fn on_keep(&self, rec: &mut SlotRecord, env: &PolicyEnv) {
        if self.mix == ScoreMix::Recency && !env.score.is_nan() {
            rec.a = rec.a.max(env.ctx.step.wrapping_mul(2));
        }
    }

    fn needs_scores(&self) -> bool {
        true
    }

    fn cuda(&self) -> Option<Cow<'static, str>> {
        let hooks = include_str!("cuda/score.cuh");
        Some(match self.mix {
            ScoreMix::Score => Cow::Borrowed(hooks),
            ScoreMix::Recency => Cow::Owned(format!("#define SCORE_MIX_RECENCY\n{hooks}")),
        })
    }
}
