//! The termination corpus: sessions whose right ending is known, run
//! together against one real server and one fake model, scored as correct,
//! premature, runaway or wrong reason. It proves the stopping policy, not
//! the counters: every case must end exactly as labelled.

use crate::common;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode as AxumStatus;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use common::fake_llm::{Answer, assessment, text, tool_calls};
use common::{TestApp, config_with};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// Answers for one case, found by a key its goal carries into every prompt.
#[derive(Default)]
struct Route {
    agent: VecDeque<Answer>,
    reflection: VecDeque<Answer>,
    /// The last reflection answer repeats forever.
    sticky_reflection: bool,
}

type Routes = Arc<Mutex<HashMap<String, Route>>>;

/// A fake OpenAI-compatible model serving many sessions at once: each
/// request goes to the route whose key appears in it.
async fn chat(State(routes): State<Routes>, Json(body): Json<Value>) -> Response {
    let is_agent = body
        .get("tools")
        .and_then(Value::as_array)
        .is_some_and(|t| !t.is_empty());
    let haystack = body.to_string();
    let answer = {
        let mut routes = routes.lock().unwrap();
        routes
            .iter_mut()
            .find(|(key, _)| haystack.contains(key.as_str()))
            .and_then(|(_, route)| {
                if is_agent {
                    route.agent.pop_front()
                } else if route.sticky_reflection && route.reflection.len() == 1 {
                    route.reflection.front().cloned()
                } else {
                    route.reflection.pop_front()
                }
            })
    };
    let Some(answer) = answer else {
        return (AxumStatus::INTERNAL_SERVER_ERROR, "nothing scripted").into_response();
    };
    if !answer.delay.is_zero() {
        tokio::time::sleep(answer.delay).await;
    }
    (
        AxumStatus::from_u16(answer.status).unwrap(),
        Json(answer.body),
    )
        .into_response()
}

async fn start_model(routes: Routes) -> String {
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .with_state(routes);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    format!("http://{addr}/v1")
}

/// The labelled right ending.
#[derive(Clone, Copy)]
struct Expect {
    /// Status, or `rejected` for a 422 at create.
    status: &'static str,
    reason: Option<&'static str>,
    /// The earliest iteration the right ending can come at.
    min: i64,
    /// The largest acceptable iteration count.
    max: i64,
}

struct Case {
    name: String,
    category: &'static str,
    body: Value,
    route: Option<Route>,
    expect: Expect,
}

fn ends(status: &'static str, reason: &'static str, min: i64, max: i64) -> Expect {
    Expect {
        status,
        reason: Some(reason),
        min,
        max,
    }
}

fn held() -> Expect {
    Expect {
        status: "awaiting_refinement",
        reason: None,
        min: 0,
        max: 0,
    }
}

fn rejected() -> Expect {
    Expect {
        status: "rejected",
        reason: None,
        min: 0,
        max: 0,
    }
}

fn step(action: &str, args: Value, output: &str) -> Value {
    json!({ "action": action, "arguments": args, "output": output, "tokens": 10 })
}

/// `n` distinct productive steps printing `output` (or their own text).
fn distinct(n: usize, output: Option<&str>) -> Vec<Value> {
    (1..=n)
        .map(|i| {
            let own = format!("wrote part {i}");
            step(
                &format!("write_part_{i}"),
                json!({ "i": i }),
                output.unwrap_or(&own),
            )
        })
        .collect()
}

fn done() -> Value {
    step(
        "finish",
        json!({}),
        "all parts written\n<<WARDEN_GOAL_DONE: done>>",
    )
}

fn scripted(goal: &str, steps: Vec<Value>, repeat: bool, limits: Value) -> Value {
    json!({
        "goal": goal, "limits": limits,
        "executor": { "kind": "scripted", "steps": steps, "repeat": repeat }
    })
}

