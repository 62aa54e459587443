//! The one-way dependency rule, checked: every top-level module has a rank,
//! and a module may name (`crate::x`) only modules of a lower rank, so no
//! import cycle between top-level modules can exist. Inside the layers with
//! many files (`session`, `store`, `http`) the files are ranked the same way
//! and a file may name (`super::x`, `crate::layer::x`) only files below it;
//! so are the files of `session`'s two folders, `runtime` below `api`.
//! A few edges are refused outright (`NEVER`): the HTTP layer never names
//! the store, it calls the use cases of `session`; the session runtime
//! never names those use cases.
//! A new module or file must be given its place here.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Top-level modules from the bottom up; a module may use only modules of a
/// lower rank.
const LAYERS: &[(&str, u8)] = &[
    ("policy", 0),
    ("egress", 0),
    ("secrets", 0),
    ("thread_priority", 0),
    ("ratelimit", 0),
    ("telemetry", 0),
    ("event", 1),
    ("llm", 1),
    ("mcp", 1),
    ("spec", 1),
    ("metrics", 1),
    ("store", 2),
    ("config", 2),
    ("executor", 3),
    ("auth", 3),
    ("session", 4),
    ("http", 5),
    // The binary's command line (`mod cli` of src/main.rs, outside the
    // library): it reaches the layers as `warden::...`; none can name it.
    ("cli", 6),
];

/// The files and folders of `src/session`, from the bottom up: what both
/// halves share, the runtime that runs the loops, and above it the use
/// cases the HTTP layer calls. Its face, `mod.rs`, declares and re-exports
/// them and has no rank.
const SESSION: &[(&str, u8)] = &[
    ("error", 0),
    ("event_codec", 0),
    ("sweep", 0),
    ("retention", 1),
    ("persist", 0),
    ("archive", 1),
    ("runtime", 2),
    ("api", 3),
];

/// The files (or folders) of `src/session/runtime`, from the bottom up: a
/// loop's memory and store ports, the loop, how a session is rebuilt, and
/// the supervisor that runs the loops. Its face, `mod.rs`, has no rank.
const RUNTIME: &[(&str, u8)] = &[
    ("lease_clock", 0),
    ("live", 0),
    ("loop_store", 0),
    ("reflector", 0),
    ("pruner", 0),
    ("storable", 1),
    ("journal", 2),
    ("runner", 2),
    ("rehydrate", 3),
    ("supervisor", 4),
];

/// The files of `src/session/api`, one use case each, from the bottom up:
/// a use case may use the ones below it (a create's request below its
/// pre-flight below the create; a stop's landing below the stop; the
/// approvals and trees resume and stop through `control`). Its `mod.rs`
/// holds the service they share and has no rank.
const API: &[(&str, u8)] = &[
    ("planner", 0),
    ("reads", 0),
    ("create_request", 0),
    ("placement", 0),
    ("delete", 1),
    ("queries", 1),
    ("refine", 1),
    ("stop_landing", 1),
    ("tenant_retention", 1),
    ("update", 1),
    ("workers", 1),
    ("preflight", 2),
    ("control", 2),
    ("create", 3),
    ("fork_seed", 0),
    ("fork", 4),
    ("workspace_files", 1),
    ("approvals", 3),
    ("tree", 3),
    ("estimate", 2),
    ("confirm", 4),
    ("tenant_warn_at", 1),
    ("insights", 2),
    ("apply_threshold", 3),
    ("notify", 2),
    ("replay", 1),
];

/// The files of `src/store`, from the bottom up: the SQL of one table
/// above the row types and paging it shares.
const STORE: &[(&str, u8)] = &[
    ("scope", 0),
    ("batch", 0),
    ("connection", 0),
    ("embedded", 0),
    ("flush", 0),
    ("quotas", 0),
    ("checkpoints", 0),
    ("control_channel", 0),
    ("worker_notices", 0),
    ("worker_writes", 1),
    ("fleet", 1),
    ("idempotency", 0),
    ("keys", 0),
    ("model_calls", 0),
    ("notify", 1),
    ("secrets", 1),
    ("schema", 0),
    ("testing", 1),
    ("rows", 2),
    ("event_log", 3),
    ("group_commit", 3),
    ("journal", 3),
    ("approvals", 3),
    ("outcomes", 3),
    ("tasks", 3),
    ("snapshots", 3),
    ("leases", 4),
    ("queue", 4),
    ("reflections", 4),
    ("rebuild", 3),
    ("replay", 3),
    ("sessions", 4),
    ("children", 4),
    ("worker_tasks", 4),
    ("worker_desk", 5),
    ("iterations", 5),
    ("archive", 5),
    ("past_runs", 3),
    ("histories", 3),
    ("trace_links", 3),
    ("thresholds", 1),
];

