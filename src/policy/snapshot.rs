//! Workspace snapshots, the pure part: a manifest (relative path → SHA-256,
//! size, mode) as git's tree model keeps it, the paths a client may name in
//! it, the difference between two manifests, a unified diff of small text
//! files, a guessed content type and a byte range. No I/O: the walk is in
//! `executor::snapshot`, the blobs in `store::snapshots`.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// Longest path a client may name, bytes (as the workspace tools allow).
pub const MAX_PATH_BYTES: usize = 1_024;
/// Longest component of such a path, bytes.
pub const MAX_COMPONENT_BYTES: usize = 255;
/// Largest side of a diff shown line by line, bytes; larger files are
/// reported changed with their digests only.
pub const MAX_DIFF_BYTES: u64 = 256 * 1024;
/// Most changed paths a diff answers with a unified diff each.
pub const MAX_DIFFED_FILES: usize = 50;

/// One file of a manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEntry {
    /// Relative path, `/`-separated, normalized by [`check_path`].
    pub path: String,
    /// SHA-256 of the content.
    pub digest: [u8; 32],
    /// Bytes.
    pub size: u64,
    /// Unix permission bits (0o644 when the platform has none).
    pub mode: u32,
}

/// The SHA-256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// A digest as lowercase hex.
pub fn hex(digest: &[u8]) -> String {
    use std::fmt::Write;
    digest.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Why a path a client named is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// Empty, or only `.` components.
    #[error("the path is empty")]
    Empty,
    /// Absolute, or with a `..` component, a backslash or a NUL: it could
    /// leave the workspace.
    #[error("the path must be relative, inside the workspace, without `..`, `\\` or NUL")]
    Outside,
    /// Over the length limits.
    #[error(
        "the path is longer than {MAX_PATH_BYTES} bytes or has a name over {MAX_COMPONENT_BYTES} bytes"
    )]
    TooLong,
}

/// The paths [`check_path`] takes, as the API document states them: names
/// separated by `/` with no backslash or NUL, none of them `..`, the first
/// neither empty nor `.` (so never absolute). Length limits aside.
pub const PATH_PATTERN: &str = concat!(
    "^(?:[^/\\\\\\u0000.][^/\\\\\\u0000]*|\\.[^/\\\\\\u0000.][^/\\\\\\u0000]*|\\.\\.[^/\\\\\\u0000]+)",
    "(?:/(?:[^/\\\\\\u0000.][^/\\\\\\u0000]*|\\.[^/\\\\\\u0000.][^/\\\\\\u0000]*|\\.\\.[^/\\\\\\u0000]+|\\.)?)*$"
);

/// Checks a path a client named and normalizes it (`./` and empty
/// components dropped): it cannot leave the workspace.
pub fn check_path(raw: &str) -> Result<String, PathError> {
    if raw.len() > MAX_PATH_BYTES {
        return Err(PathError::TooLong);
    }
    if raw.starts_with('/') || raw.contains('\0') || raw.contains('\\') {
        return Err(PathError::Outside);
    }
    let mut parts = Vec::new();
    for part in raw.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err(PathError::Outside),
            name if name.len() > MAX_COMPONENT_BYTES => return Err(PathError::TooLong),
            name => parts.push(name),
        }
    }
    if parts.is_empty() {
        return Err(PathError::Empty);
    }
    Ok(parts.join("/"))
}

/// How a path differs between two manifests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// Only in the later manifest.
    Added,
    /// Only in the earlier one.
    Removed,
    /// In both, with different content or mode.
    Changed,
}

/// One path that differs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change<'a> {
    /// The path.
    pub path: &'a str,
    /// How it differs.
    pub kind: ChangeKind,
    /// The earlier entry, unless added.
    pub from: Option<&'a FileEntry>,
    /// The later entry, unless removed.
    pub to: Option<&'a FileEntry>,
}

