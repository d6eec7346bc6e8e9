//! `KvGeometry`: the shape of one model's sparse-attention KV (layers, heads, dims, top-k, row
//! format, which layers run the indexer); the named presets' values are in `preset.rs`.

use serde::{Deserialize, Serialize};

use crate::error::{MemoryError, Result};
use crate::row::{IndexKeyFormat, IndexKeyLayout, KvRowFormat, KvRowLayout, RowHeads};

/// The shape of a sparse-attention model's KV cache, as one GPU sees it with data-parallel
/// attention (all query heads of the model on every GPU).
///
/// What a row holds is its [`RowShape`]. MLA decode runs in MQA form: one KV row per token per
/// layer holds `d_latent` latent values (which are also the values) and `d_rope` rotary values,
/// so `d_qk = d_latent + d_rope` and `d_v = d_latent`. A grouped-query model stores per token and
/// layer the keys and values of its `kv_heads` KV heads of `head_dim`, and
/// `d_qk = d_v = head_dim`; its "indexer" is then the oracle over its own keys (index keys are a
/// token's keys, `index_dim = kv_heads * head_dim`, one index head per query head).
///
/// The JSON form keeps the flat keys geometries were written with (`d_latent`, `d_rope`,
/// `row_heads`; a GQA row's `d_latent` is its `2 * kv_heads * head_dim` values).
///
/// ```
/// use hisparse_memory::KvGeometry;
/// let g = KvGeometry::preset("deepseek-v3.2")?;
/// assert_eq!((g.layers, g.q_heads, g.d_qk(), g.d_v()), (61, 128, 576, 512));
/// assert_eq!(g.kv_row()?.row_bytes(), 656);
/// assert_eq!(g.index_key()?.row_bytes(), 132);
/// # Ok::<(), hisparse_memory::MemoryError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawGeometry", into = "RawGeometry")]
pub struct KvGeometry {
    /// A name for reports (the preset name, or anything for a custom geometry).
    pub name: String,
    /// Sparse-attention layers.
    pub layers: usize,
    /// Query heads per GPU.
    pub q_heads: usize,
    /// What a KV row holds, in its attention's own terms.
    pub row: RowShape,
    /// Lightning-indexer heads.
    pub index_heads: usize,
    /// Lightning-indexer head dim (the length of one index key).
    pub index_dim: usize,
    /// Tokens selected per request, layer and step.
    pub top_k: usize,
    /// How KV rows are stored.
    pub kv_format: KvRowFormat,
    /// Which layers run the lightning indexer (IndexShare: the others reuse a full layer's
    /// selection and store no index keys).
    pub indexers: IndexerLayout,
    /// How index keys are stored (fp8 by default).
    pub index_format: IndexKeyFormat,
}

/// What one KV row holds, named as its attention names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowShape {
    /// Multi-head latent attention in MQA form (DeepSeek, GLM): one row every query head reads.
    Mla {
        /// Latent (NoPE) dims; also the value dims.
        d_latent: usize,
        /// Rotary dims.
        d_rope: usize,
    },
    /// Grouped-query attention: `K_0 .. K_{kv_heads-1}` then `V_0 .. V_{kv_heads-1}`.
    Gqa {
        /// KV heads.
        kv_heads: usize,
        /// Dims of one head's key (and value).
        head_dim: usize,
    },
}

/// [`KvGeometry`] as JSON has it: the flat keys it was always written with.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGeometry {
    name: String,
    layers: usize,
    q_heads: usize,
    d_latent: usize,
    d_rope: usize,
    index_heads: usize,
    index_dim: usize,
    top_k: usize,
    kv_format: KvRowFormat,
    #[serde(default)]
    indexers: IndexerLayout,
    #[serde(default)]
    row_heads: RowHeads,
    #[serde(default)]
    index_format: IndexKeyFormat,
}

impl From<KvGeometry> for RawGeometry {
    fn from(g: KvGeometry) -> Self {
        let (d_latent, d_rope, row_heads) = match g.row {
            RowShape::Mla { d_latent, d_rope } => (d_latent, d_rope, RowHeads::Mla),
            RowShape::Gqa { kv_heads, head_dim } => {
                (kv_heads.saturating_mul(head_dim).saturating_mul(2), 0, RowHeads::Gqa { kv_heads, head_dim })
            }
        };
        Self {
            name: g.name,
            layers: g.layers,
            q_heads: g.q_heads,
            d_latent,
            d_rope,
            index_heads: g.index_heads,
            index_dim: g.index_dim,
            top_k: g.top_k,
            kv_format: g.kv_format,
            indexers: g.indexers,
            row_heads,
            index_format: g.index_format,
        }
    }
}

