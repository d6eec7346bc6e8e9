//! The workspace's features as the CI steps take them. Builds that link (tests, examples, the
//! program) take every feature of every member but those whose build links CUDA's libraries
//! (candle's `cuda` links libcuda, cuBLAS and cuRAND, absent on a machine without a GPU);
//! builds that do not link (clippy, docs) take all of them, with the stand-in nvcc.

use crate::workspace_root;

/// Features whose builds link CUDA's libraries.
pub const LINKING: [&str; 3] =
    ["hisparse-engine/candle-cuda", "hisparse-model/candle-cuda", "hisparse-bench/model-cuda"];

/// The members whose features count.
const MEMBERS: [&str; 6] =
    ["hisparse-memory", "hisparse-policy", "hisparse-kernels", "hisparse-engine", "hisparse-model", "hisparse-bench"];

/// Every feature of every member (`default` aside), as `crate/feature`, from their Cargo.toml.
pub fn all() -> Vec<String> {
    let mut out = Vec::new();
    for m in MEMBERS {
        let text = std::fs::read_to_string(workspace_root().join(m).join("Cargo.toml")).unwrap_or_default();
        let mut inside = false;
        for line in text.lines() {
            if line.starts_with('[') {
                inside = line.trim() == "[features]";
                continue;
            }
            if !inside {
                continue;
            }
            let key = line.split('=').next().unwrap_or("").trim();
            let bare = !line.starts_with([' ', '\t', '#', '"', ']']) && line.contains('=');
            if bare && !key.is_empty() && key != "default" {
                out.push(format!("{m}/{key}"));
            }
        }
    }
    out
}

/// [`all`] but the [`LINKING`] ones, comma-separated (for `--features`).
pub fn linkable() -> String {
    all().into_iter().filter(|f| !LINKING.contains(&f.as_str())).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_features_are_read_from_every_member() {
        let all = super::all();
        for f in ["hisparse-bench/cuda", "hisparse-bench/model", "hisparse-engine/candle", "hisparse-kernels/nccl"] {
            assert!(all.iter().any(|x| x == f), "{f} missing from {all:?}");
        }
        for f in super::LINKING {
            assert!(all.iter().any(|x| x == f), "{f} is no feature any more: {all:?}");
            assert!(!super::linkable().split(',').any(|x| x == f));
        }
    }
}