/// The paths that differ from `from` to `to`, sorted by path.
pub fn diff<'a>(from: &'a [FileEntry], to: &'a [FileEntry]) -> Vec<Change<'a>> {
    let mut paths: BTreeMap<&str, (Option<&FileEntry>, Option<&FileEntry>)> = BTreeMap::new();
    for e in from {
        paths.entry(&e.path).or_default().0 = Some(e);
    }
    for e in to {
        paths.entry(&e.path).or_default().1 = Some(e);
    }
    paths
        .into_iter()
        .filter_map(|(path, (a, b))| {
            let kind = match (a, b) {
                (None, Some(_)) => ChangeKind::Added,
                (Some(_), None) => ChangeKind::Removed,
                (Some(a), Some(b)) if a.digest != b.digest || a.mode != b.mode => {
                    ChangeKind::Changed
                }
                _ => return None,
            };
            Some(Change {
                path,
                kind,
                from: a,
                to: b,
            })
        })
        .collect()
}

/// Whether a change's sides are small enough to diff line by line.
pub fn diffable(change: &Change<'_>) -> bool {
    let small = |e: Option<&FileEntry>| e.is_none_or(|e| e.size <= MAX_DIFF_BYTES);
    small(change.from) && small(change.to)
}

/// Whether `bytes` read as text: UTF-8 without NUL.
pub fn is_text(bytes: &[u8]) -> bool {
    !bytes.contains(&0) && std::str::from_utf8(bytes).is_ok()
}

/// A unified diff of `old` to `new` (either absent: an added or removed
/// file), or `None` when a side is not text.
pub fn unified_diff(path: &str, old: Option<&[u8]>, new: Option<&[u8]>) -> Option<String> {
    fn text(b: Option<&[u8]>) -> Option<&str> {
        match b {
            None => Some(""),
            Some(b) if is_text(b) => std::str::from_utf8(b).ok(),
            Some(_) => None,
        }
    }
    let (a, b) = (text(old)?, text(new)?);
    let from = if old.is_some() {
        format!("a/{path}")
    } else {
        "/dev/null".into()
    };
    let to = if new.is_some() {
        format!("b/{path}")
    } else {
        "/dev/null".into()
    };
    Some(
        similar::TextDiff::from_lines(a, b)
            .unified_diff()
            .context_radius(3)
            .header(&from, &to)
            .to_string(),
    )
}

/// The content type a file is served with, guessed from its name, and for
/// names unknown from whether its first bytes read as text.
pub fn content_type(path: &str, head: &[u8]) -> &'static str {
    let ext = path
        .rsplit('/')
        .next()
        .and_then(|name| name.rsplit_once('.'))
        .map(|(_, ext)| ext.to_ascii_lowercase());
    let known = match ext.as_deref() {
        Some("md" | "markdown") => Some("text/markdown; charset=utf-8"),
        Some("txt" | "log" | "rs" | "py" | "go" | "c" | "h" | "sh" | "toml" | "yaml" | "yml") => {
            Some("text/plain; charset=utf-8")
        }
        Some("csv") => Some("text/csv; charset=utf-8"),
        Some("html" | "htm") => Some("text/html; charset=utf-8"),
        Some("css") => Some("text/css; charset=utf-8"),
        Some("js" | "mjs") => Some("text/javascript; charset=utf-8"),
        Some("json") => Some("application/json"),
        Some("xml") => Some("application/xml"),
        Some("svg") => Some("image/svg+xml"),
        Some("png") => Some("image/png"),
        Some("jpg" | "jpeg") => Some("image/jpeg"),
        Some("gif") => Some("image/gif"),
        Some("pdf") => Some("application/pdf"),
        Some("zip") => Some("application/zip"),
        Some("tar") => Some("application/x-tar"),
        Some("gz") => Some("application/gzip"),
        _ => None,
    };
    known.unwrap_or(if is_text(head) {
        "text/plain; charset=utf-8"
    } else {
        "application/octet-stream"
    })
}