/// Builds the corpus; `key(n)` names the file an LLM case's goal asks for,
/// which routes its model requests.
fn corpus() -> Vec<Case> {
    let goal = "Create README.md with a project description";
    let mut cases: Vec<Case> = Vec::new();
    let mut add = |name: &str, category: &'static str, body: Value, expect: Expect| {
        cases.push(Case {
            name: name.into(),
            category,
            body,
            route: None,
            expect,
        });
    };

    // ---- sentinels ----
    let mut s = distinct(2, None);
    s.push(done());
    add(
        "done sentinel",
        "sentinels",
        scripted(goal, s, false, json!({})),
        ends("completed", "goal_achieved", 3, 3),
    );
    let mut s = distinct(3, None);
    s[0]["output"] = json!("I will print <<WARDEN_GOAL_DONE: x>> when finished");
    s.push(done());
    add(
        "done sentinel echoed in a line",
        "sentinels",
        scripted(goal, s, false, json!({})),
        ends("completed", "goal_achieved", 4, 4),
    );
    let mut s = distinct(1, None);
    s.push(step(
        "deploy",
        json!({}),
        "no credentials\n<<WARDEN_GOAL_BLOCKED: need the deploy key>>",
    ));
    s.extend(distinct(3, None));
    add(
        "blocked sentinel",
        "sentinels",
        scripted(goal, s, false, json!({})),
        ends("paused", "agent_blocked", 2, 2),
    );
    let mut s = distinct(2, None);
    s[1]["output"] = json!("say `<<WARDEN_GOAL_BLOCKED>>` if stuck, I am not");
    s.push(done());
    add(
        "blocked sentinel echoed in a line",
        "sentinels",
        scripted(goal, s, false, json!({})),
        ends("completed", "goal_achieved", 3, 3),
    );
    let mut s = distinct(2, None);
    s[1]["output"] = json!("<<WARDEN_GOAL_DONE: early>>\nmore work to do");
    s.push(done());
    add(
        "done sentinel not on the last line",
        "sentinels",
        scripted(goal, s, false, json!({})),
        ends("completed", "goal_achieved", 3, 3),
    );

    // ---- progress that must not be mistaken for a loop ----
    let mut s = distinct(8, Some("ok"));
    s.push(done());
    add(
        "distinct actions all printing ok",
        "identical outputs",
        scripted(goal, s, false, json!({})),
        ends("completed", "goal_achieved", 9, 9),
    );
    let mut s: Vec<Value> = (1..=6)
        .map(|_| json!({ "action": "poll_job", "arguments": { "job": 7 }, "output": "still running", "waiting": true, "tokens": 5 }))
        .collect();
    s.push(done());
    add(
        "polling a long job",
        "waiting",
        scripted(goal, s, false, json!({})),
        ends("completed", "goal_achieved", 7, 7),
    );
    let mut s: Vec<Value> = (1..=10)
        .map(|i| {
            if i % 2 == 1 {
                step("edit", json!({ "path": "lib.rs", "patch": i }), "ok")
            } else {
                step(
                    "run_tests",
                    json!({ "after_patch": i - 1 }),
                    &format!("{} failing", 10 - i),
                )
            }
        })
        .collect();
    s.push(done());
    add(
        "edit and test in turn",
        "A-B-A-B",
        scripted(goal, s, false, json!({})),
        ends("completed", "goal_achieved", 11, 11),
    );
    let mut s = distinct(60, None);
    s.push(done());
    add(
        "slow but steady, 61 steps",
        "long sessions",
        scripted(goal, s, false, json!({ "max_iterations": 100 })),
        ends("completed", "goal_achieved", 61, 61),
    );
    let mut s = distinct(29, None);
    s.push(done());
    add(
        "affordable at its rate",
        "projection",
        scripted(goal, s, false, json!({ "max_tokens": 600 })),
        ends("completed", "goal_achieved", 30, 30),
    );

    // ---- loops ----
    let fail = json!([{ "action": "run_tests", "outcome": "failure", "output": "1 failed", "tokens": 10 }]);
    add(
        "identical failing calls",
        "identical failing calls",
        json!({ "goal": goal, "executor": { "kind": "scripted", "steps": fail, "repeat": true } }),
        ends("paused", "stuck", 4, 4),
    );
    let same = json!([{ "action": "list_files", "arguments": { "path": "." }, "output": "a.txt", "tokens": 10 }]);
    add(
        "same call, same answer",
        "identical outputs",
        json!({ "goal": goal, "executor": { "kind": "scripted", "steps": same, "repeat": true } }),
        ends("paused", "stuck", 5, 5),
    );
    let abab = json!([
        { "action": "open", "arguments": { "f": "a" }, "output": "opened", "tokens": 10 },
        { "action": "close", "arguments": { "f": "a" }, "output": "closed", "tokens": 10 }
    ]);
    add(
        "A-B-A-B with the same results",
        "A-B-A-B",
        json!({ "goal": goal, "executor": { "kind": "scripted", "steps": abab, "repeat": true } }),
        ends("paused", "rework_loop", 6, 6),
    );
    let errors: Vec<Value> = (1..=8)
        .map(|i| json!({ "action": format!("call_{i}"), "outcome": "error", "output": format!("error {i}"), "tokens": 10 }))
        .collect();
    add(
        "error streak",
        "error streaks",
        scripted(goal, errors, false, json!({})),
        ends("stopped", "error_threshold", 5, 5),
    );

    // ---- limits ----
    add(
        "token budget",
        "limits",
        scripted(
            goal,
            distinct(10, None)
                .into_iter()
                .map(|mut s| {
                    s["tokens"] = json!(100);
                    s
                })
                .collect(),
            false,
            json!({ "max_tokens": 250 }),
        ),
        ends("stopped", "cost_limit", 3, 3),
    );
    add(
        "iteration limit",
        "limits",
        scripted(
            goal,
            distinct(20, None),
            false,
            json!({ "max_iterations": 5 }),
        ),
        ends("stopped", "max_iterations", 5, 5),
    );
    let slow: Vec<Value> = distinct(40, None)
        .into_iter()
        .map(|mut s| {
            s["delay_ms"] = json!(100);
            s
        })
        .collect();
    add(
        "wall clock",
        "limits",
        scripted(goal, slow, false, json!({ "max_wall_time_ms": 500 })),
        ends("stopped", "timeout", 1, 6),
    );
    add(
        "steps without a person",
        "limits",
        scripted(
            goal,
            distinct(150, None),
            false,
            json!({ "max_iterations": 200 }),
        ),
        ends("stopped", "step_limit", 100, 100),
    );
    add(
        "tool-call budget",
        "limits",
        scripted(
            goal,
            distinct(10, None)
                .into_iter()
                .map(|mut s| {
                    s["tool_calls"] = json!(1);
                    s
                })
                .collect(),
            false,
            json!({ "max_tool_calls": 3 }),
        ),
        ends("stopped", "budget_exhausted", 3, 3),
    );
    add(
        "script ran out",
        "limits",
        scripted(goal, distinct(4, None), false, json!({})),
        ends("stopped", "executor_exhausted", 4, 4),
    );
    let costly: Vec<Value> = distinct(200, None)
        .into_iter()
        .map(|mut s| {
            s["tokens"] = json!(1000);
            s
        })
        .collect();
    add(
        "cannot finish within budget",
        "projection",
        scripted(goal, costly, false, json!({ "max_tokens": 20_000 })),
        ends("paused", "budget_projected_overrun", 3, 3),
    );
    let tight: Vec<Value> = distinct(20, None)
        .into_iter()
        .map(|mut s| {
            s["tokens"] = json!(100);
            s
        })
        .collect();
    // Needs 2000 of 1900 tokens: over, but never by the margin, so it runs to the limit.
    add(
        "over budget within the margin",
        "projection",
        scripted(goal, tight, false, json!({ "max_tokens": 1900 })),
        ends("stopped", "cost_limit", 19, 19),
    );

    // ---- goals ----
    let one_done = vec![done()];
    for (name, g) in [
        ("vague goal", "Learn how to run a business"),
        ("vague goal, research", "Research competitors"),
    ] {
        add(
            name,
            "vague goals",
            scripted(g, one_done.clone(), false, json!({})),
            held(),
        );
    }
    for (name, g) in [
        ("keyboard mash", "lsdjflasjdf;ljasdlfja;sldjfalsdjf"),
        ("mash with spaces", "asdf asdf asdf"),
        ("one bare word", "hello"),
    ] {
        add(
            name,
            "gibberish goals",
            scripted(g, one_done.clone(), false, json!({})),
            held(),
        );
    }
    for (name, g) in [("punctuation only", "???!!!..."), ("numbers only", "12345")] {
        add(
            name,
            "gibberish goals",
            scripted(g, one_done.clone(), false, json!({})),
            rejected(),
        );
    }
    for (name, g) in [
        ("terse French goal", "Écris README.md"),
        ("Japanese goal", "README.md を作成して"),
        ("terse concrete goal", "fix flaky test in ci.yml"),
    ] {
        add(
            name,
            "concrete goals",
            scripted(g, one_done.clone(), false, json!({})),
            ends("completed", "goal_achieved", 1, 1),
        );
    }

    // ---- model-backed ----
    let mut llm = |n: usize,
                   name: &str,
                   category: &'static str,
                   mode: &str,
                   limits: Value,
                   route: Route,
                   expect: Expect| {
        let key = format!("case{n:02}.md");
        cases.push(Case {
            name: name.into(),
            category,
            body: json!({
                "goal": format!("Write {key} with the project notes"),
                "mode": mode, "limits": limits, "executor": { "kind": "llm" }
            }),
            route: Some(route),
            expect,
        });
    };
    let write = |n: usize, part: usize| {
        tool_calls(
            &[(
                "write_file",
                json!({ "path": format!("case{n:02}.md"), "content": format!("part {part}") }),
            )],
            100,
        )
    };
    let claim = |n: usize| {
        tool_calls(
            &[(
                "task_completion",
                json!({ "result": "notes written", "deliverables": [format!("case{n:02}.md")] }),
            )],
            50,
        )
    };
    let route = |agent: Vec<Answer>, reflection: Vec<Answer>, sticky: bool| Route {
        agent: agent.into(),
        reflection: reflection.into(),
        sticky_reflection: sticky,
    };

    llm(
        1,
        "completion tool with its deliverable",
        "loop-breaking tools",
        "fixed",
        json!({}),
        route(vec![write(1, 1), claim(1)], vec![], false),
        ends("completed", "goal_achieved", 2, 2),
    );
    llm(
        2,
        "completion claim without the deliverable",
        "completion claims",
        "fixed",
        json!({}),
        route(vec![claim(2), write(2, 1), claim(2)], vec![], false),
        ends("completed", "goal_achieved", 3, 3),
    );
    llm(
        3,
        "ask_question tool",
        "ask the user",
        "fixed",
        json!({}),
        route(
            vec![
                write(3, 1),
                tool_calls(
                    &[("ask_question", json!({ "question": "Which license?" }))],
                    30,
                ),
            ],
            vec![],
            false,
        ),
        ends("paused", "ask_user", 2, 2),
    );
    llm(
        4,
        "converse tool",
        "ask the user",
        "fixed",
        json!({}),
        route(
            vec![tool_calls(
                &[("converse", json!({ "message": "I need the API key" }))],
                30,
            )],
            vec![],
            false,
        ),
        ends("paused", "ask_user", 1, 1),
    );
    llm(
        5,
        "done sentinel in plain text",
        "sentinels",
        "fixed",
        json!({}),
        route(
            vec![
                write(5, 1),
                text("Notes written.\n<<WARDEN_GOAL_DONE: notes written>>", 40),
            ],
            vec![],
            false,
        ),
        ends("completed", "goal_achieved", 2, 2),
    );
    llm(
        6,
        "Continuing. beside a new tool call each turn",
        "identical outputs",
        "fixed",
        json!({}),
        route(
            (1..=6)
                .map(|i| {
                    let mut a = write(6, i);
                    a.body["choices"][0]["message"]["content"] = json!("Continuing.");
                    a
                })
                .chain([claim(6)])
                .collect(),
            vec![],
            false,
        ),
        ends("completed", "goal_achieved", 7, 7),
    );
    llm(
        7,
        "talking without acting",
        "identical outputs",
        "fixed",
        json!({}),
        route(
            (0..8)
                .map(|_| text("Let me think about this.", 20))
                .collect(),
            vec![],
            false,
        ),
        ends("paused", "stuck", 4, 4),
    );
    llm(
        8,
        "model server errors",
        "error streaks",
        "fixed",
        json!({}),
        route(
            (0..20).map(|_| Answer::status(500)).collect(),
            vec![],
            false,
        ),
        ends("stopped", "error_threshold", 5, 5),
    );
    llm(
        9,
        "reflector agrees",
        "reflectors",
        "continuous",
        json!({ "reflection_interval": 2 }),
        route(
            (1..=6).map(|i| write(9, i)).collect(),
            vec![
                assessment("NO", "SLOW", 40.0, false, "CONTINUE"),
                assessment("YES", "GOOD", 100.0, false, "STOP"),
            ],
            false,
        ),
        ends("completed", "goal_achieved", 4, 4),
    );
    llm(
        10,
        "reflector always says CONTINUE",
        "reflectors",
        "continuous",
        json!({ "reflection_interval": 2, "max_iterations": 12 }),
        route(
            (1..=20).map(|i| write(10, i)).collect(),
            vec![assessment("NO", "GOOD", 50.0, false, "CONTINUE")],
            true,
        ),
        ends("stopped", "max_iterations", 12, 12),
    );
    llm(
        11,
        "reflector returns garbage",
        "reflectors",
        "continuous",
        json!({ "reflection_interval": 1 }),
        route(
            (1..=20).map(|i| write(11, i)).collect(),
            vec![text("I think it is fine?", 20)],
            true,
        ),
        ends("paused", "reflection_failed", 3, 3),
    );
    llm(
        12,
        "completion agreed by the reflector",
        "completion claims",
        "continuous",
        json!({ "reflection_interval": 10 }),
        route(
            vec![write(12, 1), claim(12)],
            vec![assessment("YES", "GOOD", 100.0, false, "STOP")],
            false,
        ),
        ends("completed", "goal_achieved", 2, 2),
    );
    llm(
        13,
        "context cycle, then done",
        "context cycles",
        "fixed",
        json!({ "context_budget_tokens": 1000, "max_cycles": 3 }),
        route(
            vec![
                tool_calls(
                    &[(
                        "write_file",
                        json!({ "path": "case13.md", "content": "part 1" }),
                    )],
                    1_800,
                ),
                text("Saving what I know.", 10),
                write(13, 2),
                claim(13),
            ],
            vec![text("Cycle one: part 1 is in case13.md.", 50)],
            false,
        ),
        ends("completed", "goal_achieved", 4, 4),
    );
    llm(
        14,
        "context cycle limit",
        "context cycles",
        "fixed",
        json!({ "context_budget_tokens": 1000, "max_cycles": 1 }),
        route(
            vec![
                tool_calls(
                    &[(
                        "write_file",
                        json!({ "path": "case14.md", "content": "part 1" }),
                    )],
                    1_800,
                ),
                text("Saving what I know.", 10),
                write(14, 2),
                write(14, 3),
            ],
            vec![text("Cycle one: part 1 is in case14.md.", 50)],
            false,
        ),
        ends("stopped", "cycle_limit", 2, 2),
    );
    llm(
        15,
        "reflector sees no end in the budget",
        "projection",
        "continuous",
        json!({ "reflection_interval": 2, "max_tokens": 3000 }),
        route(
            (1..=30).map(|i| write(15, i)).collect(),
            vec![
                assessment("NO", "SLOW", 2.0, false, "CONTINUE"),
                assessment("NO", "SLOW", 3.0, false, "CONTINUE"),
            ],
            true,
        ),
        ends("paused", "budget_projected_overrun", 4, 6),
    );
    cases
}

