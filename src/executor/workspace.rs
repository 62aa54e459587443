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

/// Longest relative path a tool may name, in bytes.
pub const MAX_PATH_BYTES: usize = 1_024;
/// Longest component (file or directory name) of such a path, in bytes.
pub const MAX_COMPONENT_BYTES: usize = 255;

/// What one workspace may hold: bytes, files, entries of every kind
/// (directories too, so deep paths cannot create inodes without end), and
/// how deep and long a path may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most bytes of files (`WARDEN_WORKSPACE_MAX_BYTES`).
    pub max_bytes: u64,
    /// Most files (`WARDEN_WORKSPACE_MAX_FILES`).
    pub max_files: u64,
    /// Most entries, directories included (`WARDEN_WORKSPACE_MAX_ENTRIES`).
    pub max_entries: u64,
    /// Most components of a relative path (`WARDEN_WORKSPACE_MAX_DEPTH`).
    pub max_depth: usize,
    /// Longest relative path, bytes.
    pub max_path_bytes: usize,
    /// Longest component of a path, bytes.
    pub max_component_bytes: usize,
}

impl Limits {
    /// No quota on what the workspace holds; paths still within the
    /// filesystem-friendly length limits.
    pub const UNLIMITED: Limits = Limits {
        max_bytes: u64::MAX,
        max_files: u64::MAX,
        max_entries: u64::MAX,
        max_depth: usize::MAX,
        max_path_bytes: MAX_PATH_BYTES,
        max_component_bytes: MAX_COMPONENT_BYTES,
    };

    /// Refuses a relative path deeper or longer than the limits allow.
    pub fn check_path(&self, relative: &Path) -> Result<(), ToolError> {
        let mut depth = 0usize;
        let mut bytes = 0usize;
        for component in relative.components() {
            let Component::Normal(name) = component else {
                continue;
            };
            let len = name.as_encoded_bytes().len();
            if len > self.max_component_bytes {
                return Err(ToolError::Quota(format!(
                    "a path component is {len} bytes, over the limit of {} bytes per name",
                    self.max_component_bytes
                )));
            }
            depth += 1;
            bytes += len + usize::from(depth > 1);
        }
        if depth > self.max_depth {
            return Err(ToolError::Quota(format!(
                "the path is {depth} levels deep, over WARDEN_WORKSPACE_MAX_DEPTH={}; use a flatter layout",
                self.max_depth
            )));
        }
        if bytes > self.max_path_bytes {
            return Err(ToolError::Quota(format!(
                "the path is {bytes} bytes long, over the limit of {} bytes; use shorter names",
                self.max_path_bytes
            )));
        }
        Ok(())
    }