/// A `Range` header that cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the range cannot be satisfied for a file of {len} bytes")]
pub struct RangeError {
    /// The file's length.
    pub len: u64,
}

/// The inclusive byte range a `Range: bytes=...` header asks of a file of
/// `len` bytes: `None` to serve it whole (no header, a unit other than
/// bytes, several ranges, a malformed one — all ignorable by RFC 9110).
pub fn byte_range(header: Option<&str>, len: u64) -> Result<Option<(u64, u64)>, RangeError> {
    let Some(spec) = header.and_then(|h| h.trim().strip_prefix("bytes=")) else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let Some((start, end)) = spec.trim().split_once('-') else {
        return Ok(None);
    };
    let parse = |s: &str| s.trim().parse::<u64>().ok();
    let range = match (start.trim().is_empty(), end.trim().is_empty()) {
        (true, true) => return Ok(None),
        (true, false) => match parse(end) {
            Some(0) => return Err(RangeError { len }),
            Some(n) => (len.saturating_sub(n), len.checked_sub(1)),
            None => return Ok(None),
        },
        (false, _) => match (parse(start), end.trim().is_empty()) {
            (Some(a), true) => (a, len.checked_sub(1)),
            (Some(a), false) => match parse(end) {
                Some(b) if b >= a => (a, Some(b.min(len.saturating_sub(1)))),
                _ => return Ok(None),
            },
            (None, _) => return Ok(None),
        },
    };
    match range {
        (a, Some(b)) if a <= b && a < len => Ok(Some((a, b))),
        _ => Err(RangeError { len }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_path_pattern_is_what_check_path_takes() {
        let pattern = regex::Regex::new(PATH_PATTERN).expect("a regex");
        let alphabet = ['a', '.', '/', '\\', '\0', 'é'];
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..200_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let len = (seed % 9) as usize;
            let path: String = (0..len)
                .map(|i| alphabet[((seed >> (8 + 5 * i)) % 6) as usize])
                .collect();
            let taken = check_path(&path).is_ok();
            if pattern.is_match(&path) {
                assert!(taken, "documented but refused: {path:?}");
            } else if taken {
                // Taken but not documented: only a first name of `` or `.`
                // (`./a`), which the server drops.
                let first = path.split('/').next().unwrap_or("");
                assert!(
                    first.is_empty() || first == ".",
                    "taken, undocumented: {path:?}"
                );
            }
        }
    }

    fn entry(path: &str, content: &[u8]) -> FileEntry {
        FileEntry {
            path: path.into(),
            digest: sha256(content),
            size: content.len() as u64,
            mode: 0o644,
        }
    }

    #[test]
    fn paths_cannot_leave_the_workspace() {
        assert_eq!(check_path("a/b.txt").unwrap(), "a/b.txt");
        assert_eq!(check_path("./a//b.txt").unwrap(), "a/b.txt");
        assert_eq!(check_path("a/./b").unwrap(), "a/b");
        assert_eq!(check_path("..a/b..").unwrap(), "..a/b..");
        for bad in [
            "../x",
            "a/../../x",
            "a/..",
            "..",
            "/etc/passwd",
            "a\0b",
            "a\\..\\b",
            "//x",
        ] {
            assert_eq!(check_path(bad), Err(PathError::Outside), "{bad:?}");
        }
        assert_eq!(check_path(""), Err(PathError::Empty));
        assert_eq!(check_path("./."), Err(PathError::Empty));
        assert_eq!(check_path(&"n".repeat(256)), Err(PathError::TooLong));
        assert_eq!(check_path(&"a/".repeat(600)), Err(PathError::TooLong));
        assert!(check_path(&"n".repeat(255)).is_ok());
    }

    #[test]
    fn a_diff_names_added_removed_and_changed_paths_in_order() {
        let from = vec![entry("a", b"1"), entry("b", b"2"), entry("c", b"3")];
        let mut c_mode = entry("c", b"3");
        c_mode.mode = 0o755;
        let to = vec![entry("b", b"2!"), c_mode, entry("d", b"4")];
        let d = diff(&from, &to);
        let kinds: Vec<(&str, ChangeKind)> = d.iter().map(|c| (c.path, c.kind)).collect();
        assert_eq!(
            kinds,
            [
                ("a", ChangeKind::Removed),
                ("b", ChangeKind::Changed),
                ("c", ChangeKind::Changed),
                ("d", ChangeKind::Added),
            ]
        );
        assert!(d[0].to.is_none() && d[3].from.is_none());
        assert!(diff(&from, &from).is_empty());
        assert_eq!(diff(&[], &from).len(), 3);
    }

    #[test]
    fn unified_diffs_cover_text_only() {
        let d = unified_diff("f.txt", Some(b"a\nb\n"), Some(b"a\nc\n")).unwrap();
        assert!(
            d.contains("--- a/f.txt") && d.contains("+++ b/f.txt"),
            "{d}"
        );
        assert!(d.contains("-b\n") && d.contains("+c\n"), "{d}");
        let added = unified_diff("n.txt", None, Some(b"x\n")).unwrap();
        assert!(
            added.contains("--- /dev/null") && added.contains("+x"),
            "{added}"
        );
        assert_eq!(unified_diff("bin", Some(b"\0\x01"), Some(b"x")), None);
        assert_eq!(unified_diff("bin", Some(&[0xff, 0xfe]), None), None);
    }

    #[test]
    fn only_small_files_are_diffed_line_by_line() {
        let small = entry("a", b"x");
        let mut big = entry("a", b"y");
        big.size = MAX_DIFF_BYTES + 1;
        let change = |from, to| Change {
            path: "a",
            kind: ChangeKind::Changed,
            from,
            to,
        };
        assert!(diffable(&change(Some(&small), Some(&small))));
        assert!(diffable(&change(None, Some(&small))));
        assert!(!diffable(&change(Some(&small), Some(&big))));
    }

    #[test]
    fn content_types_follow_names_then_content() {
        assert_eq!(
            content_type("README.md", b""),
            "text/markdown; charset=utf-8"
        );
        assert_eq!(content_type("a/b.JSON", b""), "application/json");
        assert_eq!(content_type("img.png", b"\x89PNG"), "image/png");
        assert_eq!(
            content_type("Makefile", b"all:\n"),
            "text/plain; charset=utf-8"
        );
        assert_eq!(content_type("blob", b"\0\x01"), "application/octet-stream");
        assert_eq!(
            content_type("dir.d/noext", b"\xff"),
            "application/octet-stream"
        );
    }

    #[test]
    fn ranges_are_read_as_rfc_9110_says() {
        let r = |h: &str, len| byte_range(Some(h), len);
        assert_eq!(byte_range(None, 10), Ok(None));
        assert_eq!(r("bytes=0-3", 10), Ok(Some((0, 3))));
        assert_eq!(r("bytes=5-", 10), Ok(Some((5, 9))));
        assert_eq!(r("bytes=-4", 10), Ok(Some((6, 9))));
        assert_eq!(r("bytes=-40", 10), Ok(Some((0, 9))));
        assert_eq!(r("bytes=8-100", 10), Ok(Some((8, 9))));
        assert_eq!(r("bytes=10-", 10), Err(RangeError { len: 10 }));
        assert_eq!(r("bytes=-0", 10), Err(RangeError { len: 10 }));
        assert_eq!(r("bytes=0-", 0), Err(RangeError { len: 0 }));
        // Ignored: served whole.
        assert_eq!(r("bytes=3-1", 10), Ok(None));
        assert_eq!(r("bytes=0-1,4-5", 10), Ok(None));
        assert_eq!(r("items=0-1", 10), Ok(None));
        assert_eq!(r("bytes=x-1", 10), Ok(None));
        assert_eq!(r("bytes=-", 10), Ok(None));
    }

    #[test]
    fn digests_are_sha256_in_hex() {
        assert_eq!(
            hex(&sha256(b"")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
