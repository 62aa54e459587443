//! Archive files: one zstd-compressed JSON Lines file per session, written
//! before the session is deleted and read back by `warden archive import`.
//!
//! Each line is `{"type": …, "row": {…}}`, where `row` is the table's row as
//! Postgres writes it (`row_to_json`), so an import gives back every column
//! as it was. The first line is the session (`"type": "session"`, with the
//! file's `format`), then its iterations, reflections, decisions, the other
//! events and checkpoints; then its tool calls, refinements and task queue.
//! Sealed secrets, idempotency keys and worker tasks are not archived: an
//! imported session is read-only and never runs again.

use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};

use uuid::Uuid;

use super::error::{Result, ServiceError};
use crate::store::archive::{EndedSession, HistoryTable, ImportRows};
use crate::store::{Store, TenantScope};

/// The archive format this version writes and reads.
pub const FORMAT: u32 = 1;
/// The file name's ending.
pub const EXTENSION: &str = "jsonl.zst";
/// Rows read per statement while exporting (short statements).
const PAGE: i64 = 500;
/// Rows inserted per statement while importing.
const IMPORT_CHUNK: usize = 500;
/// zstd's level: its default, fast, and far smaller than the JSON.
const LEVEL: i32 = 3;

/// The `type` of a table's lines.
fn line_type(table: HistoryTable) -> &'static str {
    match table {
        HistoryTable::Iterations => "iteration",
        HistoryTable::Reflections => "reflection",
        HistoryTable::Decisions => "decision",
        HistoryTable::Events => "event",
        HistoryTable::Checkpoints => "checkpoint",
        HistoryTable::ToolCalls => "tool_call",
        HistoryTable::Refinements => "refinement",
        HistoryTable::Tasks => "task",
    }
}

/// The table of a line's `type`.
fn table_of(line_type: &str) -> Option<HistoryTable> {
    HistoryTable::ALL
        .into_iter()
        .find(|t| self::line_type(*t) == line_type)
}

/// A tenant's folder name: tenant names are letters, digits, `-`, `_` and
/// `.`, so only leading dots (`.`, `..`, hidden names) need escaping; any
/// other byte, from rows older than that rule, is percent-encoded.
fn tenant_dir(tenant: &str) -> String {
    let mut out = String::with_capacity(tenant.len());
    let mut leading = true;
    for b in tenant.bytes() {
        let plain =
            b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_') || (b == b'.' && !leading);
        if plain {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
        leading &= b == b'.';
    }
    if out.is_empty() { "%00".into() } else { out }
}

/// Where the archive of `session` goes under `dir`:
/// `<tenant>/<yyyy-mm of its end>/<id>.jsonl.zst`.
pub fn path_of(dir: &Path, session: &EndedSession) -> PathBuf {
    dir.join(tenant_dir(&session.tenant))
        .join(session.ended_at.format("%Y-%m").to_string())
        .join(format!("{}.{EXTENSION}", session.id))
}

fn io_error(path: &Path, err: impl std::fmt::Display) -> ServiceError {
    ServiceError::Archive(format!("{}: {err}", path.display()))
}

/// Writes lines handed over a channel into a compressed temporary file,
/// then, once told the file is whole, flushes it to the disk and renames it
/// to `path`. The rename is durable once its folder is flushed too
/// ([`flush_folders`]), once per batch of files.
fn write_file(path: &Path, lines: std::sync::mpsc::Receiver<Option<Vec<String>>>) -> Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| io_error(path, "no parent folder"))?;
    // Archives hold tenants' data: readable by Warden's user only.
    let mut folders = std::fs::DirBuilder::new();
    folders.recursive(true);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        folders.mode(0o700);
        options.mode(0o600);
    }
    folders.create(dir).map_err(|e| io_error(dir, e))?;
    let temp = dir.join(format!(".{}.tmp", Uuid::new_v4()));
    let written = (|| -> Result<bool> {
        let file = options.open(&temp).map_err(|e| io_error(&temp, e))?;
        let mut encoder = zstd::Encoder::new(std::io::BufWriter::new(file), LEVEL)
            .map_err(|e| io_error(&temp, e))?;
        loop {
            match lines.recv() {
                Ok(Some(batch)) => {
                    for line in batch {
                        encoder
                            .write_all(line.as_bytes())
                            .and_then(|()| encoder.write_all(b"\n"))
                            .map_err(|e| io_error(&temp, e))?;
                    }
                }
                Ok(None) => break,
                // The reader gave up: no file.
                Err(_) => return Ok(false),
            }
        }
        let file = encoder
            .finish()
            .and_then(|w| w.into_inner().map_err(|e| e.into_error()))
            .map_err(|e| io_error(&temp, e))?;
        file.sync_data().map_err(|e| io_error(&temp, e))?;
        Ok(true)
    })();
    match written {
        Ok(true) => std::fs::rename(&temp, path).map_err(|e| io_error(path, e)),
        Ok(false) => {
            let _ = std::fs::remove_file(&temp);
            Err(io_error(
                path,
                "the export stopped before the file was whole",
            ))
        }
        Err(err) => {
            let _ = std::fs::remove_file(&temp);
            Err(err)
        }
    }
}

