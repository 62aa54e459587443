//! The per-session sandbox the model's file tools work in. Every path is
//! relative to the session's directory; absolute paths, `..` and symlinks
//! that lead outside are refused.

use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

use uuid::Uuid;

use crate::policy::history::FileWrite;

/// A tool call that could not be carried out; its text goes back to the model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolError {
    /// The path would leave the workspace.
    #[error("path {0:?} is outside the workspace; use a relative path inside it")]
    Escape(String),
    /// No such file or directory.
    #[error("{0:?} does not exist")]
    NotFound(String),
    /// Content over the size limit.
    #[error("{what} is {size} bytes, over the limit of {limit} bytes")]
    TooLarge {
        /// What was too large.
        what: String,
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// The write would take the workspace over one of its quotas.
    #[error("workspace quota: {0}")]
    Quota(String),
    /// Bad or missing arguments.
    #[error("invalid arguments: {0}")]
    Arguments(String),
    /// The filesystem failed.
    #[error("{0}")]
    Io(String),
}

impl From<io::Error> for ToolError {
    fn from(err: io::Error) -> Self {
        ToolError::Io(err.to_string())
    }
}

/// A session's workspace directory.
#[derive(Debug, Clone)]
pub struct Workspace {
    root: PathBuf,
    /// Most bytes of files (`WARDEN_WORKSPACE_MAX_BYTES`).
    max_bytes: u64,
    /// Most files (`WARDEN_WORKSPACE_MAX_FILES`).
    max_files: u64,
}

/// What a workspace holds: bytes and files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Bytes of regular files.
    pub bytes: u64,
    /// Regular files.
    pub files: u64,
}

/// A stable 64-bit FNV-1a digest, hex: stored with file writes to spot a
/// file being written back to earlier content (rework).
pub fn digest(bytes: &[u8]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")
}

/// The directory of `session_id`'s workspace under `base`.
pub fn dir_of(base: &Path, session_id: Uuid) -> PathBuf {
    base.join(session_id.to_string())
}

impl Workspace {
    /// Opens (creating it) the workspace of `session_id` under `base`.
    pub fn open(base: &Path, session_id: Uuid) -> io::Result<Workspace> {
        let dir = dir_of(base, session_id);
        fs::create_dir_all(&dir)?;
        Ok(Workspace {
            root: dir.canonicalize()?,
            max_bytes: u64::MAX,
            max_files: u64::MAX,
        })
    }

    /// The same workspace held to `max_bytes` of files and `max_files` files.
    pub fn with_quota(mut self, max_bytes: u64, max_files: u64) -> Workspace {
        self.max_bytes = max_bytes;
        self.max_files = max_files;
        self
    }

    /// Bytes and files in the workspace now (symlinks are not followed).
    pub fn usage(&self) -> Result<Usage, ToolError> {
        let mut usage = Usage::default();
        let mut dirs = vec![self.root.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in fs::read_dir(&dir)? {
                let entry = entry?;
                let kind = entry.file_type()?;
                if kind.is_dir() {
                    dirs.push(entry.path());
                } else if kind.is_file() {
                    usage.files += 1;
                    usage.bytes += entry.metadata()?.len();
                }
            }
        }
        Ok(usage)
    }

    /// Refuses a write of `size` bytes to `path` (replacing what is there)
    /// that would take the workspace over its quotas.
    fn check_quota(&self, path: &Path, size: u64) -> Result<(), ToolError> {
        if self.max_bytes == u64::MAX && self.max_files == u64::MAX {
            return Ok(());
        }
        let usage = self.usage()?;
        let replaced = fs::symlink_metadata(path)
            .ok()
            .filter(|m| m.is_file())
            .map(|m| m.len());
        let files = usage.files + u64::from(replaced.is_none());
        let bytes = usage.bytes - replaced.unwrap_or(0).min(usage.bytes) + size;
        if files > self.max_files {
            return Err(ToolError::Quota(format!(
                "the workspace already holds {} files, the most WARDEN_WORKSPACE_MAX_FILES={} allows; \
overwrite or reuse an existing file",
                usage.files, self.max_files
            )));
        }
        if bytes > self.max_bytes {
            return Err(ToolError::Quota(format!(
                "writing {size} bytes would bring the workspace to {bytes} bytes, over \
WARDEN_WORKSPACE_MAX_BYTES={}; write less or overwrite a large file",
                self.max_bytes
            )));
        }
        Ok(())
    }

