//! [`Preset`]: the named model geometries, parsed from their names once at the edge (a flag, a
//! config key) and carried as a value from there; each preset's [`KvGeometry`] is written here.

use crate::error::{MemoryError, Result};
use crate::geometry::{IndexerLayout, KvGeometry, RowShape};
use crate::row::{IndexKeyFormat, KvRowFormat};

/// A named model geometry:
///
/// | preset | layers | q heads | indexer | top-k | rows |
/// | --- | --- | --- | --- | --- | --- |
/// | `deepseek-v3.2` | 61 | 128 | 64 x 128 | 2048 | fp8 (656 B) |
/// | `glm-5.1` | 78 | 64 | 32 x 128 | 2048 | fp8 (656 B) |
/// | `glm-5.2` | 78 | 64 | 32 x 128 on 21 layers | 2048 | fp8 (656 B) |
/// | `cpu-small` | 4 | 16 | 8 x 128 | 256 | fp8 (656 B) |
/// | `smollm2-135m` | 30 | 9 (3 KV heads of 64) | oracle, 9 x 192 | 256 | bf16 GQA (768 B) |
/// | `llama-3.1-8b` | 32 | 32 (8 KV heads of 128) | oracle, 32 x 1024 | 2048 | bf16 GQA (4096 B) |
///
/// Every layer runs its indexer except in `glm-5.2` (IndexShare: layers 0, 1, 2 and then
/// every fourth, i.e. 6, 10, ..., 74, are full; the other 57 reuse the nearest preceding full
/// layer's selection). `cpu-small` keeps the real row formats and dims but few layers, heads
/// and a small top-k, so that the whole engine runs in seconds on a laptop.
///
/// ```
/// use hisparse_memory::Preset;
/// let p: Preset = "llama-3.1-8b".parse()?;
/// assert_eq!((p, p.name(), p.geometry().kv_heads()), (Preset::Llama31_8b, "llama-3.1-8b", Some(8)));
/// let e = "llama-9".parse::<Preset>().unwrap_err().to_string();
/// assert!(e.contains("llama-9") && e.contains("glm-5.1"), "{e}");
/// # Ok::<(), hisparse_memory::MemoryError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Preset {
    /// `deepseek-v3.2`.
    DeepseekV32,
    /// `glm-5.1`.
    Glm51,
    /// `glm-5.2` (GLM-5.1's shapes with IndexShare).
    Glm52,
    /// `cpu-small`.
    CpuSmall,
    /// `smollm2-135m`.
    Smollm2_135m,
    /// `llama-3.1-8b`.
    Llama31_8b,
}

impl Preset {
    /// Every preset, in the order help text lists them.
    pub const ALL: [Self; 6] =
        [Self::DeepseekV32, Self::Glm51, Self::Glm52, Self::CpuSmall, Self::Smollm2_135m, Self::Llama31_8b];

    /// Its name.
    pub const fn name(self) -> &'static str {
        match self {
            Self::DeepseekV32 => "deepseek-v3.2",
            Self::Glm51 => "glm-5.1",
            Self::Glm52 => "glm-5.2",
            Self::CpuSmall => "cpu-small",
            Self::Smollm2_135m => "smollm2-135m",
            Self::Llama31_8b => "llama-3.1-8b",
        }
    }

    /// Every preset's name, comma separated.
    pub fn names() -> String {
        Self::ALL.map(Self::name).join(", ")
    }

    /// Its geometry.
    pub fn geometry(self) -> KvGeometry {
        let name = self.name();
        let gqa = |layers, q_heads, kv_heads, head_dim, top_k| {
            // Invariant: these shapes are valid (the presets' test builds every one).
            KvGeometry::gqa(name, layers, q_heads, kv_heads, head_dim, top_k, KvRowFormat::Bf16)
                .expect("a GQA preset's shape is valid")
        };
        let (layers, q_heads, index_heads, top_k) = match self {
            Self::Smollm2_135m => return gqa(30, 9, 3, 64, 256),
            Self::Llama31_8b => return gqa(32, 32, 8, 128, 2048),
            Self::DeepseekV32 => (61, 128, 64, 2048),
            Self::Glm51 | Self::Glm52 => (78, 64, 32, 2048),
            Self::CpuSmall => (4, 16, 8, 256),
        };
        KvGeometry {
            name: name.to_owned(),
            layers,
            q_heads,
            row: RowShape::Mla { d_latent: 512, d_rope: 64 },
            index_heads,
            index_dim: 128,
            top_k,
            kv_format: KvRowFormat::Fp8,
            indexers: if self == Self::Glm52 {
                IndexerLayout::Every { first_full: 3, freq: 4 }
            } else {
                IndexerLayout::AllFull
            },
            index_format: IndexKeyFormat::Fp8,
        }
    }
}

impl KvGeometry {
    /// The geometry of the preset named `name` ([`Preset`]'s table).
    pub fn preset(name: &str) -> Result<Self> {
        Ok(name.parse::<Preset>()?.geometry())
    }
}

impl std::fmt::Display for Preset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Preset {
    type Err = MemoryError;
    fn from_str(name: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|p| p.name() == name)
            .ok_or_else(|| MemoryError::UnknownPreset { name: name.to_owned(), known: Self::names() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_is_valid_and_parses_back_from_its_name() {
        for p in Preset::ALL {
            let g = p.geometry();
            g.validate().unwrap();
            assert_eq!((g.name.as_str(), p.name().parse::<Preset>().unwrap()), (p.name(), p));
            assert_eq!(KvGeometry::preset(p.name()).unwrap(), g);
        }
        assert!(matches!("GLM-5.1".parse::<Preset>(), Err(MemoryError::UnknownPreset { .. })));
    }
}
