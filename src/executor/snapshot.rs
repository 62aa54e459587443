//! Workspace snapshots on the disk: a walk of a workspace into a manifest
//! ([`crate::policy::snapshot::FileEntry`] per regular file; symlinks and
//! the file tools' temporary files are left out), the content of the files
//! a store lacks, and the restore of a manifest into a new workspace.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::policy::snapshot::{FileEntry, check_path, sha256};

/// Whether a name is a file tool's temporary file (`.warden-<id>.tmp`).
fn is_temporary(name: &str) -> bool {
    name.starts_with(".warden-") && name.ends_with(".tmp")
}

/// The manifest of the workspace at `root`, sorted by path: every regular
/// file below it (symlinks not followed), hashed.
pub fn walk(root: &Path) -> io::Result<Vec<FileEntry>> {
    let mut files = Vec::new();
    let mut dirs = vec![PathBuf::new()];
    while let Some(rel) = dirs.pop() {
        let entries = match fs::read_dir(root.join(&rel)) {
            Ok(entries) => entries,
            Err(err) if err.kind() == io::ErrorKind::NotFound && rel.as_os_str().is_empty() => {
                return Ok(Vec::new());
            }
            Err(err) => return Err(err),
        };
        for entry in entries {
            let entry = entry?;
            let Ok(name) = entry.file_name().into_string() else {
                continue; // not UTF-8: no client could name it
            };
            let kind = entry.file_type()?;
            let path = rel.join(&name);
            if kind.is_dir() {
                dirs.push(path);
            } else if kind.is_file() && !is_temporary(&name) {
                let Some(path) = path.to_str().and_then(|p| check_path(p).ok()) else {
                    continue;
                };
                let content = fs::read(entry.path())?;
                files.push(FileEntry {
                    digest: sha256(&content),
                    size: content.len() as u64,
                    mode: mode_of(&entry.metadata()?),
                    path,
                });
            }
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(files)
}

#[cfg(unix)]
fn mode_of(meta: &fs::Metadata) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    meta.permissions().mode() & 0o777
}

#[cfg(not(unix))]
fn mode_of(_meta: &fs::Metadata) -> u32 {
    0o644
}

/// Reads the content of `entry` under `root` again, for a store that
/// lacks its blob; `None` if it changed since the walk (the snapshot is
/// then retried).
pub fn read_blob(root: &Path, entry: &FileEntry) -> io::Result<Option<Vec<u8>>> {
    let content = fs::read(root.join(&entry.path))?;
    Ok((sha256(&content) == entry.digest).then_some(content))
}

/// Writes `files` (path, mode, content) into the empty workspace at
/// `root`, creating directories; the paths were checked by the manifest.
pub fn restore(root: &Path, files: &[(String, u32, Vec<u8>)]) -> io::Result<()> {
    for (path, mode, content) in files {
        let path = check_path(path).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let target = root.join(&path);
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(&target, content)?;
        set_mode(&target, *mode)?;
    }
    Ok(())
}

#[cfg(unix)]
fn set_mode(path: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    // Never less than the owner's read and write: the agent must keep working on it.
    fs::set_permissions(path, fs::Permissions::from_mode((mode & 0o777) | 0o600))
}

#[cfg(not(unix))]
fn set_mode(_path: &Path, _mode: u32) -> io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp() -> PathBuf {
        let p = std::env::temp_dir().join(format!("warden-snap-{}", uuid::Uuid::new_v4()));
        fs::create_dir_all(&p).unwrap();
        p
    }

    #[test]
    fn a_walk_then_a_restore_gives_the_same_workspace() {
        let src = temp();
        fs::create_dir_all(src.join("d/e")).unwrap();
        fs::write(src.join("a.txt"), "a").unwrap();
        fs::write(src.join("d/e/b.bin"), [0u8, 1, 2]).unwrap();
        fs::write(src.join("d/.warden-1.tmp"), "half").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink("/etc/passwd", src.join("link")).unwrap();
        let manifest = walk(&src).unwrap();
        let paths: Vec<&str> = manifest.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["a.txt", "d/e/b.bin"]);
        assert_eq!(manifest[1].size, 3);
        let files: Vec<(String, u32, Vec<u8>)> = manifest
            .iter()
            .map(|e| {
                let content = read_blob(&src, e).unwrap().unwrap();
                (e.path.clone(), e.mode, content)
            })
            .collect();
        let dst = temp();
        restore(&dst, &files).unwrap();
        assert_eq!(walk(&dst).unwrap(), manifest);
        // A file changed since the walk is not read as the walked one.
        fs::write(src.join("a.txt"), "changed").unwrap();
        assert_eq!(read_blob(&src, &manifest[0]).unwrap(), None);
        assert!(walk(&src.join("missing")).unwrap().is_empty());
        let _ = fs::remove_dir_all(&src);
        let _ = fs::remove_dir_all(&dst);
    }

    #[test]
    fn a_restore_refuses_a_path_outside() {
        let dst = temp();
        let bad = vec![("../x".to_string(), 0o644, b"x".to_vec())];
        assert!(restore(&dst, &bad).is_err());
        assert!(!dst.parent().unwrap().join("x").exists());
        let _ = fs::remove_dir_all(&dst);
    }
}