    /// The workspace directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Resolves a relative path, refusing anything that leads outside.
    pub fn resolve(&self, relative: &str) -> Result<PathBuf, ToolError> {
        let escape = || ToolError::Escape(relative.to_string());
        let path = Path::new(relative.trim());
        if path.is_absolute()
            || path
                .components()
                .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(escape());
        }
        let joined = self.root.join(path);
        // The deepest part that exists decides where symlinks lead.
        let mut existing = joined.as_path();
        while fs::symlink_metadata(existing).is_err() {
            existing = existing.parent().ok_or_else(escape)?;
        }
        let real = existing.canonicalize().map_err(|_| escape())?;
        if !real.starts_with(&self.root) {
            return Err(escape());
        }
        Ok(joined)
    }

    /// Reads a UTF-8 file of at most `limit` bytes.
    pub fn read(&self, relative: &str, limit: u64) -> Result<String, ToolError> {
        let path = self.resolve(relative)?;
        let meta = fs::metadata(&path).map_err(|_| ToolError::NotFound(relative.to_string()))?;
        if !meta.is_file() {
            return Err(ToolError::Arguments(format!("{relative:?} is not a file")));
        }
        if meta.len() > limit {
            return Err(ToolError::TooLarge {
                what: relative.to_string(),
                size: meta.len(),
                limit,
            });
        }
        let bytes = fs::read(&path)?;
        String::from_utf8(bytes)
            .map_err(|_| ToolError::Arguments(format!("{relative:?} is not UTF-8 text")))
    }

    /// Writes a file of at most `limit` bytes, creating parent directories.
    pub fn write(&self, relative: &str, content: &str, limit: u64) -> Result<FileWrite, ToolError> {
        let size = content.len() as u64;
        if size > limit {
            return Err(ToolError::TooLarge {
                what: "content".into(),
                size,
                limit,
            });
        }
        let path = self.resolve(relative)?;
        if path == self.root {
            return Err(ToolError::Arguments("a file name is required".into()));
        }
        if let Ok(meta) = fs::symlink_metadata(&path)
            && (meta.file_type().is_symlink() || meta.is_dir())
        {
            return Err(ToolError::Arguments(format!(
                "{relative:?} is a symlink or directory; refusing to overwrite it"
            )));
        }
        // Before anything is created, so a refused write leaves nothing behind.
        self.check_quota(&path, size)?;
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
            // Re-check after creating directories: a racing symlink must not lead out.
            let real = parent.canonicalize()?;
            if !real.starts_with(&self.root) {
                return Err(ToolError::Escape(relative.to_string()));
            }
        }
        // Through a temporary file and a rename: a failed write (a full
        // disk) leaves the old content, never half of the new one.
        let tmp = path.with_file_name(format!(
            ".{}.warden-tmp",
            path.file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().to_string())
        ));
        if let Err(err) = fs::write(&tmp, content).and_then(|()| fs::rename(&tmp, &path)) {
            let _ = fs::remove_file(&tmp);
            return Err(err.into());
        }
        Ok(FileWrite {
            path: relative.trim().trim_start_matches("./").to_string(),
            digest: digest(content.as_bytes()),
        })
    }

    /// Lists a directory: one entry a line, directories with a trailing `/`.
    pub fn list(&self, relative: &str) -> Result<Vec<String>, ToolError> {
        let path = self.resolve(if relative.trim().is_empty() {
            "."
        } else {
            relative
        })?;
        let entries = fs::read_dir(&path).map_err(|_| ToolError::NotFound(relative.to_string()))?;
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry?;
            let mut name = entry.file_name().to_string_lossy().to_string();
            if entry.file_type()?.is_dir() {
                name.push('/');
            }
            names.push(name);
        }
        names.sort();
        Ok(names)
    }

    /// Whether a regular file exists at `relative` inside the workspace.
    pub fn has_file(&self, relative: &str) -> bool {
        self.resolve(relative)
            .ok()
            .and_then(|p| fs::metadata(p).ok())
            .is_some_and(|m| m.is_file())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace() -> (tempdir::Dir, Workspace) {
        let dir = tempdir::Dir::new();
        let ws = Workspace::open(dir.path(), Uuid::new_v4()).unwrap();
        (dir, ws)
    }

    /// A throwaway directory removed on drop (no extra crate for it).
    mod tempdir {
        pub struct Dir(std::path::PathBuf);
        impl Dir {
            pub fn new() -> Dir {
                let p = std::env::temp_dir().join(format!("warden-ws-{}", uuid::Uuid::new_v4()));
                std::fs::create_dir_all(&p).unwrap();
                Dir(p)
            }
            pub fn path(&self) -> &std::path::Path {
                &self.0
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn writes_over_the_workspace_quotas_fail_naming_them_and_leave_nothing() {
        let (ws, _dir) = quota_workspace(100, 3);
        ws.write("a.txt", &"a".repeat(40), 1_000).unwrap();
        ws.write("d/b.txt", &"b".repeat(40), 1_000).unwrap();
        // Bytes: 80 used, 30 more would be 110 > 100.
        let err = ws.write("c.txt", &"c".repeat(30), 1_000).unwrap_err();
        assert!(matches!(err, ToolError::Quota(_)), "{err}");
        assert!(
            err.to_string().contains("WARDEN_WORKSPACE_MAX_BYTES"),
            "{err}"
        );
        assert!(!ws.has_file("c.txt"));
        let err = ws
            .write("new/dir/c.txt", &"c".repeat(30), 1_000)
            .unwrap_err();
        assert!(matches!(err, ToolError::Quota(_)));
        assert!(!ws.root().join("new").exists(), "no directory left behind");
        // Overwriting counts the replaced file out: 40 + 60 = 100 fits.
        ws.write("a.txt", &"a".repeat(60), 1_000).unwrap();
        assert_eq!(
            ws.usage().unwrap(),
            Usage {
                bytes: 100,
                files: 2
            }
        );
        ws.write("a.txt", "x", 1_000).unwrap();
        ws.write("c.txt", "c", 1_000).unwrap();
        // Files: 3 held, a fourth is refused; an overwrite is fine.
        let err = ws.write("e.txt", "e", 1_000).unwrap_err();
        assert!(
            err.to_string().contains("WARDEN_WORKSPACE_MAX_FILES"),
            "{err}"
        );
        assert!(!ws.has_file("e.txt"));
        ws.write("c.txt", "cc", 1_000).unwrap();
        assert_eq!(
            ws.usage().unwrap(),
            Usage {
                bytes: 43,
                files: 3
            }
        );
        // No temporary file is left either.
        assert_eq!(ws.list("").unwrap(), vec!["a.txt", "c.txt", "d/"]);
    }

    fn quota_workspace(bytes: u64, files: u64) -> (Workspace, PathBuf) {
        let base = std::env::temp_dir().join(format!("warden-ws-quota-{}", Uuid::new_v4()));
        let ws = Workspace::open(&base, Uuid::new_v4())
            .unwrap()
            .with_quota(bytes, files);
        (ws, base)
    }

    #[test]
    fn write_read_list_round_trip() {
        let (_d, ws) = workspace();
        let w = ws.write("docs/README.md", "# hi", 1024).unwrap();
        assert_eq!(w.path, "docs/README.md");
        assert_eq!(w.digest, digest(b"# hi"));
        assert_eq!(ws.read("docs/README.md", 1024).unwrap(), "# hi");
        assert_eq!(ws.list("").unwrap(), vec!["docs/"]);
        assert_eq!(ws.list("docs").unwrap(), vec!["README.md"]);
        assert!(ws.has_file("docs/README.md"));
        assert!(!ws.has_file("docs"));
        assert!(!ws.has_file("missing.txt"));
    }

    #[test]
    fn traversal_and_absolute_paths_are_refused() {
        let (_d, ws) = workspace();
        for bad in ["../x", "a/../../x", "/etc/passwd", "..", "a/.."] {
            assert!(
                matches!(ws.resolve(bad), Err(ToolError::Escape(_))),
                "{bad}"
            );
            assert!(ws.write(bad, "x", 10).is_err(), "{bad}");
        }
        assert!(matches!(
            ws.read("/etc/passwd", 1 << 20),
            Err(ToolError::Escape(_))
        ));
    }

    #[cfg(unix)]
    #[test]
    fn symlinks_out_of_the_workspace_are_refused() {
        let (d, ws) = workspace();
        let outside = d.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret.txt"), "s").unwrap();
        std::os::unix::fs::symlink(&outside, ws.root().join("link")).unwrap();
        assert!(matches!(
            ws.read("link/secret.txt", 100),
            Err(ToolError::Escape(_))
        ));
        assert!(matches!(
            ws.write("link/new.txt", "x", 100),
            Err(ToolError::Escape(_))
        ));
        assert!(matches!(ws.list("link"), Err(ToolError::Escape(_))));
        std::os::unix::fs::symlink(outside.join("secret.txt"), ws.root().join("file_link"))
            .unwrap();
        assert!(matches!(
            ws.read("file_link", 100),
            Err(ToolError::Escape(_))
        ));
        assert!(ws.write("file_link", "x", 100).is_err());
        assert_eq!(
            std::fs::read_to_string(outside.join("secret.txt")).unwrap(),
            "s"
        );
    }

    #[test]
    fn size_limits_apply() {
        let (_d, ws) = workspace();
        assert!(matches!(
            ws.write("a.txt", "12345", 4),
            Err(ToolError::TooLarge { .. })
        ));
        ws.write("b.txt", "12345", 10).unwrap();
        assert!(matches!(
            ws.read("b.txt", 4),
            Err(ToolError::TooLarge { .. })
        ));
    }

    #[test]
    fn digests_are_stable() {
        assert_eq!(digest(b""), "cbf29ce484222325");
        assert_eq!(digest(b"a"), "af63dc4c8601ec8c");
    }
}
