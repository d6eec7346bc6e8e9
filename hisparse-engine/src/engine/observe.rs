//! The engine's observers of a step: the selection trace (`Engine::record_trace`), the dump of
//! every tensor of one step (`Engine::capture_next_step`, `hisparse dump-step`) and the digests
//! of every attention output (lossless checks). They see a step only through the cache's
//! per-layer API ([`crate::DecodeStep::view`], the caller's own tensors).

use half::bf16;
use hisparse_kernels::Backend;
use hisparse_memory::{DeviceMemory, Mode, RequestId};
use hisparse_policy::trace::{TraceRecord, TraceWriter};

use super::report::{LayerDump, StepReport};
use crate::cache::{KvCache, LayerView};
use crate::error::{EngineError, Result};

/// FNV-1a over the bits of `a` then `b`.
pub(super) fn digest(a: &[f32], b: &[f32]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325_u64;
    for x in a.iter().chain(b) {
        for byte in x.to_bits().to_le_bytes() {
            h = (h ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}

/// Writes the selection of every request of `ids` at layer `l` into the trace, with the
/// scores (every position's, the view's downloaded) of the selected and the `margin` best
/// unselected positions when `scored` is given.
pub(super) fn write_trace<W: std::io::Write, M: DeviceMemory>(
    tr: &mut TraceWriter<W>,
    step: u64,
    l: usize,
    ids: &[RequestId],
    view: &LayerView<'_, M>,
    scored: Option<(&[f32], usize)>,
) -> Result<()> {
    for ((id, q), s) in ids.iter().zip(view.requests).zip(view.spans) {
        let mut r = TraceRecord {
            step: step as u32,
            request: id.0,
            layer: l as u32,
            seq_len: q.seq_len as u32,
            selected: view.selections[s.offset..s.end()].to_vec(),
            ..TraceRecord::default()
        };
        if let Some((scores, margin)) = scored {
            let all = scores.get(q.score_offset..q.score_offset + q.seq_len).ok_or_else(|| EngineError::Config {
                field: "scores",
                value: scores.len().to_string(),
                reason: "shorter than the batch's positions".into(),
            })?;
            r.set_scores(all, margin);
        }
        tr.write(&r)?;
    }
    Ok(())
}

/// A digest of every request's attention output and LSE of layer `l`; `tokens[i]` is request
/// `i`'s token index (its generated tokens before this step).
pub(super) fn push_digests(
    g: &hisparse_memory::KvGeometry,
    ids: &[RequestId],
    tokens: &[u32],
    l: usize,
    out: &[f32],
    lse: &[f32],
    rep: &mut StepReport,
) {
    let (qh, per) = (g.q_heads, g.q_heads * g.d_v());
    for (i, (id, tok)) in ids.iter().zip(tokens).enumerate() {
        let d = digest(&out[i * per..(i + 1) * per], &lse[i * qh..(i + 1) * qh]);
        rep.digests.push((*id, *tok, l as u32, d));
    }
}

/// A layer's query and output tensors, for a dump.
pub struct LayerTensors<'a, M: DeviceMemory> {
    /// Indexer queries, `[n, index_heads, index_dim]`.
    pub index_q: &'a M::Buffer<bf16>,
    /// Indexer head weights, `[n, index_heads]`.
    pub index_w: &'a M::Buffer<f32>,
    /// Attention queries, `[n, q_heads, d_qk]`.
    pub attn_q: &'a M::Buffer<bf16>,
    /// The attention's output, `[n, q_heads, d_v]`.
    pub out: &'a M::Buffer<f32>,
    /// The attention's LSE, `[n, q_heads]`.
    pub lse: &'a M::Buffer<f32>,
}

/// Every input and output of layer `l` (`hisparse dump-step`).
pub(super) fn dump_layer<B: Backend>(
    cache: &KvCache<B>,
    l: usize,
    ids: &[RequestId],
    view: &LayerView<'_, B::Memory>,
    t: &LayerTensors<'_, B::Memory>,
) -> Result<LayerDump>
where
    B::Memory: Clone,
{
    let mem = cache.backend().memory();
    let g = &cache.config().geometry;
    let resident = cache.config().mode == Mode::Resident;
    let rows = mem.download(if resident { cache.device.kv(l) } else { cache.device.hot(l) })?;
    let (kv_row, key) = cache.layouts();
    let rb = kv_row.row_bytes();
    let bad = |what: &str, x: i64| EngineError::Config {
        field: "dump",
        value: x.to_string(),
        reason: format!("{what} outside its pool"),
    };
    let selected_rows = view
        .locations
        .iter()
        .map(|&x| {
            let r = usize::try_from(x).map_err(|_| bad("a location", i64::from(x)))?;
            rows.get(r * rb..(r + 1) * rb).ok_or_else(|| bad("a location", i64::from(x)))
        })
        .collect::<Result<Vec<_>>>()?
        .concat();
    // Every position's index key, through the requests' page tables (none where the cache
    // keeps no keys). A shared layer's selection (and scores) are its full layer's: so are the
    // keys shown.
    let slot = g.index_slot(g.index_source(l)).unwrap_or(0);
    let (keys, table) = (mem.download(cache.device.keys(slot))?, mem.download(view.page_table)?);
    let (kb, p) = (key.row_bytes(), cache.config().hisparse.page_tokens);
    let mut index_keys = Vec::new();
    for r in view.requests.iter().filter(|_| cache.config().keeps_index()) {
        for t in 0..r.seq_len {
            let page = *table.get(r.first_page + t / p).ok_or_else(|| bad("a page", t as i64))? as usize;
            let row = (page * p + t % p) / key.positions_per_row();
            index_keys
                .extend_from_slice(keys.get(row * kb..(row + 1) * kb).ok_or_else(|| bad("a key row", row as i64))?);
        }
    }
    let total: usize = view.requests.iter().map(|r| r.seq_len).sum();
    let mut scores = mem.download(view.scores)?;
    scores.truncate(total);
    Ok(LayerDump {
        layer: l as u32,
        requests: ids.iter().map(|id| id.0).collect(),
        seq_lens: view.requests.iter().map(|r| r.seq_len as u32).collect(),
        index_queries: mem.download(t.index_q)?,
        index_weights: mem.download(t.index_w)?,
        index_keys,
        scores,
        selections: view.selections.to_vec(),
        selection_lens: view.spans.iter().map(|s| s.len as u32).collect(),
        attention_queries: mem.download(t.attn_q)?,
        locations: view.locations.to_vec(),
        selected_rows,
        out: mem.download(t.out)?,
        lse: mem.download(t.lse)?,
    })
}
