//! Fork from any checkpoint (issue 44, part 1): a fork from each of the 10
//! checkpoints of a session that wrote, overwrote and deleted files starts
//! with the workspace of then, byte for byte, records where it came from,
//! restarts its counters, and leaves the original untouched.

use crate::common;
use crate::workspace_files::{disk_files, ten_checkpoints};

use reqwest::StatusCode;
use serde_json::json;

#[tokio::test]
async fn a_fork_from_each_checkpoint_restores_its_workspace_and_leaves_the_original() {
    let run = ten_checkpoints().await;
    let (app, id) = (&run.app, run.id.as_str());
    let original_dir = run.workspace_root.join(id);
    let original_files = disk_files(&original_dir);
    let original = app.session(id).await;
    let (_, original_list) = app.get(&format!("/api/autonomous/{id}/files")).await;
    for (i, files) in run.expected.iter().enumerate() {
        let n = i + 1;
        let (status, fork) = app
            .post(
                &format!("/api/autonomous/{id}/fork"),
                Some(
                    json!({ "checkpoint_iteration": n, "guidance": "try another way",
                             "limits": { "max_iterations": 1 } }),
                ),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{fork}");
        let fork_id = fork["id"].as_str().unwrap();
        assert_ne!(fork_id, id);
        assert_eq!(fork["forked_from"]["session_id"], id);
        assert_eq!(fork["forked_from"]["iteration"], n as i64);
        // Byte for byte, before the fork's first step could write anything
        // (the fake model has nothing left to answer it with).
        assert_eq!(
            &disk_files(&run.workspace_root.join(fork_id)),
            files,
            "fork from checkpoint {n}"
        );
        // Budgets restart from the fork point.
        assert_eq!(fork["iterations"], 0);
        assert_eq!(fork["tokens_used"], 0);
        assert_eq!(fork["limits"]["max_iterations"], 1);
        assert_eq!(fork["goal"], original["goal"]);
    }
    // The original: same files on the disk and in its snapshots, same state.
    assert_eq!(disk_files(&original_dir), original_files);
    let (_, list) = app.get(&format!("/api/autonomous/{id}/files")).await;
    assert_eq!(list, original_list);
    let after = app.session(id).await;
    assert_eq!(after["status"], original["status"]);
    assert_eq!(after["iterations"], original["iterations"]);
    assert_eq!(after["tokens_used"], original["tokens_used"]);
    assert!(after["forked_from"].is_null());
}

#[tokio::test]
async fn a_fork_names_its_checkpoint_by_id_and_refuses_what_it_cannot_start_from() {
    let run = ten_checkpoints().await;
    let (app, id) = (&run.app, run.id.as_str());
    let (_, page) = app.get(&format!("/api/autonomous/{id}/checkpoints")).await;
    let third = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["iteration"] == 3)
        .expect("a checkpoint at 3")
        .clone();
    let (status, fork) = app
        .post(
            &format!("/api/autonomous/{id}/fork"),
            Some(json!({ "checkpoint_id": third["id"], "limits": { "max_iterations": 1 } })),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{fork}");
    assert_eq!(fork["forked_from"]["iteration"], 3);
    let fork_id = fork["id"].as_str().unwrap();
    assert_eq!(
        disk_files(&run.workspace_root.join(fork_id)),
        run.expected[2]
    );
    // The fork shows in the session view as read later.
    let view = app.session(fork_id).await;
    assert_eq!(view["forked_from"]["session_id"], id);

    // Naming no checkpoint forks from the latest.
    let (status, latest) = app
        .post(&format!("/api/autonomous/{id}/fork"), Some(json!({})))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{latest}");
    let newest = app
        .get(&format!("/api/autonomous/{id}/checkpoints"))
        .await
        .1["items"]
        .as_array()
        .and_then(|c| c.iter().filter_map(|c| c["iteration"].as_i64()).max())
        .expect("a checkpoint");
    assert_eq!(latest["forked_from"]["iteration"], newest, "{latest}");
    for (body, want) in [
        (json!({ "checkpoint_iteration": 77 }), StatusCode::CONFLICT),
        (json!({ "checkpoint_id": 999999 }), StatusCode::CONFLICT),
        (
            json!({ "checkpoint_iteration": 1, "bogus": true }),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
    ] {
        let (status, doc) = app
            .post(&format!("/api/autonomous/{id}/fork"), Some(body.clone()))
            .await;
        assert_eq!(status, want, "{body}: {doc}");
    }
    let (status, _) = app
        .post(
            &format!("/api/autonomous/{}/fork", uuid::Uuid::new_v4()),
            Some(json!({ "checkpoint_iteration": 1 })),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let _ = common::TEST_TENANT;
}

// A session that has taken no checkpoint yet exists: a fork of it is
// refused as not possible now (409), whether it names a checkpoint or not,
// never answered as if the session were missing (404).
#[tokio::test]
async fn a_session_without_a_checkpoint_is_not_forkable_yet() {
    let app = common::TestApp::start().await;
    let id = app
        .create_scripted(json!([{ "action": "a", "delay_ms": 60000 }]), json!({}))
        .await;
    let fork = format!("/api/autonomous/{id}/fork");
    let (status, doc) = app.post(&fork, Some(json!({}))).await;
    assert_eq!(status, StatusCode::CONFLICT, "{doc}");
    assert!(
        doc["detail"]
            .as_str()
            .is_some_and(|d| d.contains("no checkpoint yet")),
        "{doc}"
    );
    let (status, doc) = app
        .post(&fork, Some(json!({ "checkpoint_iteration": 1 })))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{doc}");
    assert_eq!(doc["code"], "not_forkable", "{doc}");
}

#[tokio::test]
async fn forks_show_in_the_tree_of_their_origin_and_name_it_in_their_own() {
    let run = ten_checkpoints().await;
    let (app, id) = (&run.app, run.id.as_str());
    let mut forks = Vec::new();
    for n in [2, 5] {
        let (status, fork) = app
            .post(
                &format!("/api/autonomous/{id}/fork"),
                Some(json!({ "checkpoint_iteration": n, "limits": { "max_iterations": 1 } })),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{fork}");
        forks.push(fork["id"].as_str().unwrap().to_string());
    }
    let (status, tree) = app.get(&format!("/api/autonomous/{id}/tree")).await;
    assert_eq!(status, StatusCode::OK, "{tree}");
    assert!(tree["node"]["forked_from"].is_null(), "{tree}");
    let listed: Vec<(String, i64)> = tree["node"]["forks"]
        .as_array()
        .expect("forks")
        .iter()
        .map(|f| {
            (
                f["id"].as_str().unwrap().to_string(),
                f["iteration"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        vec![(forks[0].clone(), 2), (forks[1].clone(), 5)],
        "{tree}"
    );
    // A fork is a tree of its own: not counted in its origin's.
    assert_eq!(tree["totals"]["sessions"], 1);
    let (status, own) = app.get(&format!("/api/autonomous/{}/tree", forks[1])).await;
    assert_eq!(status, StatusCode::OK, "{own}");
    assert_eq!(own["node"]["forked_from"]["session_id"], id);
    assert_eq!(own["node"]["forked_from"]["iteration"], 5);
    assert_eq!(own["node"]["forks"], json!([]));
}