/// The files of `src/http`, from the bottom up: errors and documents, the
/// extractors and shared helpers, the routes, and the OpenAPI document
/// generated from the routes.
const HTTP: &[(&str, u8)] = &[
    ("error", 0),
    ("views", 0),
    ("serve", 0),
    ("admission", 1),
    ("assets", 1),
    ("auth", 1),
    ("extract", 1),
    ("health", 1),
    ("paging", 1),
    ("event_stream", 1),
    ("history", 2),
    ("keys", 2),
    ("sessions", 2),
    ("workers", 2),
    ("retention", 2),
    ("budget_warnings", 2),
    ("insights", 3),
    ("tree", 2),
    ("notify", 2),
    ("approvals", 3),
    ("estimate", 3),
    ("files", 3),
    ("replay", 3),
    ("openapi", 4),
];

/// Modules a layer (or a folder of one) never names, as `crate::` paths,
/// and why: the ranks allow any lower module, these edges skip a layer or
/// point against the flow the ranks only imply.
const NEVER: &[(&str, &str, &str)] = &[
    (
        "http",
        "store",
        "handlers call the use cases of `session` (which re-exports the row and scope types they shape), never the store",
    ),
    (
        "session/runtime",
        "session::api",
        "the use cases drive the runtime; the runtime never calls a use case",
    ),
];

/// The layers (and folders of them) whose files are ranked, with their
/// ranking.
const INSIDE: &[(&str, &[(&str, u8)])] = &[
    ("session", SESSION),
    ("session/runtime", RUNTIME),
    ("session/api", API),
    ("store", STORE),
    ("http", HTTP),
];

fn rank(module: &str) -> Option<u8> {
    rank_in(LAYERS, module)
}

fn rank_in(ranks: &[(&str, u8)], name: &str) -> Option<u8> {
    ranks.iter().find(|(m, _)| *m == name).map(|(_, r)| *r)
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
    names_after(source, "crate::")
}