/// How one case ended.
struct Outcome {
    status: String,
    reason: Option<String>,
    iterations: i64,
    doc: Value,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Correct,
    Premature,
    Runaway,
    WrongReason,
}

fn judge(expect: &Expect, got: &Outcome) -> Verdict {
    let right = got.status == expect.status && got.reason.as_deref() == expect.reason;
    if right && (expect.min..=expect.max).contains(&got.iterations) {
        Verdict::Correct
    } else if got.iterations > expect.max {
        Verdict::Runaway
    } else if got.iterations < expect.min
        || (expect.status == "completed" && got.status != "completed")
    {
        Verdict::Premature
    } else {
        Verdict::WrongReason
    }
}

async fn run(app: &TestApp, case: &Case) -> Outcome {
    let res = app
        .client
        .post(app.url("/api/autonomous"))
        .json(&case.body)
        .send()
        .await
        .expect("sent");
    let code = res.status();
    let doc: Value = res.json().await.unwrap_or(Value::Null);
    if code == StatusCode::UNPROCESSABLE_ENTITY {
        return Outcome {
            status: "rejected".into(),
            reason: None,
            iterations: 0,
            doc,
        };
    }
    assert_eq!(code, StatusCode::CREATED, "{}: {doc}", case.name);
    let id = doc["id"].as_str().expect("id").to_string();
    let s = app
        .wait_until(&id, Duration::from_secs(40), |s| s["status"] != "running")
        .await;
    Outcome {
        status: s["status"].as_str().unwrap_or("").to_string(),
        reason: s["reason"].as_str().map(str::to_string),
        iterations: s["iterations"].as_i64().unwrap_or(-1),
        doc: s,
    }
}