impl TryFrom<RawGeometry> for KvGeometry {
    type Error = MemoryError;
    fn try_from(r: RawGeometry) -> Result<Self> {
        let row = match r.row_heads {
            RowHeads::Mla => RowShape::Mla { d_latent: r.d_latent, d_rope: r.d_rope },
            RowHeads::Gqa { kv_heads, head_dim } => {
                let values = kv_heads.checked_mul(head_dim).and_then(|v| v.checked_mul(2));
                if (Some(r.d_latent), r.d_rope) != (values, 0) {
                    return Err(MemoryError::invalid(
                        "d_latent",
                        format!("{}+{}", r.d_latent, r.d_rope),
                        format!(
                            "a GQA row of {kv_heads} KV heads of {head_dim} holds 2 x {kv_heads} x {head_dim} + 0 values"
                        ),
                    ));
                }
                RowShape::Gqa { kv_heads, head_dim }
            }
        };
        Ok(Self {
            name: r.name,
            layers: r.layers,
            q_heads: r.q_heads,
            row,
            index_heads: r.index_heads,
            index_dim: r.index_dim,
            top_k: r.top_k,
            kv_format: r.kv_format,
            indexers: r.indexers,
            index_format: r.index_format,
        })
    }
}

/// Which layers run the lightning indexer (`full`) and which (`shared`) attend over the
/// selection of the nearest preceding full layer, storing no index keys and running no indexer
/// or top-k: GLM-5.2's IndexShare (IndexCache). Layer 0 is always full.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind", deny_unknown_fields)]
pub enum IndexerLayout {
    /// Every layer runs its own indexer (DeepSeek-V3.2, GLM-5.1 as the HiSparse blog ran it).
    #[default]
    AllFull,
    /// The public configs' form: layers `0..first_full` are full, then every `freq`-th layer
    /// counted from the last of them (`index_topk_freq`).
    Every {
        /// Leading layers that are all full (at least 1).
        first_full: usize,
        /// Distance between full layers after them (at least 1).
        freq: usize,
    },
    /// Layer by layer (`true`: full), as a model config's `indexer_types` lists them.
    Explicit {
        /// One entry per layer.
        full: Vec<bool>,
    },
}

impl IndexerLayout {
    /// Whether layer `l` runs its own indexer.
    pub fn is_full(&self, l: usize) -> bool {
        match self {
            Self::AllFull => true,
            Self::Every { first_full, freq } => {
                l < *first_full || (l + 1 - *first_full.max(&1)).is_multiple_of((*freq).max(1))
            }
            Self::Explicit { full } => full.get(l).copied().unwrap_or(false),
        }
    }
}

impl KvGeometry {
    /// A grouped-query geometry: `q_heads` query heads over `kv_heads` KV heads of `head_dim`,
    /// every layer selecting on its own with the oracle (index keys: the token's keys).
    pub fn gqa(
        name: &str,
        layers: usize,
        q_heads: usize,
        kv_heads: usize,
        head_dim: usize,
        top_k: usize,
        kv_format: KvRowFormat,
    ) -> Result<Self> {
        // Checks the shape (non-zero, no overflow) before any product of it is taken.
        KvRowLayout::gqa(kv_format, kv_heads, head_dim)?;
        let g = Self {
            name: name.to_owned(),
            layers,
            q_heads,
            row: RowShape::Gqa { kv_heads, head_dim },
            index_heads: q_heads,
            index_dim: kv_heads * head_dim,
            top_k,
            kv_format,
            indexers: IndexerLayout::AllFull,
            index_format: IndexKeyFormat::Fp8,
        };
        g.validate()?;
        Ok(g)
    }

    /// The KV heads of a grouped-query geometry (`None` for MLA).
    pub fn kv_heads(&self) -> Option<usize> {
        match self.row {
            RowShape::Mla { .. } => None,
            RowShape::Gqa { kv_heads, .. } => Some(kv_heads),
        }
    }

    /// The same geometry with another indexer layout.
    pub fn with_indexers(mut self, indexers: IndexerLayout) -> Self {
        self.indexers = indexers;
        self
    }

    /// Whether layer `l` runs its own indexer and top-k (and stores index keys).
    pub fn is_full(&self, l: usize) -> bool {
        self.indexers.is_full(l)
    }

    /// The layer whose selection layer `l` attends over: itself when full, else the nearest
    /// preceding full layer (layer 0 is full in a valid geometry).
    pub fn index_source(&self, l: usize) -> usize {
        (0..=l).rev().find(|&s| self.is_full(s)).unwrap_or(0)
    }

