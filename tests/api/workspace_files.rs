//! The workspace, visible (issue 44, part 0): a model session writes,
//! overwrites and deletes files across 10 checkpoints; every checkpoint's
//! snapshot lists and serves exactly the files of then, two snapshots
//! diff, a tar holds them, storage grows by the changed files only, paths
//! cannot leave the workspace and another tenant sees nothing.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::fake_llm::{FakeLlm, tool_calls};
use common::{TestApp, config_with, eventually};
use reqwest::StatusCode;
use serde_json::json;
use sha2::Digest;

/// The workspace expected at each checkpoint: path -> content.
pub type Files = BTreeMap<String, Vec<u8>>;

/// A session that ran the scripted 10 steps, with what its workspace held
/// at each checkpoint (index 0 is checkpoint 1).
pub struct TenCheckpoints {
    pub app: TestApp,
    /// Kept alive as long as the app (forks call it).
    pub _fake: FakeLlm,
    pub id: String,
    pub workspace_root: PathBuf,
    pub expected: Vec<Files>,
}

enum Op {
    Write(&'static str, &'static str),
    Delete(&'static str),
}

/// The steps: each a list of operations; deletions are done by the test
/// while the step waits for its model (the agent has no delete tool).
fn script() -> Vec<Vec<Op>> {
    use Op::{Delete, Write};
    vec![
        vec![Write("a.txt", "A1\n"), Write("b.txt", "B1\n")],
        vec![Write("c/d.txt", "D1\nline two\n")],
        vec![Write("a.txt", "A2\n")],
        vec![Delete("b.txt"), Write("e.txt", "E1\n")],
        vec![Write("f.txt", "F1\n")],
        vec![Write("c/d.txt", "D2\nline two\n")],
        vec![Delete("e.txt"), Write("a.txt", "A1\n")],
        vec![Write("g/h/i.md", "# G1\n")],
        vec![Write("f.txt", "F2\n")],
        vec![],
    ]
}

/// Runs the scripted session to its end (10 iterations, a checkpoint each).
pub async fn ten_checkpoints() -> TenCheckpoints {
    let fake = FakeLlm::start().await;
    let base = fake.base_url();
    let config = config_with(&[
        ("WARDEN_LLM_BASE_URL", base.as_str()),
        ("WARDEN_LLM_MODEL", "fake-model"),
    ]);
    let workspace_root = config.workspace_root.clone();
    let mut expected = Vec::new();
    let mut now = Files::new();
    let mut holds = Vec::new();
    for (i, ops) in script().into_iter().enumerate() {
        let mut calls = Vec::new();
        let mut deletes = Vec::new();
        for op in ops {
            match op {
                Op::Write(path, content) => {
                    now.insert(path.into(), content.as_bytes().to_vec());
                    calls.push(("write_file", json!({ "path": path, "content": content })));
                }
                Op::Delete(path) => {
                    now.remove(path);
                    deletes.push(path);
                }
            }
        }
        if i == 9 {
            calls.push((
                "task_completion",
                json!({ "result": "done", "deliverables": ["a.txt"] }),
            ));
        }
        let mut answer = tool_calls(&calls, 100);
        if !deletes.is_empty() {
            let gate = Arc::new(tokio::sync::Semaphore::new(0));
            answer = answer.held(gate.clone());
            holds.push((i + 1, deletes, gate));
        }
        fake.agent(answer);
        expected.push(now.clone());
    }
    let app = TestApp::start_with(config).await;
    let doc = app
        .create(json!({
            "goal": "Write the files of the plan",
            "mode": "fixed",
            "limits": { "checkpoint_interval": 1, "reflection_interval": 1000, "max_iterations": 20 },
            "executor": { "kind": "llm" }
        }))
        .await;
    let id = doc["id"].as_str().unwrap().to_string();
    let dir = workspace_root.join(&id);
    for (step, deletes, gate) in holds {
        eventually(
            Duration::from_secs(30),
            "the step waits for its model",
            || {
                let fake = fake.clone();
                async move { fake.agent_requests().len() >= step }
            },
        )
        .await;
        for path in deletes {
            std::fs::remove_file(dir.join(path)).expect("delete");
        }
        gate.add_permits(1);
    }
    let s = app.wait_settled(&id).await;
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(s["iterations"], 10, "{s}");
    TenCheckpoints {
        app,
        _fake: fake,
        id,
        workspace_root,
        expected,
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Every regular file below `dir`, with its content.
pub fn disk_files(dir: &Path) -> Files {
    let mut files = Files::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let rel = path
                    .strip_prefix(dir)
                    .unwrap()
                    .to_string_lossy()
                    .to_string();
                files.insert(rel, std::fs::read(&path).unwrap());
            }
        }
    }
    files
}

