//! The module graph of a crate, read from its paths (`use` lines and paths written in code,
//! `crate::`, `super::` and `self::`), and the import circles in it: `cargo test -p xtask`
//! (part of `cargo xtask ci`) fails on any circle in any of our crates, naming the paths that
//! make it.
//!
//! A module depends on another when a path in it names that module or something in it. Between
//! a module and its ancestors dependencies go both ways by design (a parent re-exports its
//! children, a child uses its parent's shared types), so an edge is counted between the
//! children of the two modules' nearest common ancestor that hold them: `a::x` naming `b::y`
//! makes `a -> b` among the children of the crate root. A circle is a strongly connected set of
//! two or more such children. Test code does not count: modules named `tests` or `tests_*`,
//! and a file's text from its `#[cfg(test)] mod` on.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// A module's path from the crate root (`[]` is the root).
type ModPath = Vec<String>;

/// Every module of the crate whose sources are in `src`, with the text of its file.
fn modules(src: &Path) -> BTreeMap<ModPath, String> {
    fn walk(dir: &Path, prefix: &ModPath, out: &mut BTreeMap<ModPath, String>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                let mut sub = prefix.clone();
                sub.push(name);
                walk(&p, &sub, out);
            } else if let Some(stem) = name.strip_suffix(".rs") {
                if stem == "tests" || stem.starts_with("tests_") {
                    continue;
                }
                let mut m = prefix.clone();
                if !matches!(stem, "mod" | "lib" | "main") || !prefix.is_empty() && stem != "mod" {
                    m.push(stem.to_owned());
                }
                out.insert(m, std::fs::read_to_string(&p).unwrap_or_default());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(src, &Vec::new(), &mut out);
    out
}

/// The text of `code` without comments and string literals (paths in them are not uses).
fn code_only(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let b = code.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            i += 2;
            while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                i += 1;
            }
            i += 2;
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push(' ');
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// The paths `text` names from `crate::`, `super::` or `self::`, resolved from module `at`,
/// braces of `use` groups expanded (`use crate::{a::X, b}` names `a::X` and `b`).
fn named_paths(at: &ModPath, text: &str) -> Vec<ModPath> {
    let mut code = code_only(text);
    // A file's inline test module (by convention its last item) is test code.
    if let Some(i) = code.find("#[cfg(test)]\nmod ") {
        code.truncate(i);
    }
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < bytes.len() {
        let starts = ["crate::", "super::", "self::"].iter().find(|s| code[i..].starts_with(**s));
        let boundary = i == 0 || !ident(bytes[i - 1]) && bytes[i - 1] != b':';
        let Some(_) = starts.filter(|_| boundary) else {
            i += 1;
            continue;
        };
        // The path: identifiers and `::`, then possibly a brace group.
        let mut j = i;
        while j < bytes.len() && (ident(bytes[j]) || bytes[j] == b':') {
            j += 1;
        }
        let head: Vec<&str> = code[i..j].split("::").filter(|s| !s.is_empty()).collect();
        let mut base = at.clone();
        let mut rest = Vec::new();
        for (k, seg) in head.iter().enumerate() {
            match *seg {
                "crate" if k == 0 => base.clear(),
                "self" if rest.is_empty() => {}
                "super" if rest.is_empty() => {
                    base.pop();
                }
                s => rest.push(s.to_owned()),
            }
        }
        if j < bytes.len() && bytes[j] == b'{' {
            // A group: each item is a path below the head.
            let mut depth = 0;
            let mut end = j;
            for (k, &c) in bytes[j..].iter().enumerate() {
                match c {
                    b'{' => depth += 1,
                    b'}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = j + k;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            for item in split_top(&code[j + 1..end]) {
                let mut p = base.clone();
                p.extend(rest.iter().cloned());
                p.extend(
                    item.split("::")
                        .map(str::trim)
                        .filter(|s| !s.is_empty() && *s != "self")
                        .map(|s| s.split_whitespace().next().unwrap_or("").trim_end_matches('{').to_owned()),
                );
                out.push(p);
            }
            i = end.max(j) + 1;
        } else {
            let mut p = base;
            p.extend(rest);
            out.push(p);
            i = j.max(i + 1);
        }
    }
    out
}

/// The items of a brace group, split at its top-level commas.
fn split_top(group: &str) -> Vec<String> {
    let (mut out, mut cur, mut depth) = (Vec::new(), String::new(), 0);
    for c in group.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        if depth == 0 && c != '}' {
            cur.push(c);
        }
    }
    out.push(cur);
    out.into_iter().map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect()
}

/// The longest prefix of `p` that is a module of `mods`.
fn module_of(p: &ModPath, mods: &BTreeSet<ModPath>) -> ModPath {
    (0..=p.len()).rev().map(|n| p[..n].to_vec()).find(|m| mods.contains(m)).unwrap_or_default()
}

/// The import circles of the crate in `src`, each as `"parent: a, b, c"` (children sorted),
/// with the paths that make its edges (`module -> named path`): where to cut.
pub fn circles(src: &Path) -> Vec<(String, Vec<String>)> {
    let mods = modules(src);
    let names: BTreeSet<ModPath> = mods.keys().cloned().collect();
    // Edges between the children of a common ancestor: parent -> (from -> to).
    let mut edges: BTreeMap<ModPath, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    let mut why: BTreeMap<(ModPath, String, String), BTreeSet<String>> = BTreeMap::new();
    for (at, text) in &mods {
        for p in named_paths(at, text) {
            let to = module_of(&p, &names);
            let common = at.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if common == at.len() || common == to.len() {
                continue; // an ancestor or a descendant
            }
            let parent = at[..common].to_vec();
            let (a, b) = (at[common].clone(), to[common].clone());
            edges.entry(parent.clone()).or_default().entry(a.clone()).or_default().insert(b.clone());
            why.entry((parent, a, b)).or_default().insert(format!("{} -> {}", at.join("::"), p.join("::")));
        }
    }
    let mut out = Vec::new();
    for (parent, g) in &edges {
        for scc in strongly_connected(g) {
            let at = if parent.is_empty() { "crate".to_owned() } else { parent.join("::") };
            let inside = why
                .iter()
                .filter(|((p, a, b), _)| p == parent && scc.contains(a) && scc.contains(b))
                .flat_map(|(_, w)| w.iter().cloned())
                .collect();
            out.push((format!("{at}: {}", scc.join(", ")), inside));
        }
    }
    out
}

/// The strongly connected sets of two or more nodes of `g` (each sorted), by reachability.
fn strongly_connected(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(n) = todo.pop() {
            for m in g.get(&n).into_iter().flatten() {
                if seen.insert(m.clone()) {
                    todo.push(m.clone());
                }
            }
        }
        seen
    };
    let nodes: BTreeSet<&String> = g.keys().chain(g.values().flatten()).collect();
    let reaches: BTreeMap<&String, BTreeSet<String>> = nodes.iter().map(|n| (*n, reach(n))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for n in &nodes {
        if done.contains(*n) || !reaches[n].contains(*n) {
            continue;
        }
        let scc: Vec<String> = nodes
            .iter()
            .filter(|m| reaches[n].contains(**m) && reaches[*m].contains(*n))
            .map(|m| (*m).clone())
            .collect();
        done.extend(scc.iter().cloned());
        if scc.len() > 1 {
            out.push(scc);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_from_their_module() {
        let at: ModPath = vec!["cmd".into(), "run".into()];
        let got =
            named_paths(&at, "use super::run_args::{A, b::C};\nlet x = crate::files::f(); // crate::no\n\"super::no\"");
        let want: Vec<ModPath> = vec![
            vec!["cmd".into(), "run_args".into(), "A".into()],
            vec!["cmd".into(), "run_args".into(), "b".into(), "C".into()],
            vec!["files".into(), "f".into()],
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn a_circle_among_siblings_is_found_and_an_ancestor_edge_is_not() {
        let g: BTreeMap<String, BTreeSet<String>> = [
            ("a".to_owned(), ["b".to_owned()].into()),
            ("b".to_owned(), ["c".to_owned()].into()),
            ("c".to_owned(), ["a".to_owned()].into()),
            ("d".to_owned(), ["a".to_owned()].into()),
        ]
        .into();
        assert_eq!(strongly_connected(&g), vec![vec!["a".to_owned(), "b".to_owned(), "c".to_owned()]]);
    }

    #[test]
    fn no_crate_has_an_import_circle() {
        let root = crate::workspace_root();
        let mut found = Vec::new();
        for c in [
            "hisparse-memory",
            "hisparse-policy",
            "hisparse-kernels",
            "hisparse-engine",
            "hisparse-model",
            "hisparse-bench",
            "hisparse-py",
            "xtask",
        ] {
            for (circle, paths) in circles(&root.join(c).join("src")) {
                found.push((format!("{c} {circle}"), paths));
            }
        }
        assert!(found.is_empty(), "import circles (cut each at one of its paths): {found:#?}");
    }
}