/// Flushes the folders of `files` to the disk, each once, so that their
/// renames survive a crash: what must hold before the sessions they
/// archive are deleted.
pub async fn flush_folders(files: &[PathBuf]) -> Result<()> {
    let mut folders: Vec<PathBuf> = files
        .iter()
        .filter_map(|f| f.parent().map(Path::to_path_buf))
        .collect();
    folders.sort();
    folders.dedup();
    tokio::task::spawn_blocking(move || {
        for folder in folders {
            std::fs::File::open(&folder)
                .and_then(|d| d.sync_all())
                .map_err(|e| io_error(&folder, e))?;
        }
        Ok(())
    })
    .await
    .map_err(|e| ServiceError::Archive(format!("the folder flush stopped: {e}")))?
}

/// Exports `session` to its archive file under `dir` and returns the
/// file's path; the file appears whole or not at all, and its name is on
/// the disk once [`flush_folders`] returns.
pub async fn export(store: &Store, dir: &Path, session: &EndedSession) -> Result<PathBuf> {
    let path = path_of(dir, session);
    let (send, receive) = std::sync::mpsc::sync_channel::<Option<Vec<String>>>(4);
    let target = path.clone();
    let (done, written) = tokio::sync::oneshot::channel();
    // A thread of its own at the lowest priority: compressing is the
    // pruner's CPU work, and the session loops and the API come first.
    std::thread::Builder::new()
        .name("warden-archive".into())
        .spawn(move || {
            crate::thread_priority::lower_priority(19);
            let _ = done.send(write_file(&target, receive));
        })
        .map_err(|e| io_error(&path, e))?;
    let read = read_into(store, session, &send).await;
    if read.is_ok() {
        // The writer may have failed already; its own error says why.
        let _ = send_batch(&send, None).await;
    }
    drop(send);
    let written = written
        .await
        .map_err(|e| ServiceError::Archive(format!("the archive writer stopped: {e}")))?;
    read?;
    written?;
    Ok(path)
}