async fn content(app: &TestApp, id: &str, path: &str, checkpoint: usize) -> (StatusCode, Vec<u8>) {
    let res = app
        .client
        .get(app.url(&format!(
            "/api/autonomous/{id}/files/{path}?checkpoint={checkpoint}"
        )))
        .send()
        .await
        .unwrap();
    (res.status(), res.bytes().await.unwrap().to_vec())
}

#[tokio::test]
async fn every_checkpoint_lists_and_serves_the_workspace_of_then() {
    let run = ten_checkpoints().await;
    let (app, id) = (&run.app, run.id.as_str());
    // Every checkpoint is forkable: its snapshot is stored.
    let (status, page) = app.get(&format!("/api/autonomous/{id}/checkpoints")).await;
    assert_eq!(status, StatusCode::OK);
    let iterations: Vec<i64> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["forkable"] == true)
        .map(|c| c["iteration"].as_i64().unwrap())
        .collect();
    for n in 1..=10 {
        assert!(iterations.contains(&n), "checkpoint {n} forkable: {page}");
    }
    for (i, files) in run.expected.iter().enumerate() {
        let n = i + 1;
        let (status, list) = app
            .get(&format!("/api/autonomous/{id}/files?checkpoint={n}"))
            .await;
        assert_eq!(status, StatusCode::OK, "{list}");
        assert_eq!(list["checkpoint"], n as i64);
        let listed: Vec<(String, String, u64)> = list["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    f["path"].as_str().unwrap().to_string(),
                    f["sha256"].as_str().unwrap().to_string(),
                    f["size"].as_u64().unwrap(),
                )
            })
            .collect();
        let want: Vec<(String, String, u64)> = files
            .iter()
            .map(|(p, c)| (p.clone(), sha256_hex(c), c.len() as u64))
            .collect();
        assert_eq!(listed, want, "checkpoint {n}");
        for (path, bytes) in files {
            assert_eq!(
                content(app, id, path, n).await,
                (StatusCode::OK, bytes.clone())
            );
        }
    }
    // The latest by default, with the iteration each file last changed at.
    let (_, latest) = app.get(&format!("/api/autonomous/{id}/files")).await;
    assert_eq!(latest["checkpoint"], 10);
    let modified: BTreeMap<String, i64> = latest["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().to_string(),
                f["modified_iteration"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(modified["a.txt"], 7);
    assert_eq!(modified["c/d.txt"], 6);
    assert_eq!(modified["f.txt"], 9);
    assert_eq!(modified["g/h/i.md"], 8);
    assert_eq!(latest["snapshots"], json!((1..=10).collect::<Vec<i64>>()));
    // Content type and ranges.
    let res = app
        .client
        .get(app.url(&format!("/api/autonomous/{id}/files/c/d.txt")))
        .header("Range", "bytes=3-6")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(res.headers()["content-range"], "bytes 3-6/12");
    assert_eq!(res.bytes().await.unwrap().as_ref(), b"line");
    let res = app
        .client
        .get(app.url(&format!("/api/autonomous/{id}/files/g/h/i.md")))
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.headers()["content-type"],
        "text/markdown; charset=utf-8"
    );
    let res = app
        .client
        .get(app.url(&format!("/api/autonomous/{id}/files/a.txt")))
        .header("Range", "bytes=50-")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::RANGE_NOT_SATISFIABLE);
}