#[tokio::test]
async fn the_labelled_corpus_ends_every_session_right() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    let routes: Routes = Arc::default();
    let base = start_model(routes.clone()).await;
    let ws = std::env::temp_dir()
        .join(format!("warden-corpus-{}", uuid::Uuid::new_v4()))
        .to_string_lossy()
        .to_string();
    let app = TestApp::spawn_with(
        pool,
        config_with(&[
            ("WARDEN_LLM_BASE_URL", base.as_str()),
            ("WARDEN_LLM_MODEL", "fake-model"),
            ("WARDEN_WORKSPACE_ROOT", ws.as_str()),
            ("WARDEN_TOKEN_PRICE_PER_MILLION", "2.0"),
            // The corpus judges the policy, not crash recovery: a lease long
            // enough that a loaded CI machine never hands a session over
            // mid-case (the model's scripted answers are consumed once).
            ("WARDEN_LEASE_TTL_MS", "30000"),
            ("WARDEN_HEARTBEAT_INTERVAL_MS", "1000"),
        ]),
    )
    .await;
    let mut cases = corpus();
    assert!(cases.len() >= 40, "the corpus has {} cases", cases.len());
    for (n, case) in cases.iter_mut().enumerate() {
        if let Some(route) = case.route.take() {
            let key = case.body["goal"]
                .as_str()
                .and_then(|g| g.split_whitespace().nth(1))
                .unwrap_or_else(|| panic!("case {n} has a keyed goal"))
                .to_string();
            routes.lock().unwrap().insert(key, route);
        }
    }
    let started = std::time::Instant::now();
    let outcomes = futures::future::join_all(cases.iter().map(|c| run(&app, c))).await;
    let took = started.elapsed();

    let mut tally: HashMap<&str, usize> = HashMap::new();
    println!(
        "\n{:<46} {:<24} {:<44} {:<44} verdict",
        "case", "category", "expected (≤ iterations)", "got (iterations)"
    );
    let mut failed = Vec::new();
    for (case, got) in cases.iter().zip(&outcomes) {
        let verdict = judge(&case.expect, got);
        let label = match verdict {
            Verdict::Correct => "correct",
            Verdict::Premature => "premature",
            Verdict::Runaway => "runaway",
            Verdict::WrongReason => "wrong reason",
        };
        *tally.entry(label).or_default() += 1;
        println!(
            "{:<46} {:<24} {:<44} {:<44} {label}",
            case.name,
            case.category,
            format!(
                "{} {} (≤ {})",
                case.expect.status,
                case.expect.reason.unwrap_or("-"),
                case.expect.max
            ),
            format!(
                "{} {} ({})",
                got.status,
                got.reason.as_deref().unwrap_or("-"),
                got.iterations
            ),
        );
        if verdict != Verdict::Correct {
            failed.push(format!("{}: {}", case.name, got.doc));
        }
    }
    let count = |k: &str| tally.get(k).copied().unwrap_or(0);
    println!(
        "\ncorrect {} · premature {} · runaway {} · wrong reason {}",
        count("correct"),
        count("premature"),
        count("runaway"),
        count("wrong reason")
    );
    println!(
        "{} passed, {} failed ({} cases in {:.1} s)",
        count("correct"),
        failed.len(),
        cases.len(),
        took.as_secs_f64()
    );
    assert!(failed.is_empty(), "wrong endings:\n{}", failed.join("\n"));

    // What the endings must show beyond status and reason.
    let find = |name: &str| {
        let i = cases.iter().position(|c| c.name == name).unwrap();
        &outcomes[i].doc
    };
    let mash = find("keyboard mash");
    assert_eq!(
        mash["refinement"]["matched_patterns"],
        json!(["no_words", "keyboard_mash"])
    );
    assert!(
        mash["refinement"]["suggested_goal"]
            .as_str()
            .unwrap()
            .contains("what to deliver")
    );
    assert_eq!(
        find("one bare word")["refinement"]["matched_patterns"],
        json!(["too_short"])
    );
    assert!(
        find("punctuation only")["detail"]
            .as_str()
            .unwrap()
            .contains("no words")
    );
    let overrun = find("cannot finish within budget");
    assert_eq!(overrun["projected_tokens_to_finish"], 197_000);
    assert_eq!(overrun["projected_cost_to_finish"], 0.394);
    assert_eq!(overrun["projection_basis"]["percent_complete"], 1.5);
    let id = overrun["id"].as_str().unwrap();
    let decisions = app.decisions(id).await;
    let pause = decisions
        .iter()
        .find(|d| d["kind"] == "gate_decision")
        .expect("the gate's pause is logged");
    assert_eq!(pause["data"]["decision"]["cause"], "projected_overrun");
    assert_eq!(pause["data"]["metrics"]["overrun_streak"], 3);
    assert_eq!(
        pause["data"]["metrics"]["projection"]["tokens_to_finish"],
        197_000
    );
    assert!(
        overrun["reason_detail"]
            .as_str()
            .unwrap()
            .starts_with("projected 197000 more tokens")
    );
}