/// The first names after each `prefix` in a source (comments aside),
/// including each member of a `prefix{a, b::c}` group.
fn names_after(source: &str, prefix: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in source.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find(prefix) {
            // `xsuper::` is no `super::`.
            let joined = rest[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
            rest = &rest[at + prefix.len()..];
            if joined {
                continue;
            }
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

/// The files below `src/{layer}` that name `crate::{module}` (comments
/// aside; unit tests included: a grep must find none). `module` may be a
/// path (`session::api`).
fn naming(src: &Path, layer: &str, module: &str) -> Vec<String> {
    let (parent, name) = match module.rsplit_once("::") {
        Some((parent, name)) => (format!("crate::{parent}::"), name),
        None => ("crate::".to_string(), module),
    };
    let mut files = Vec::new();
    sources(&src.join(layer), &mut files);
    files.sort();
    files
        .into_iter()
        .filter(|file| {
            let source = std::fs::read_to_string(file).unwrap();
            names_after(&source, &parent).contains(name)
        })
        .map(|file| file.strip_prefix(src).unwrap().display().to_string())
        .collect()
}

#[test]
fn layers_skip_no_layer_they_must_not() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut skipping = Vec::new();
    for (layer, module, why) in NEVER {
        for file in naming(&src, layer, module) {
            skipping.push(format!("src/{file} names crate::{module}: {why}"));
        }
    }
    assert!(
        skipping.is_empty(),
        "a layer names a module it must not (NEVER in src/layers.rs):\n{}",
        skipping.join("\n")
    );
}

#[test]
fn a_store_path_in_http_is_found() {
    let dir = std::env::temp_dir().join(format!("warden-layers-{}", std::process::id()));
    let http = dir.join("http");
    std::fs::create_dir_all(&http).unwrap();
    std::fs::write(
        http.join("a.rs"),
        "use crate::session::TenantScope; // crate::store in a comment\n",
    )
    .unwrap();
    std::fs::write(
        http.join("b.rs"),
        "use crate::{auth::Principal, store::TreeRow};\n",
    )
    .unwrap();
    std::fs::write(
        http.join("c.rs"),
        "fn f() { let _ = crate::store::storable_text(\"x\"); }\n",
    )
    .unwrap();
    let found = naming(&dir, "http", "store");
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(found, ["http/b.rs", "http/c.rs"]);
}

#[test]
fn an_api_path_in_the_runtime_is_found() {
    let dir = std::env::temp_dir().join(format!("warden-layers-api-{}", std::process::id()));
    let runtime = dir.join("session").join("runtime");
    std::fs::create_dir_all(&runtime).unwrap();
    std::fs::write(
        runtime.join("a.rs"),
        "use crate::session::{api::SessionService, error::Result};\n",
    )
    .unwrap();
    std::fs::write(
        runtime.join("b.rs"),
        "use crate::session::runtime::live::LiveView; // crate::session::api\n",
    )
    .unwrap();
    let found = naming(&dir, "session/runtime", "session::api");
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(found, ["session/runtime/a.rs"]);
}

/// A file's own code: without its trailing `#[cfg(test)] mod tests` (a
/// unit test may reach any file, as the integration tests do).
fn without_unit_tests(source: &str) -> &str {
    let mut at = 0;
    let mut lines = source.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim() == "#[cfg(test)]"
            && lines
                .peek()
                .is_some_and(|next| next.starts_with("mod tests"))
        {
            return &source[..at];
        }
        at += line.len() + 1;
    }
    source
}

/// The files of `layer` a file of it names, as `super::x` from a file
/// directly in the layer's folder or `crate::layer::x` from anywhere in it
/// (`super::` from deeper down stays inside the file's own folder).
fn named_files(source: &str, layer: &str, directly_inside: bool) -> BTreeSet<String> {
    let mut out = names_after(source, &format!("crate::{layer}::"));
    if directly_inside {
        out.extend(names_after(source, "super::"));
    }
    out
}

#[test]
fn files_only_use_lower_files_inside_their_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut upward = Vec::new();
    for (layer, ranks) in INSIDE {
        let dir = src.join(layer);
        let mut files = Vec::new();
        sources(&dir, &mut files);
        for file in files {
            let relative = file.strip_prefix(&dir).unwrap();
            let parts: Vec<String> = relative
                .components()
                .map(|c| {
                    c.as_os_str()
                        .to_string_lossy()
                        .trim_end_matches(".rs")
                        .to_string()
                })
                .collect();
            // The layer's face declares, wires and re-exports its files.
            if parts == ["mod"] {
                continue;
            }
            let own = rank_in(ranks, &parts[0]).unwrap_or_else(|| {
                panic!("src/{layer}/{} has no place in src/layers.rs", parts[0])
            });
            let source = std::fs::read_to_string(&file).unwrap();
            let directly_inside = parts.len() == 1;
            let path = layer.replace('/', "::");
            for used in named_files(without_unit_tests(&source), &path, directly_inside) {
                if used == parts[0] {
                    continue;
                }
                // Names that are no file are the face's own items and re-exports.
                let Some(r) = rank_in(ranks, &used) else {
                    continue;
                };
                if r >= own {
                    upward.push(format!(
                        "src/{layer}/{} uses {layer}::{used}",
                        relative.display()
                    ));
                }
            }
        }
    }
    assert!(
        upward.is_empty(),
        "inside a layer, files must use only files below them (src/layers.rs):\n{}",
        upward.join("\n")
    );
}

#[test]
fn super_paths_and_test_modules_are_told_apart() {
    let source = "use super::{error::ApiError, views};\nuse crate::http::paging::x;\nfn f() { a_super::b(); }\n#[cfg(test)]\nmod tests {\n    use super::openapi;\n}\n";
    let own = without_unit_tests(source);
    let found: Vec<String> = named_files(own, "http", true).into_iter().collect();
    assert_eq!(found, ["error", "paging", "views"]);
    let deeper: Vec<String> = named_files(own, "http", false).into_iter().collect();
    assert_eq!(deeper, ["paging"]);
}

#[test]
fn grouped_and_inline_paths_are_seen() {
    let source = "use crate::{store::Store, policy};\nlet x = crate::event::SessionEvent::X; // crate::http\n";
    let found: Vec<String> = named_modules(source).into_iter().collect();
    assert_eq!(found, ["event", "policy", "store"]);
}
