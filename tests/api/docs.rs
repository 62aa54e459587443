//! The documentation's links: every relative link in the README,
//! ARCHITECTURE.md, the other top-level pages and `docs/` names a file or
//! folder of the repository, and every `#anchor` into a Markdown page names
//! one of its headings (as GitHub spells them).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The pages checked: the top level's and everything under `docs/`.
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("a readable folder") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    for entry in std::fs::read_dir(root()).expect("the repository") {
        let path = entry.expect("an entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
    walk(&root().join("docs"), &mut out);
    out.sort();
    out
}

/// The page's text outside fenced code blocks and inline code.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            let mut inline = false;
            for c in line.chars() {
                if c == '`' {
                    inline = !inline;
                } else if !inline {
                    out.push(c);
                }
            }
            out.push('\n');
        }
    }
    out
}

/// The targets of the page's `[text](target)` links.
fn links(text: &str) -> Vec<String> {
    let prose = prose(text);
    let mut out = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        let tail = &rest[at + 2..];
        let Some(end) = tail.find(')') else { break };
        out.push(tail[..end].trim().to_string());
        rest = &tail[end..];
    }
    out
}

/// GitHub's anchor of a heading: lower case, spaces to hyphens, only
/// letters, digits, hyphens and underscores kept.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.insert(slug(line.trim_start_matches('#').replace('`', "").as_str()));
        }
    }
    out
}

#[test]
fn every_link_in_the_documentation_reaches_its_target() {
    let mut broken = Vec::new();
    let pages = pages();
    assert!(pages.len() > 10, "the documentation's pages: {pages:?}");
    for page in &pages {
        let text = std::fs::read_to_string(page).expect("a readable page");
        let shown = page
            .strip_prefix(root())
            .unwrap_or(page)
            .display()
            .to_string();
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") || target.starts_with('<') {
                continue;
            }
            let (path, anchor) = target.split_once('#').unwrap_or((target.as_str(), ""));
            let file = if path.is_empty() {
                page.clone()
            } else {
                page.parent().expect("a folder").join(path)
            };
            if !file.exists() {
                broken.push(format!("{shown}: {target} (no such file)"));
                continue;
            }
            let inside = file.canonicalize().expect("an existing path");
            if !inside.starts_with(root().canonicalize().expect("the root")) {
                broken.push(format!("{shown}: {target} (outside the repository)"));
                continue;
            }
            if !anchor.is_empty() && file.extension().is_some_and(|e| e == "md") {
                let there = std::fs::read_to_string(&file).expect("a readable page");
                if !anchors(&there).contains(anchor) {
                    broken.push(format!("{shown}: {target} (no such heading)"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn links_and_anchors_are_read_as_github_reads_them() {
    assert_eq!(
        links("see [a](docs/a.md) and `[not](b.md)` and [c](#how-a-session-ends)"),
        ["docs/a.md", "#how-a-session-ends"]
    );
    assert_eq!(slug("How a session ends"), "how-a-session-ends");
    assert_eq!(
        slug("Sessions that delegate: child sessions"),
        "sessions-that-delegate-child-sessions"
    );
    assert!(anchors("# Title\n```\n# not a heading\n```\n## `Code` name").contains("code-name"));
}