    /// The layers that run an indexer, ascending.
    pub fn full_layers(&self) -> Vec<usize> {
        (0..self.layers).filter(|&l| self.is_full(l)).collect()
    }

    /// How many layers store index keys.
    pub fn index_layers(&self) -> usize {
        (0..self.layers).filter(|&l| self.is_full(l)).count()
    }

    /// Where layer `l`'s index keys live among the full layers' key pools (`None`: shared).
    pub fn index_slot(&self, l: usize) -> Option<usize> {
        self.is_full(l).then(|| (0..l).filter(|&s| self.is_full(s)).count())
    }

    /// The same geometry with another KV row format.
    pub fn with_kv_format(mut self, kv_format: KvRowFormat) -> Self {
        self.kv_format = kv_format;
        self
    }

    /// Dims of one query head: `d_latent + d_rope` for MLA (576 for the MLA presets), the head
    /// dim for GQA.
    pub fn d_qk(&self) -> usize {
        match self.row {
            RowShape::Mla { d_latent, d_rope } => d_latent + d_rope,
            RowShape::Gqa { head_dim, .. } => head_dim,
        }
    }

    /// Dims of one head's output: `d_latent` for MLA (512 for the MLA presets), the head dim for
    /// GQA.
    pub fn d_v(&self) -> usize {
        match self.row {
            RowShape::Mla { d_latent, .. } => d_latent,
            RowShape::Gqa { head_dim, .. } => head_dim,
        }
    }

    /// The KV row layout of this geometry.
    pub fn kv_row(&self) -> Result<KvRowLayout> {
        match self.row {
            RowShape::Mla { d_latent, d_rope } => KvRowLayout::new(self.kv_format, d_latent, d_rope),
            RowShape::Gqa { kv_heads, head_dim } => KvRowLayout::gqa(self.kv_format, kv_heads, head_dim),
        }
    }

    /// The index-key layout of this geometry.
    pub fn index_key(&self) -> Result<IndexKeyLayout> {
        IndexKeyLayout::with_format(self.index_dim, self.index_format)
    }

    /// The same geometry with index keys stored as `format` (checked against the key's dims).
    pub fn with_index_format(mut self, format: IndexKeyFormat) -> Result<Self> {
        IndexKeyLayout::with_format(self.index_dim, format)?;
        self.index_format = format;
        Ok(self)
    }

    /// Checks that `layout` is this geometry's KV row layout (same format and dims).
    pub fn check_kv_row(&self, layout: KvRowLayout) -> Result<()> {
        let mine = self.kv_row()?;
        if layout == mine {
            return Ok(());
        }
        Err(MemoryError::invalid(
            "kv_format",
            format!("{} ({}+{} dims)", layout.format(), layout.blocked_dims(), layout.bf16_dims()),
            format!(
                "geometry {} stores {} rows of {}+{} dims",
                self.name,
                mine.format(),
                mine.blocked_dims(),
                mine.bf16_dims()
            ),
        ))
    }

    /// The softmax scale used by default: `1 / sqrt(d_qk)`.
    pub fn default_softmax_scale(&self) -> f32 {
        // d_qk is small (hundreds); the cast is exact.
        1.0 / (self.d_qk() as f32).sqrt()
    }

    /// Checks every field; the error names the first field at fault.
    pub fn validate(&self) -> Result<()> {
        for (field, value) in [
            ("layers", self.layers),
            ("q_heads", self.q_heads),
            ("index_heads", self.index_heads),
            ("index_dim", self.index_dim),
            ("top_k", self.top_k),
        ] {
            if value == 0 {
                return Err(MemoryError::invalid(field, value, "must be at least 1"));
            }
        }
        if self.top_k > i32::MAX as usize {
            return Err(MemoryError::invalid("top_k", self.top_k, "must fit in an i32 position"));
        }
        match &self.indexers {
            IndexerLayout::AllFull => {}
            IndexerLayout::Every { first_full, freq } => {
                if *first_full == 0 || *freq == 0 {
                    return Err(MemoryError::invalid(
                        "indexers",
                        format!("every {freq} after {first_full}"),
                        "first_full and freq must be at least 1 (layer 0 runs the indexer)",
                    ));
                }
            }
            IndexerLayout::Explicit { full } => {
                if full.len() != self.layers || !full.first().copied().unwrap_or(false) {
                    return Err(MemoryError::invalid(
                        "indexers",
                        format!("{} entries", full.len()),
                        format!("need one per layer ({}), the first full", self.layers),
                    ));
                }
            }
        }
        let row = self.kv_row()?;
        row.check_query_heads(self.q_heads)?;
        if let RowShape::Gqa { kv_heads, head_dim } = self.row
            && self.index_dim != kv_heads * head_dim
        {
            return Err(MemoryError::invalid(
                "index_dim",
                self.index_dim,
                format!("GQA index keys are the token's {kv_heads} keys of {head_dim}"),
            ));
        }
        self.index_key()?;
        Ok(())
    }

