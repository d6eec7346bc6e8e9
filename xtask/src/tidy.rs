//! Tidy checks that run with `cargo test`: every Rust file opens with a `//!` header saying what
//! it owns, GPU tests say why they are ignored, no debugging leftovers are committed, and in
//! `hisparse-kernels` only the swap-in (and the error enum) names `hisparse_policy`.

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if p.is_dir() {
                if !matches!(name, "target" | ".git" | ".gpu" | "fuzz") {
                    rust_files(&p, out);
                }
            } else if name.ends_with(".rs") {
                out.push(p);
            }
        }
    }

    fn files() -> Vec<PathBuf> {
        let root = super::super::workspace_root();
        let mut out = Vec::new();
        // The crates sit side by side at the workspace root (the design card's layout).
        for e in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            let name = e.file_name();
            if name.to_str().is_some_and(|n| n.starts_with("hisparse-") || n == "xtask") {
                rust_files(&e.path(), &mut out);
            }
        }
        assert!(out.len() > 10, "found only {} Rust files", out.len());
        out
    }

    #[test]
    fn every_rust_file_has_a_module_header() {
        let missing: Vec<_> = files()
            .into_iter()
            .filter(|p| !std::fs::read_to_string(p).unwrap_or_default().trim_start().starts_with("//!"))
            .collect();
        assert!(missing.is_empty(), "files without a //! header: {missing:?}");
    }

    #[test]
    fn only_the_swap_in_names_the_policy_crate_in_the_kernels() {
        let src = super::super::workspace_root().join("hisparse-kernels").join("src");
        let mut all = Vec::new();
        rust_files(&src, &mut all);
        assert!(all.len() > 10, "found only {} kernel files", all.len());
        let outside: Vec<_> = all
            .iter()
            .filter(|p| {
                let swap_in = [src.join("swap_in"), src.join("cpu/swap_in.rs"), src.join("cuda/swap_in")];
                !swap_in.iter().any(|s| p.starts_with(s)) && *p != &src.join("error.rs")
            })
            .filter(|p| std::fs::read_to_string(p).unwrap_or_default().contains(&["hisparse", "_policy"].concat()))
            .collect();
        assert!(outside.is_empty(), "kernel files outside the swap-in naming the policy crate: {outside:?}");
    }

    #[test]
    fn ignored_tests_say_why_and_no_debug_leftovers() {
        let bare_ignore = ["#[ignore", "]"].concat();
        let dbg = ["dbg", "!("].concat();
        for p in files() {
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            for (i, line) in text.lines().enumerate() {
                assert!(
                    !line.contains(&bare_ignore),
                    "{}:{}: an ignore attribute without a reason",
                    p.display(),
                    i + 1
                );
                assert!(!line.contains(&dbg), "{}:{}: leftover debug macro", p.display(), i + 1);
            }
        }
    }

    #[test]
    fn every_crate_declares_the_workspace_rust_version() {
        let root = super::super::workspace_root();
        let ws = std::fs::read_to_string(root.join("Cargo.toml")).unwrap_or_default();
        let msrv = ws
            .lines()
            .find_map(|l| l.strip_prefix("rust-version = \""))
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or_else(|| panic!("the workspace declares no rust-version"))
            .to_owned();
        for e in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let manifest = e.path().join("Cargo.toml");
            if !name.starts_with("hisparse-") || !manifest.exists() {
                continue;
            }
            let text = std::fs::read_to_string(&manifest).unwrap_or_default();
            let ok =
                text.contains("rust-version.workspace = true") || text.contains(&format!("rust-version = \"{msrv}\""));
            assert!(ok, "{name} does not declare rust-version {msrv}");
        }
    }
}