/// Hands a batch to the writer thread without blocking this one.
async fn send_batch(
    send: &std::sync::mpsc::SyncSender<Option<Vec<String>>>,
    batch: Option<Vec<String>>,
) -> std::result::Result<(), ()> {
    let mut batch = batch;
    loop {
        match send.try_send(batch) {
            Ok(()) => return Ok(()),
            Err(std::sync::mpsc::TrySendError::Full(back)) => {
                batch = back;
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
            Err(std::sync::mpsc::TrySendError::Disconnected(_)) => return Err(()),
        }
    }
}

/// Reads the session's rows page by page, each page one short statement,
/// and hands them to the writer as lines.
async fn read_into(
    store: &Store,
    session: &EndedSession,
    send: &std::sync::mpsc::SyncSender<Option<Vec<String>>>,
) -> Result<()> {
    let scope = TenantScope::tenant_only(&session.tenant);
    let gone = || ServiceError::NotFound(session.id);
    let row = store
        .session_row_json(session.id, &scope)
        .await?
        .ok_or_else(gone)?;
    let first = format!(r#"{{"type":"session","format":{FORMAT},"row":{row}}}"#);
    send_batch(send, Some(vec![first]))
        .await
        .map_err(|()| ServiceError::Archive("the archive writer stopped".into()))?;
    for table in HistoryTable::ALL {
        let kind = line_type(table);
        let mut after = (0, -1);
        loop {
            let rows = store
                .history_page(table, session.id, after, PAGE, &scope)
                .await?;
            let Some(last) = rows.last() else { break };
            after = last.key;
            let full = rows.len() as i64 == PAGE;
            let lines = rows
                .into_iter()
                .map(|r| format!(r#"{{"type":"{kind}","row":{}}}"#, r.json))
                .collect();
            send_batch(send, Some(lines))
                .await
                .map_err(|()| ServiceError::Archive("the archive writer stopped".into()))?;
            if !full {
                break;
            }
        }
    }
    Ok(())
}

/// One line of an archive file.
#[derive(serde::Deserialize)]
struct Line<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    format: Option<u32>,
    #[serde(borrow)]
    row: &'a serde_json::value::RawValue,
}

/// What an import reads of the session's row.
#[derive(serde::Deserialize)]
struct SessionKeys {
    id: Option<Uuid>,
    tenant: Option<String>,
}

/// What an import reads of a history row: whose it is.
#[derive(serde::Deserialize)]
struct HistoryKeys {
    session_id: Option<Uuid>,
}

/// A session read from an archive file, ready to import.
#[derive(Debug, Clone)]
pub struct ArchivedSession {
    /// Its id.
    pub id: Uuid,
    /// Its tenant.
    pub tenant: String,
    /// Its rows.
    pub rows: ImportRows,
    /// Rows of each table (after the session's), in the archive's order.
    pub counts: Vec<(&'static str, usize)>,
}

/// Parses an archive's text (decompressed): checks that it is one
/// session's archive of a format this version reads, and that every row
/// belongs to that session.
pub fn parse(text: impl BufRead) -> Result<ArchivedSession> {
    let invalid = |n: usize, why: &str| ServiceError::Invalid(format!("archive line {n}: {why}"));
    let mut lines = text.lines();
    let first = lines
        .next()
        .ok_or_else(|| invalid(1, "the file is empty"))?
        .map_err(|e| invalid(1, &e.to_string()))?;
    let head: Line = serde_json::from_str(&first).map_err(|e| invalid(1, &e.to_string()))?;
    if head.kind != "session" {
        return Err(invalid(
            1,
            "the first line must be the session (\"type\": \"session\")",
        ));
    }
    match head.format {
        Some(FORMAT) => {}
        other => {
            return Err(invalid(
                1,
                &format!("archive format {other:?}; this version reads format {FORMAT}"),
            ));
        }
    }
    let keys: SessionKeys =
        serde_json::from_str(head.row.get()).map_err(|e| invalid(1, &e.to_string()))?;
    let (Some(id), Some(tenant)) = (keys.id, keys.tenant) else {
        return Err(invalid(1, "the session row has no id or tenant"));
    };
    let mut grouped: Vec<(HistoryTable, Vec<String>)> = Vec::new();
    for (n, line) in lines.enumerate() {
        let n = n + 2;
        let line = line.map_err(|e| invalid(n, &e.to_string()))?;
        if line.trim().is_empty() {
            continue;
        }
        let parsed: Line = serde_json::from_str(&line).map_err(|e| invalid(n, &e.to_string()))?;
        let table = table_of(parsed.kind)
            .ok_or_else(|| invalid(n, &format!("unknown line type {:?}", parsed.kind)))?;
        let keys: HistoryKeys =
            serde_json::from_str(parsed.row.get()).map_err(|e| invalid(n, &e.to_string()))?;
        if keys.session_id != Some(id) {
            return Err(invalid(n, "the row belongs to another session"));
        }
        match grouped.last_mut() {
            Some((last, rows)) if *last == table => rows.push(parsed.row.get().to_string()),
            _ => grouped.push((table, vec![parsed.row.get().to_string()])),
        }
    }
    let counts = grouped
        .iter()
        .map(|(table, rows)| (line_type(*table), rows.len()))
        .collect();
    let tables = grouped
        .into_iter()
        .flat_map(|(table, rows)| {
            rows.chunks(IMPORT_CHUNK)
                .map(|chunk| (table, format!("[{}]", chunk.join(","))))
                .collect::<Vec<_>>()
        })
        .collect();
    Ok(ArchivedSession {
        id,
        tenant,
        rows: ImportRows {
            session: head.row.get().to_string(),
            tables,
        },
        counts,
    })
}

/// Opens `path` for reading when it is a regular file: a FIFO, a device or
/// a folder is refused at once, never waited on or read without end.
fn open_regular(path: &Path) -> Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // A FIFO opened for reading waits for a writer; non-blocking it
        // opens at once, and is refused below. (No effect on a regular file.)
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path).map_err(|e| io_error(path, e))?;
    let meta = file.metadata().map_err(|e| io_error(path, e))?;
    if !meta.is_file() {
        return Err(io_error(path, "not a regular file"));
    }
    Ok(file)
}

/// Reads an archive file (zstd-compressed, or plain JSON Lines); regular
/// files only.
pub fn read_file(path: &Path) -> Result<ArchivedSession> {
    use std::io::{Seek, SeekFrom};
    let mut file = open_regular(path)?;
    let mut magic = [0u8; 4];
    let n = file.read(&mut magic).map_err(|e| io_error(path, e))?;
    file.seek(SeekFrom::Start(0))
        .map_err(|e| io_error(path, e))?;
    if n == 4 && magic == [0x28, 0xB5, 0x2F, 0xFD] {
        let decoder = zstd::Decoder::new(file).map_err(|e| io_error(path, e))?;
        parse(std::io::BufReader::new(decoder))
    } else {
        parse(std::io::BufReader::new(file))
    }
}

/// Imports the session archived in `path`, read-only, under the tenant it
/// had; refuses a file that is no archive (or no regular file), a tenant
/// name that is not one, a session whose id exists, and a child whose
/// parent, lineage or secrets do not match this database.
pub async fn import(store: &Store, path: &Path) -> Result<ArchivedSession> {
    let owned = path.to_path_buf();
    let archived = tokio::task::spawn_blocking(move || read_file(&owned))
        .await
        .map_err(|e| ServiceError::Archive(format!("the archive reader stopped: {e}")))??;
    if !crate::auth::valid_tenant(&archived.tenant) {
        return Err(ServiceError::Invalid(format!(
            "archive line 1: the tenant {:?} is no valid tenant name",
            archived.tenant
        )));
    }
    store.import_session(archived.id, &archived.rows).await?;
    Ok(archived)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_folders_cannot_climb_or_hide() {
        assert_eq!(tenant_dir("acme-1.prod_eu"), "acme-1.prod_eu");
        assert_eq!(tenant_dir(".."), "%2E%2E");
        assert_eq!(tenant_dir("."), "%2E");
        assert_eq!(tenant_dir(".hidden.x"), "%2Ehidden.x");
        assert_eq!(tenant_dir("a/b"), "a%2Fb");
        assert_eq!(tenant_dir(""), "%00");
    }

    fn archive(lines: &[&str]) -> String {
        lines.join("\n")
    }

    #[test]
    fn a_well_formed_archive_is_grouped_by_table_in_order() {
        let id = Uuid::new_v4();
        let text = archive(&[
            &format!(r#"{{"type":"session","format":1,"row":{{"id":"{id}","tenant":"acme"}}}}"#),
            &format!(r#"{{"type":"iteration","row":{{"session_id":"{id}","number":1}}}}"#),
            &format!(r#"{{"type":"iteration","row":{{"session_id":"{id}","number":2}}}}"#),
            &format!(r#"{{"type":"decision","row":{{"session_id":"{id}","seq":3}}}}"#),
            &format!(r#"{{"type":"event","row":{{"session_id":"{id}","seq":1}}}}"#),
            "",
        ]);
        let parsed = parse(text.as_bytes()).unwrap();
        assert_eq!(parsed.id, id);
        assert_eq!(parsed.tenant, "acme");
        assert_eq!(
            parsed.counts,
            vec![("iteration", 2), ("decision", 1), ("event", 1)]
        );
        assert_eq!(parsed.rows.tables.len(), 3);
        assert_eq!(parsed.rows.tables[0].0, HistoryTable::Iterations);
        assert!(parsed.rows.tables[0].1.starts_with("[{"));
    }

    #[test]
    fn archives_that_are_not_one_sessions_are_refused() {
        let id = Uuid::new_v4();
        let other = Uuid::new_v4();
        let head =
            format!(r#"{{"type":"session","format":1,"row":{{"id":"{id}","tenant":"acme"}}}}"#);
        for (text, why) in [
            (String::new(), "empty"),
            (
                format!(r#"{{"type":"event","row":{{"session_id":"{id}"}}}}"#),
                "session",
            ),
            (head.replace("\"format\":1", "\"format\":9"), "format"),
            (
                r#"{"type":"session","format":1,"row":{"tenant":"a"}}"#.to_string(),
                "no id",
            ),
            (
                archive(&[
                    &head,
                    &format!(r#"{{"type":"event","row":{{"session_id":"{other}"}}}}"#),
                ]),
                "another session",
            ),
            (
                archive(&[&head, r#"{"type":"secret","row":{}}"#]),
                "unknown line type",
            ),
            (archive(&[&head, "not json"]), "line 2"),
        ] {
            let err = parse(text.as_bytes()).unwrap_err().to_string();
            assert!(err.contains(why), "{why}: {err}");
        }
    }
}