    /// Device bytes of one token's KV rows over all layers.
    pub fn kv_bytes_per_token(&self) -> Result<usize> {
        Ok(self.kv_row()?.row_bytes() * self.layers)
    }

    /// Device bytes of one token's index keys over all layers (only full layers store keys; a
    /// page summary's bytes shared by its positions).
    pub fn index_bytes_per_token(&self) -> Result<usize> {
        Ok(self.index_key()?.bytes_per_position() * self.index_layers())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Preset;

    #[test]
    fn presets_have_the_published_shapes() {
        let v32 = KvGeometry::preset("deepseek-v3.2").unwrap();
        assert_eq!((v32.layers, v32.q_heads, v32.index_heads, v32.index_dim, v32.top_k), (61, 128, 64, 128, 2048));
        let glm = KvGeometry::preset("glm-5.1").unwrap();
        assert_eq!((glm.layers, glm.q_heads, glm.index_heads, glm.index_dim, glm.top_k), (78, 64, 32, 128, 2048));
        for g in Preset::ALL.map(Preset::geometry).into_iter().filter(|g| g.kv_heads().is_none()) {
            g.validate().unwrap();
            assert_eq!((g.d_qk(), g.d_v()), (576, 512));
            assert_eq!(g.kv_row().unwrap().row_bytes(), 656);
            assert_eq!(g.clone().with_kv_format(KvRowFormat::Bf16).kv_row().unwrap().row_bytes(), 1152);
            assert_eq!(g.index_key().unwrap().row_bytes(), 132);
        }
        // 656 B x 61 layers = 40 016 B of MLA rows per token for V3.2 (DESIGN.md).
        assert_eq!(v32.kv_bytes_per_token().unwrap(), 40_016);
        assert_eq!(v32.index_bytes_per_token().unwrap(), 132 * 61);
        // Llama-3.1-8B: 8 KV heads of 128 in bf16, a 4096 B row; its index keys are its keys as
        // fp8 with a scale (1028 B), a quarter of the row.
        let llama = KvGeometry::preset("llama-3.1-8b").unwrap();
        assert_eq!(
            (llama.layers, llama.q_heads, llama.kv_heads(), llama.d_qk(), llama.top_k),
            (32, 32, Some(8), 128, 2048)
        );
        assert_eq!(llama.kv_row().unwrap().row_bytes(), 4096);
        assert_eq!(llama.index_key().unwrap().row_bytes(), 1028);
        assert_eq!(llama.kv_bytes_per_token().unwrap(), 4096 * 32);
    }

    #[test]
    fn glm_5_2_runs_the_indexer_on_21_of_78_layers() {
        let g = KvGeometry::preset("glm-5.2").unwrap();
        g.validate().unwrap();
        let full = g.full_layers();
        let mut want = vec![0, 1, 2];
        want.extend((6..78).step_by(4));
        assert_eq!(full, want);
        assert_eq!((full.len(), g.layers - full.len()), (21, 57));
        assert_eq!((g.index_source(5), g.index_source(6), g.index_source(77)), (2, 6, 74));
        assert_eq!((g.index_slot(6), g.index_slot(7), g.index_slot(74)), (Some(3), None, Some(20)));
        assert_eq!(g.index_bytes_per_token().unwrap(), 132 * 21);
        // The explicit form, as a config's indexer_types lists it, gives the same layers.
        let explicit = IndexerLayout::Explicit { full: (0..78).map(|l| g.is_full(l)).collect() };
        let e = g.clone().with_indexers(explicit);
        e.validate().unwrap();
        assert_eq!(e.full_layers(), full);
        assert!(KvGeometry::preset("glm-5.1").unwrap().full_layers().len() == 78);
        // Layer 0 must run an indexer; zero frequencies are named.
        let bad = g.clone().with_indexers(IndexerLayout::Explicit { full: vec![false; 78] });
        assert!(bad.validate().unwrap_err().to_string().contains("indexers"));
        let bad = g.clone().with_indexers(IndexerLayout::Every { first_full: 3, freq: 0 });
        assert!(bad.validate().is_err());
        let json = serde_json::to_string(&g).unwrap();
        assert!(json.contains(r#""kind":"every""#), "{json}");
        assert_eq!(serde_json::from_str::<KvGeometry>(&json).unwrap(), g);
    }

    #[test]
    fn smollm2_is_grouped_query_with_oracle_index_keys() {
        let g = KvGeometry::preset("smollm2-135m").unwrap();
        g.validate().unwrap();
        assert_eq!((g.layers, g.q_heads, g.kv_heads(), g.d_qk(), g.d_v()), (30, 9, Some(3), 64, 64));
        assert_eq!((g.kv_row().unwrap().row_bytes(), g.index_dim, g.index_heads), (768, 192, 9));
        assert_eq!(g.default_softmax_scale(), 0.125);
        // The 8-bit form: 384 values in three fp8 blocks of 128 with their scales.
        let f8 = g.clone().with_kv_format(KvRowFormat::Fp8);
        assert_eq!(f8.kv_row().unwrap().row_bytes(), 384 + 12);
        // Query heads that do not share KV heads evenly, and rows that disagree, are named.
        let mut bad = g.clone();
        bad.q_heads = 8;
        assert!(matches!(bad.validate(), Err(MemoryError::InvalidField { field: "q_heads", .. })));
        let json = serde_json::to_string(&g).unwrap();
        assert!(json.contains(r#""d_latent":384,"d_rope":0"#), "{json}");
        let bad = json.replace(r#""d_rope":0"#, r#""d_rope":64"#);
        let e = serde_json::from_str::<KvGeometry>(&bad).unwrap_err().to_string();
        assert!(e.contains("d_latent = 384+64"), "{e}");
        assert!(json.contains(r#""kind":"gqa""#), "{json}");
        assert_eq!(serde_json::from_str::<KvGeometry>(&json).unwrap(), g);
        // MLA geometries written before the field existed still read.
        let mla = serde_json::to_string(&KvGeometry::preset("glm-5.1").unwrap()).unwrap();
        let old = mla.replace(r#","row_heads":{"kind":"mla"}"#, "");
        assert_ne!(old, mla);
        assert_eq!(serde_json::from_str::<KvGeometry>(&old).unwrap().row, RowShape::Mla { d_latent: 512, d_rope: 64 });
    }

    #[test]
    fn unknown_preset_names_the_known_ones() {
        let e = KvGeometry::preset("llama").unwrap_err();
        assert!(e.to_string().contains("llama") && e.to_string().contains("glm-5.1"), "{e}");
    }

    #[test]
    fn zero_heads_is_rejected_by_name() {
        let mut g = KvGeometry::preset("cpu-small").unwrap();
        g.q_heads = 0;
        let e = g.validate().unwrap_err();
        assert!(matches!(e, MemoryError::InvalidField { field: "q_heads", .. }), "{e}");
        assert!(e.to_string().contains("q_heads = 0"), "{e}");
    }

    #[test]
    fn fp8_rows_need_latent_dims_in_blocks_of_128() {
        let mut g = KvGeometry::preset("cpu-small").unwrap();
        g.row = RowShape::Mla { d_latent: 500, d_rope: 64 };
        let e = g.validate().unwrap_err();
        assert!(matches!(e, MemoryError::InvalidField { field: "d_latent", .. }), "{e}");
        // bf16 rows take any latent width.
        g.kv_format = KvRowFormat::Bf16;
        g.validate().unwrap();
    }

    #[test]
    fn a_row_layout_of_another_format_is_named() {
        let g = KvGeometry::preset("glm-5.1").unwrap();
        g.check_kv_row(g.kv_row().unwrap()).unwrap();
        let other = KvRowLayout::new(KvRowFormat::Bf16, 512, 64).unwrap();
        let e = g.check_kv_row(other).unwrap_err();
        assert!(matches!(e, MemoryError::InvalidField { field: "kv_format", .. }), "{e}");
        assert!(e.to_string().contains("bf16") && e.to_string().contains("fp8"), "{e}");
    }

    #[test]
    fn json_round_trip_and_unknown_fields() {
        let g = KvGeometry::preset("glm-5.1").unwrap();
        let s = serde_json::to_string(&g).unwrap();
        assert!(s.contains("\"kv_format\":\"fp8\""), "{s}");
        let back: KvGeometry = serde_json::from_str(&s).unwrap();
        assert_eq!(back, g);
        let bad = s.replace("\"top_k\"", "\"topk\"");
        assert!(serde_json::from_str::<KvGeometry>(&bad).is_err());
    }
}
