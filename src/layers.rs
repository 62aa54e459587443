//! The one-way dependency rule, checked: every top-level module has a rank,
//! and a module may name (`crate::x`) only modules of a lower rank, so no
//! import cycle between top-level modules can exist. A new module must be
//! given its place here.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Top-level modules from the bottom up; a module may use only modules of a
/// lower rank.
const LAYERS: &[(&str, u8)] = &[
    ("policy", 0),
    ("egress", 0),
    ("secrets", 0),
    ("threads", 0),
    ("ratelimit", 0),
    ("event", 1),
    ("llm", 1),
    ("metrics", 1),
    ("store", 2),
    ("config", 2),
    ("executor", 3),
    ("auth", 3),
    ("session", 4),
    ("http", 5),
];

fn rank(module: &str) -> Option<u8> {
    LAYERS.iter().find(|(m, _)| *m == module).map(|(_, r)| *r)
}

/// Every `.rs` file below `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level modules a source names through `crate::` (comments aside),
/// including each member of a `crate::{a, b::c}` group.
fn named_modules(source: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in source.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let names: Vec<&str> = match rest.strip_prefix('{') {
                Some(group) => {
                    let end = group.find('}').unwrap_or(group.len());
                    group[..end].split(',').collect()
                }
                None => vec![rest],
            };
            for name in names {
                let ident: String = name
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !ident.is_empty() {
                    out.insert(ident);
                }
            }
        }
    }
    out
}

#[test]
fn modules_only_use_lower_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut upward = Vec::new();
    for file in files {
        let relative = file.strip_prefix(&src).unwrap();
        let top = relative.components().next().unwrap().as_os_str();
        let module = top.to_string_lossy().trim_end_matches(".rs").to_string();
        // The crate root and the binaries wire everything together.
        if ["lib", "main", "bin", "layers"].contains(&module.as_str()) {
            continue;
        }
        let own = rank(&module)
            .unwrap_or_else(|| panic!("src/{module} has no place in LAYERS (src/layers.rs)"));
        let source = std::fs::read_to_string(&file).unwrap();
        for used in named_modules(&source) {
            if used == module {
                continue;
            }
            match rank(&used) {
                Some(r) if r < own => {}
                _ => upward.push(format!("{} uses crate::{used}", relative.display())),
            }
        }
    }
    assert!(
        upward.is_empty(),
        "dependencies must point down the layers (src/layers.rs):\n{}",
        upward.join("\n")
    );
}

#[test]
fn grouped_and_inline_paths_are_seen() {
    let source = "use crate::{store::Store, policy};\nlet x = crate::event::SessionEvent::X; // crate::http\n";
    let found: Vec<String> = named_modules(source).into_iter().collect();
    assert_eq!(found, ["event", "policy", "store"]);
}
