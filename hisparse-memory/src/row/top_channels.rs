//! Top-channel keys: of every `group` consecutive values of a key, the `keep` of largest
//! magnitude, stored as their places in the group and their e4m3 codes under one fp32 scale for
//! the key; the rest read as zero. A few channels carry most of a key's mass (the observation
//! behind SparQ Attention's and Double Sparsity's channel selection); this keeps each key's own.
//!
//! A row is, for each group in order, `keep` places (u8, ascending, each below `group`), then
//! for each group in order its `keep` e4m3 codes, then the fp32 scale (little-endian, a power of
//! two written by [`encode`]).

use crate::error::{MemoryError, Result};
use crate::fp8::decode_e4m3_scaled;
use crate::row::fp8::{quantize_block, read_scale};

/// The shape of a top-channel key: `keep` of every `group` values of `dim`.
#[derive(Clone, Copy)]
pub(super) struct TopChannels {
    pub dim: usize,
    pub keep: usize,
    pub group: usize,
}

impl TopChannels {
    /// Values kept per key.
    fn kept(self) -> usize {
        self.dim / self.group * self.keep
    }

    /// Bytes of a row: a place and a code per kept value, and the scale.
    pub fn row_bytes(self) -> usize {
        2 * self.kept() + 4
    }

    /// Writes `values` (`dim`, finite) into `row`: per group the places of its `keep` largest
    /// magnitudes (ties to the lower place), ascending, and their codes.
    pub fn encode(self, values: &[f32], row: &mut [u8]) {
        let n = self.kept();
        let mut kept = Vec::with_capacity(n);
        let mut order: Vec<usize> = Vec::with_capacity(self.group);
        for (g, vals) in values.chunks(self.group).enumerate() {
            order.clear();
            order.extend(0..vals.len());
            order.sort_by(|&a, &b| vals[b].abs().total_cmp(&vals[a].abs()).then(a.cmp(&b)));
            order.truncate(self.keep);
            order.sort_unstable();
            for (j, &i) in order.iter().enumerate() {
                // Below `group`, at most 256 (`with_format` checks): fits a byte.
                row[g * self.keep + j] = i as u8;
                kept.push(vals[i]);
            }
        }
        let (codes, scale) = row[n..].split_at_mut(n);
        let s = quantize_block(&kept, codes);
        scale.copy_from_slice(&s.to_le_bytes());
    }

    /// Whether [`Self::check`] passes `row`: the kernels' per-step test of a pool's keys, without
    /// branches on the data (a group's places ascend exactly when each exceeds the one before,
    /// and then they are all below `group` exactly when the last one is).
    pub fn is_valid(self, row: &[u8]) -> bool {
        let n = self.kept();
        let at = 2 * n;
        let s = f32::from_le_bytes([row[at], row[at + 1], row[at + 2], row[at + 3]]);
        let ok = s.is_finite() && s > 0.0;
        match self.keep {
            // The rule's `channels:16:64` (and 8 or 32 kept): whole arrays, compared as vectors.
            8 => ok & groups_valid::<8>(&row[..n], self.group),
            16 => ok & groups_valid::<16>(&row[..n], self.group),
            32 => ok & groups_valid::<32>(&row[..n], self.group),
            _ => {
                let mut ok = ok;
                for places in row[..n].chunks_exact(self.keep) {
                    let ascending = places[1..].iter().zip(places).fold(true, |a, (next, prev)| a & (next > prev));
                    // `keep >= 1` (`with_format` checks): a group has a last place.
                    ok &= ascending & (usize::from(places[self.keep - 1]) < self.group);
                }
                ok
            }
        }
    }

    /// Checks the scale (finite, positive) and that each group's places ascend below `group`.
    pub fn check(self, row: &[u8]) -> Result<()> {
        let n = self.kept();
        read_scale(&row[2 * n..], "index_key", 0)?;
        for (g, places) in row[..n].chunks(self.keep).enumerate() {
            let ascending = places.windows(2).all(|w| w[0] < w[1]);
            if !ascending || places.iter().any(|&p| usize::from(p) >= self.group) {
                return Err(MemoryError::invalid(
                    "index_key",
                    format!("{places:?}"),
                    format!("group {g}: places must ascend below the group's {} values", self.group),
                ));
            }
        }
        Ok(())
    }

    /// Decodes a checked `row`'s kept values into `values` (`dim / group * keep`, group by group;
    /// as many as `values` holds)
    /// and returns their places (each within its group, in the same order).
    pub fn decode_kept<'r>(self, row: &'r [u8], values: &mut [f32]) -> &'r [u8] {
        let n = self.kept();
        let at = 2 * n;
        let s = f32::from_le_bytes([row[at], row[at + 1], row[at + 2], row[at + 3]]);
        decode_e4m3_scaled(&row[n..2 * n], s, values);
        &row[..n]
    }

    /// Decodes a checked `row` into `out` (`dim` values): the kept values, zeros elsewhere.
    pub fn decode(self, row: &[u8], out: &mut [f32]) {
        let n = self.kept();
        let at = 2 * n;
        let s = f32::from_le_bytes([row[at], row[at + 1], row[at + 2], row[at + 3]]);
        out.fill(0.0);
        // A group's kept values decoded together (at most 256: `with_format` checks), then
        // placed in the group.
        let mut buf = [0f32; 256];
        let (places, codes) = row[..2 * n].split_at(n);
        for ((group, places), codes) in
            out.chunks_mut(self.group).zip(places.chunks(self.keep)).zip(codes.chunks(self.keep))
        {
            let vals = &mut buf[..codes.len()];
            decode_e4m3_scaled(codes, s, vals);
            for (&place, &v) in places.iter().zip(vals.iter()) {
                group[usize::from(place)] = v;
            }
        }
    }
}

/// [`TopChannels::is_valid`]'s test of the places of whole groups of `K` kept values.
#[inline]
fn groups_valid<const K: usize>(places: &[u8], group: usize) -> bool {
    let mut ok = true;
    for p in places.as_chunks::<K>().0 {
        let mut ascending = true;
        for i in 1..K {
            ascending &= p[i] > p[i - 1];
        }
        ok &= ascending & (usize::from(p[K - 1]) < group);
    }
    ok
}