    /// Refuses a write of `size` bytes that creates `new_entries` entries
    /// (missing parent directories and, unless it replaces a file of
    /// `replaced` bytes, the file) in a workspace holding `usage`.
    pub fn check_write(
        &self,
        usage: Usage,
        new_entries: u64,
        replaced: Option<u64>,
        size: u64,
    ) -> Result<(), ToolError> {
        let files = usage.files.saturating_add(u64::from(replaced.is_none()));
        let bytes = (usage.bytes - replaced.unwrap_or(0).min(usage.bytes)).saturating_add(size);
        let entries = usage.entries.saturating_add(new_entries);
        if files > self.max_files {
            return Err(ToolError::Quota(format!(
                "the workspace already holds {} files, the most WARDEN_WORKSPACE_MAX_FILES={} allows; \
overwrite or reuse an existing file",
                usage.files, self.max_files
            )));
        }
        if entries > self.max_entries {
            return Err(ToolError::Quota(format!(
                "the workspace holds {} files and directories and this write would add {new_entries}, \
over WARDEN_WORKSPACE_MAX_ENTRIES={}; reuse existing files and directories",
                usage.entries, self.max_entries
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

    /// What one session's workspace may hold under the configured quotas.
    pub fn from_quotas(quotas: &crate::config::Quotas) -> Limits {
        Limits {
            max_bytes: quotas.workspace_max_bytes,
            max_files: quotas.workspace_max_files,
            max_entries: quotas.workspace_max_entries,
            max_depth: quotas.workspace_max_depth,
            ..Limits::UNLIMITED
        }
    }

    fn unlimited_usage(&self) -> bool {
        self.max_bytes == u64::MAX && self.max_files == u64::MAX && self.max_entries == u64::MAX
    }
}

/// A session's workspace directory.
#[derive(Debug, Clone)]
pub struct Workspace {
    root: PathBuf,
    limits: Limits,
}

/// What a workspace holds: bytes, files, and entries of every kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Bytes of regular files.
    pub bytes: u64,
    /// Regular files.
    pub files: u64,
    /// Entries of every kind (files, directories, symlinks, …).
    pub entries: u64,
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

/// The folder a session's workspace is made in: `root` for a root session;
/// for a child, `delegated/` inside its parent's workspace, so the parent
/// sees what its children wrote under `delegated/<child id>/`.
pub fn base_for(root: &Path, lineage: &[Uuid]) -> PathBuf {
    let mut base = root.to_path_buf();
    for ancestor in lineage {
        base = dir_of(&base, *ancestor).join(crate::policy::delegation::DELEGATED_DIR);
    }
    base
}

/// Makes the workspace of a new session under `base` when its executor
/// works in one (off the async threads: it touches the disk); says
/// whether it made one.
pub async fn prepare(
    spec: &super::ExecutorSpec,
    base: PathBuf,
    session_id: Uuid,
) -> io::Result<bool> {
    if !spec.uses_workspace() {
        return Ok(false);
    }
    tokio::task::spawn_blocking(move || Workspace::open(&base, session_id))
        .await
        .map_err(io::Error::other)??;
    Ok(true)
}

impl Workspace {
    /// Opens (creating it) the workspace of `session_id` under `base`.
    pub fn open(base: &Path, session_id: Uuid) -> io::Result<Workspace> {
        let dir = dir_of(base, session_id);
        fs::create_dir_all(&dir)?;
        Ok(Workspace {
            root: dir.canonicalize()?,
            limits: Limits::UNLIMITED,
        })
    }

    /// The same workspace held to `limits`.
    pub fn with_limits(mut self, limits: Limits) -> Workspace {
        self.limits = limits;
        self
    }

    /// Bytes, files and entries in the workspace now (symlinks are not followed).
    pub fn usage(&self) -> Result<Usage, ToolError> {
        let mut usage = Usage::default();
        let mut dirs = vec![self.root.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in fs::read_dir(&dir)? {
                let entry = entry?;
                let kind = entry.file_type()?;
                usage.entries += 1;
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

    /// Refuses a write of `size` bytes to `path` (replacing what is there,
    /// creating the `missing` directories) that would take the workspace
    /// over its quotas.
    fn check_quota(&self, path: &Path, missing: usize, size: u64) -> Result<(), ToolError> {
        if self.limits.unlimited_usage() {
            return Ok(());
        }
        let usage = self.usage()?;
        let replaced = fs::symlink_metadata(path)
            .ok()
            .filter(|m| m.is_file())
            .map(|m| m.len());
        let new_entries = missing as u64 + u64::from(replaced.is_none());
        self.limits.check_write(usage, new_entries, replaced, size)
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
        self.limits.check_path(Path::new(relative.trim()))?;
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
        let missing = self.missing_parents(&path);
        // Before anything is created, so a refused write leaves nothing behind.
        self.check_quota(&path, missing.len(), size)?;
        let mut created = Vec::with_capacity(missing.len());
        let result = self
            .create_parents(&path, &missing, &mut created, relative)
            .and_then(|()| {
                // Through a temporary file and a rename: a failed write (a full
                // disk) leaves the old content, never half of the new one.
                // A short name of its own: a name of the longest allowed
                // length must still leave room for it.
                let tmp = path.with_file_name(format!(".warden-{}.tmp", Uuid::new_v4().simple()));
                fs::write(&tmp, content)
                    .and_then(|()| fs::rename(&tmp, &path))
                    .map_err(|err| {
                        let _ = fs::remove_file(&tmp);
                        ToolError::from(err)
                    })
            });
        if let Err(err) = result {
            // Nothing partial stays: the directories this write made go too.
            for dir in created.iter().rev() {
                let _ = fs::remove_dir(dir);
            }
            return Err(err);
        }
        Ok(FileWrite {
            path: relative.trim().trim_start_matches("./").to_string(),
            digest: digest(content.as_bytes()),
        })
    }

    /// The directories above `path` that do not exist yet, outermost first.
    fn missing_parents(&self, path: &Path) -> Vec<PathBuf> {
        let mut missing: Vec<PathBuf> = path
            .ancestors()
            .skip(1)
            .take_while(|dir| *dir != self.root && fs::symlink_metadata(dir).is_err())
            .map(Path::to_path_buf)
            .collect();
        missing.reverse();
        missing
    }

    /// Creates `missing` one by one, recording each in `created`, and checks
    /// that `path`'s parent does not lead out (a racing symlink).
    fn create_parents(
        &self,
        path: &Path,
        missing: &[PathBuf],
        created: &mut Vec<PathBuf>,
        relative: &str,
    ) -> Result<(), ToolError> {
        for dir in missing {
            match fs::create_dir(dir) {
                Ok(()) => created.push(dir.clone()),
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
                Err(err) => return Err(err.into()),
            }
        }
        if let Some(parent) = path.parent() {
            let real = parent.canonicalize()?;
            if !real.starts_with(&self.root) {
                return Err(ToolError::Escape(relative.to_string()));
            }
        }
        Ok(())
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

    #[test]
    fn a_childs_workspace_is_inside_its_parents() {
        let root = Path::new("/ws");
        let (a, b) = (Uuid::from_u128(1), Uuid::from_u128(2));
        assert_eq!(base_for(root, &[]), PathBuf::from("/ws"));
        assert_eq!(
            base_for(root, &[a]),
            root.join(a.to_string()).join("delegated")
        );
        assert_eq!(
            dir_of(&base_for(root, &[a, b]), Uuid::from_u128(3)),
            root.join(a.to_string())
                .join("delegated")
                .join(b.to_string())
                .join("delegated")
                .join(Uuid::from_u128(3).to_string())
        );
    }

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
        let (_dir, ws) = quota_workspace(100, 3);
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
                files: 2,
                entries: 3
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
                files: 3,
                entries: 4
            }
        );
        // No temporary file is left either.
        assert_eq!(ws.list("").unwrap(), vec!["a.txt", "c.txt", "d/"]);
    }

    fn quota_workspace(bytes: u64, files: u64) -> (tempdir::Dir, Workspace) {
        limited_workspace(Limits {
            max_bytes: bytes,
            max_files: files,
            ..Limits::UNLIMITED
        })
    }

    fn limited_workspace(limits: Limits) -> (tempdir::Dir, Workspace) {
        let (dir, ws) = workspace();
        (dir, ws.with_limits(limits))
    }

    /// Every entry under the workspace root, sorted, as relative paths.
    fn tree(ws: &Workspace) -> Vec<String> {
        let mut found = Vec::new();
        let mut dirs = vec![ws.root().to_path_buf()];
        while let Some(dir) = dirs.pop() {
            for entry in fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path.clone());
                }
                let rel = path.strip_prefix(ws.root()).unwrap();
                found.push(rel.to_string_lossy().to_string());
            }
        }
        found.sort();
        found
    }

    fn limits(entries: u64, depth: usize) -> Limits {
        Limits {
            max_entries: entries,
            max_depth: depth,
            ..Limits::UNLIMITED
        }
    }

    #[test]
    fn paths_are_judged_by_depth_length_and_name_length() {
        let l = limits(u64::MAX, 32);
        let deep = |n: usize| vec!["d"; n].join("/");
        assert_eq!(l.check_path(Path::new(&deep(32))), Ok(()));
        assert_eq!(l.check_path(Path::new(&format!("./{}", deep(32)))), Ok(()));
        let err = l.check_path(Path::new(&deep(33))).unwrap_err();
        assert!(
            matches!(&err, ToolError::Quota(m) if m.contains("WARDEN_WORKSPACE_MAX_DEPTH=32")),
            "{err}"
        );
        let name = |n: usize| "n".repeat(n);
        assert_eq!(l.check_path(Path::new(&name(255))), Ok(()));
        let err = l
            .check_path(Path::new(&format!("a/{}", name(256))))
            .unwrap_err();
        assert!(err.to_string().contains("255 bytes per name"), "{err}");
        // 5 names of 204 bytes and 4 separators: 1,024 bytes; one more is 1,025.
        let longest = vec![name(204); 5].join("/");
        assert_eq!(longest.len(), 1_024);
        assert_eq!(l.check_path(Path::new(&longest)), Ok(()));
        let err = l.check_path(Path::new(&format!("{longest}x"))).unwrap_err();
        assert!(err.to_string().contains("1025 bytes long"), "{err}");
        assert!(err.to_string().contains("1024 bytes"), "{err}");
    }

    #[test]
    fn writes_are_judged_by_the_entries_they_add() {
        let l = limits(10, usize::MAX);
        let usage = |entries| Usage {
            bytes: 0,
            files: 0,
            entries,
        };
        assert_eq!(l.check_write(usage(7), 3, None, 1), Ok(()));
        let err = l.check_write(usage(7), 4, None, 1).unwrap_err();
        assert!(
            err.to_string().contains("WARDEN_WORKSPACE_MAX_ENTRIES=10"),
            "{err}"
        );
        // Overwriting a file adds nothing, even at the limit.
        assert_eq!(l.check_write(usage(10), 0, Some(5), 1), Ok(()));
        assert!(l.check_write(usage(10), 1, None, 1).is_err());
        assert_eq!(
            Limits::UNLIMITED.check_write(usage(u64::MAX), 5, None, u64::MAX),
            Ok(())
        );
    }

    #[test]
    fn directories_count_as_entries_and_a_refused_write_leaves_no_directory() {
        let (_dir, ws) = limited_workspace(limits(6, 4));
        ws.write("a/b/c/d.txt", "x", 100).unwrap();
        assert_eq!(ws.usage().unwrap().entries, 4);
        // p/, p/q/ and p/q/r.txt would make 7 entries, over 6.
        let err = ws.write("p/q/r.txt", "x", 100).unwrap_err();
        assert!(
            matches!(&err, ToolError::Quota(m) if m.contains("WARDEN_WORKSPACE_MAX_ENTRIES")),
            "{err}"
        );
        assert_eq!(tree(&ws), ["a", "a/b", "a/b/c", "a/b/c/d.txt"]);
        // Too deep: refused before any directory is made.
        let err = ws.write("k/l/m/n/o.txt", "x", 100).unwrap_err();
        assert!(
            err.to_string().contains("WARDEN_WORKSPACE_MAX_DEPTH"),
            "{err}"
        );
        assert!(!ws.root().join("k").exists());
        // Too long a name, deep in new directories: nothing made either.
        let long = format!("k/{}", "n".repeat(256));
        assert!(matches!(
            ws.write(&long, "x", 100),
            Err(ToolError::Quota(_))
        ));
        assert!(!ws.root().join("k").exists());
        // Reusing existing directories costs only the file.
        ws.write("a/b/c/e.txt", "x", 100).unwrap();
        ws.write("a/f.txt", "x", 100).unwrap();
        assert!(ws.write("a/g.txt", "x", 100).is_err());
        ws.write("a/f.txt", "overwrite", 100).unwrap();
        assert_eq!(ws.usage().unwrap().entries, 6);
        assert_eq!(
            tree(&ws),
            ["a", "a/b", "a/b/c", "a/b/c/d.txt", "a/b/c/e.txt", "a/f.txt"]
        );
    }

    #[test]
    fn a_loop_of_deep_writes_stops_at_the_entry_limit() {
        let (_dir, ws) = limited_workspace(limits(50, 32));
        let mut refused = 0;
        for i in 0..100 {
            let path = format!("{i}/{}/f", vec!["d"; 30].join("/"));
            if ws.write(&path, "", 100).is_err() {
                refused += 1;
            }
        }
        let usage = ws.usage().unwrap();
        assert!(usage.entries <= 50, "{usage:?}");
        // Each write needs 32 entries: one fits, the rest are refused whole.
        assert_eq!(usage.entries, 32);
        assert_eq!(refused, 99);
        assert_eq!(tree(&ws).iter().filter(|p| !p.contains('/')).count(), 1);
    }

    #[test]
    fn a_name_of_the_longest_allowed_length_can_be_written() {
        let (_dir, ws) = limited_workspace(limits(10, 32));
        let name = "n".repeat(MAX_COMPONENT_BYTES);
        ws.write(&format!("dir/{name}"), "x", 100).unwrap();
        assert!(ws.has_file(&format!("dir/{name}")));
        assert_eq!(ws.usage().unwrap().entries, 2);
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