#[tokio::test]
async fn snapshots_diff_tar_and_store_each_content_once() {
    let run = ten_checkpoints().await;
    let (app, id) = (&run.app, run.id.as_str());
    let (status, diff) = app
        .get(&format!("/api/autonomous/{id}/files/diff?from=3&to=7"))
        .await;
    assert_eq!(status, StatusCode::OK, "{diff}");
    let changes: Vec<(String, String)> = diff["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["path"].as_str().unwrap().to_string(),
                c["change"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        changes,
        [
            ("a.txt".to_string(), "changed".to_string()),
            ("b.txt".into(), "removed".into()),
            ("c/d.txt".into(), "changed".into()),
            ("f.txt".into(), "added".into()),
        ]
    );
    let d = diff["changes"][2]["diff"].as_str().unwrap();
    assert!(d.contains("-D1") && d.contains("+D2"), "{d}");
    assert_eq!(
        diff["changes"][0]["to_sha256"],
        sha256_hex(b"A1\n").as_str()
    );
    // Unknown snapshots are 404.
    let (status, _) = app
        .get(&format!("/api/autonomous/{id}/files/diff?from=3&to=70"))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // The tar of checkpoint 4 holds exactly its files.
    let res = app
        .client
        .get(app.url(&format!("/api/autonomous/{id}/workspace.tar?checkpoint=4")))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["content-type"], "application/x-tar");
    let bytes = res.bytes().await.unwrap();
    let mut archive = tar::Archive::new(bytes.as_ref());
    let mut in_tar = Files::new();
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry.path().unwrap().to_string_lossy().to_string();
        let mut content = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut content).unwrap();
        in_tar.insert(path, content);
    }
    assert_eq!(in_tar, run.expected[3]);

    // Storage: one blob per distinct content ever held, whatever the
    // number of snapshots that hold it (A1 came back at checkpoint 7 and
    // cost nothing); one snapshot per checkpoint.
    let pool = app.pool();
    let (blobs, bytes): (i64, i64) =
        sqlx::query_as("SELECT count(*), coalesce(sum(size), 0)::bigint FROM workspace_blobs")
            .fetch_one(pool)
            .await
            .unwrap();
    let distinct: std::collections::BTreeSet<&Vec<u8>> =
        run.expected.iter().flat_map(|f| f.values()).collect();
    assert_eq!(blobs, distinct.len() as i64);
    assert_eq!(blobs, 9);
    assert_eq!(bytes, distinct.iter().map(|c| c.len() as i64).sum::<i64>());
    let snapshots: i64 = sqlx::query_scalar("SELECT count(*) FROM workspace_snapshots")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(snapshots, 10);
}

#[tokio::test]
async fn paths_cannot_leave_the_workspace_and_other_tenants_see_nothing() {
    let run = ten_checkpoints().await;
    let (app, id) = (&run.app, run.id.as_str());
    for bad in [
        "..%2F..%2Fetc%2Fpasswd",
        "a%2F..%2F..%2Fx",
        "%2Fetc%2Fpasswd",
        "a.txt%00",
        "..%5C..%5Cx",
    ] {
        let res = app
            .client
            .get(app.url(&format!("/api/autonomous/{id}/files/{bad}")))
            .send()
            .await
            .unwrap();
        let status = res.status();
        let body = res.text().await.unwrap();
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
    }
    // What the URL itself normalizes away never reaches a file outside.
    let res = app
        .client
        .get(app.url(&format!("/api/autonomous/{id}/files/../../../etc/passwd")))
        .send()
        .await
        .unwrap();
    assert!(
        matches!(
            res.status(),
            StatusCode::NOT_FOUND | StatusCode::BAD_REQUEST
        ),
        "{}",
        res.status()
    );
    let (status, _) = content(app, id, "nope.txt", 10).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = content(app, id, "b.txt", 10).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "deleted at checkpoint 4");
    let (status, _) = app
        .get(&format!("/api/autonomous/{id}/files?checkpoint=99"))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let other = common::create_key(&app.base, "other-tenant", "operator").await;
    let other = common::client_with_key(other["secret"].as_str().unwrap());
    for path in [
        format!("/api/autonomous/{id}/files"),
        format!("/api/autonomous/{id}/files/a.txt"),
        format!("/api/autonomous/{id}/files/diff?from=1&to=2"),
        format!("/api/autonomous/{id}/workspace.tar"),
    ] {
        let res = other.get(app.url(&path)).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::NOT_FOUND, "{path}");
    }
    let res = other
        .post(app.url(&format!("/api/autonomous/{id}/fork")))
        .json(&json!({ "checkpoint_iteration": 3 }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
}
