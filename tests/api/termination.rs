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
use common::{SessionView, TestApp, config_with};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// Answers for one case, found by a key its goal carries into every prompt.
#[derive(Default)]
struct Route {
    agent: VecDeque<Answer>,
    reflection: VecDeque<Answer>,
    /// The last reflection answer repeats forever.
    sticky_reflection: bool,
    /// The answer to every reflection on an agent's done-claim, when set
    /// (the queue answers the others).
    claim_reflection: Option<Answer>,
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
                } else if let Some(claim) = route
                    .claim_reflection
                    .as_ref()
                    .filter(|_| haystack.contains("The agent claims the goal is achieved"))
                {
                    Some(claim.clone())
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
    /// The most tokens the session may have used when it ends; more is a runaway.
    tokens_max: Option<i64>,
}

impl Expect {
    /// The same ending, spending at most `tokens`.
    fn spending(self, tokens: i64) -> Expect {
        Expect {
            tokens_max: Some(tokens),
            ..self
        }
    }
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
        tokens_max: None,
    }
}

fn held() -> Expect {
    Expect {
        status: "awaiting_refinement",
        reason: None,
        min: 0,
        max: 0,
        tokens_max: None,
    }
}

fn rejected() -> Expect {
    Expect {
        status: "rejected",
        reason: None,
        min: 0,
        max: 0,
        tokens_max: None,
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

/// Distinct productive steps costing `tokens[i]` each.
fn costed(tokens: &[u64]) -> Vec<Value> {
    tokens
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            let mut s = step(
                &format!("write_part_{}", i + 1),
                json!({ "i": i + 1 }),
                &format!("wrote part {}", i + 1),
            );
            s["tokens"] = json!(t);
            s
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
            json!({ "max_tokens": 300 }),
        ),
        // 100 a step fits exactly three times; the guardrail stops at 300.
        ends("stopped", "cost_limit", 3, 3).spending(300),
    );
    add(
        "token budget, next step does not fit",
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
        // 50 left cannot pay for a 100-token step: paused before it.
        ends("paused", "budget_projected_overrun", 2, 2).spending(200),
    );
    // An agent that reports more than its allowance: the step is charged
    // the whole allowance (never more), and the session stops.
    add(
        "a step over its allowance",
        "limits",
        scripted(
            goal,
            costed(&[400, 5_000, 100, 100]),
            false,
            json!({ "max_tokens": 1_000 }),
        ),
        ends("stopped", "cost_limit", 2, 2).spending(1_000),
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
        "default fixed iteration limit",
        "limits",
        scripted(goal, distinct(150, None), false, json!({})),
        ends("stopped", "max_iterations", 50, 50),
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

    // ---- long productive sessions: the user's own limit is the only stop ----
    let mut s = distinct(150, None);
    s.push(done());
    add(
        "150 steps under max_iterations 200",
        "long sessions",
        scripted(goal, s, false, json!({ "max_iterations": 200 })),
        ends("completed", "goal_achieved", 151, 151),
    );
    add(
        "150 steps, no DONE, under max_iterations 200",
        "long sessions",
        scripted(
            goal,
            distinct(150, None),
            false,
            json!({ "max_iterations": 200 }),
        ),
        ends("stopped", "executor_exhausted", 150, 150),
    );
    let mut s = distinct(500, None);
    s.push(done());
    add(
        "500 steps under max_iterations 600",
        "long sessions",
        scripted(goal, s.clone(), false, json!({ "max_iterations": 600 })),
        ends("completed", "goal_achieved", 501, 501),
    );
    // Continuous with an explicit limit: no review point before it. The
    // reflection interval is out of reach: this corpus's model has no
    // answers for scripted goals.
    add(
        "500 steps, continuous, max_iterations 600",
        "long sessions",
        json!({
            "goal": goal, "mode": "continuous",
            "limits": { "max_iterations": 600, "reflection_interval": 1000 },
            "executor": { "kind": "scripted", "steps": s }
        }),
        ends("completed", "goal_achieved", 501, 501),
    );
    add(
        "continuous, max_iterations 120 beyond the default review point",
        "long sessions",
        json!({
            "goal": goal, "mode": "continuous",
            "limits": { "max_iterations": 120, "reflection_interval": 1000 },
            "executor": { "kind": "scripted", "steps": distinct(150, None) }
        }),
        ends("stopped", "max_iterations", 120, 120),
    );
    let mut s = distinct(150, None);
    s.push(done());
    add(
        "continuous, review_every 0, 150 steps",
        "long sessions",
        json!({
            "goal": goal, "mode": "continuous",
            "limits": { "review_every": 0, "reflection_interval": 1000 },
            "executor": { "kind": "scripted", "steps": s }
        }),
        ends("completed", "goal_achieved", 151, 151),
    );

    // ---- review points ----
    add(
        "continuous, review_every 5",
        "review points",
        json!({
            "goal": goal, "mode": "continuous",
            "limits": { "review_every": 5 },
            "executor": { "kind": "scripted", "steps": distinct(20, None) }
        }),
        ends("paused", "review_required", 5, 5),
    );
    add(
        "continuous, default review point",
        "review points",
        json!({
            "goal": goal, "mode": "continuous",
            "limits": { "reflection_interval": 1000 },
            "executor": { "kind": "scripted", "steps": distinct(150, None) }
        }),
        ends("paused", "review_required", 100, 100),
    );
    add(
        "fixed, review_every 10 asked for",
        "review points",
        scripted(
            goal,
            distinct(40, None),
            false,
            json!({ "max_iterations": 200, "review_every": 10 }),
        ),
        ends("paused", "review_required", 10, 10),
    );

    // ---- cost series against a 50,000-token budget ----
    // The budget is hard: before each step its cost is projected from the
    // recent steps (the largest of the last ten; a rising series
    // extrapolated), and a step that would not fit in what is left pauses
    // the session before it spends. No case spends more than 50,000.
    // `repeat` scripts report no progress, so only the budget rule acts.
    let doubling = |first: u64| -> Vec<u64> { (0..20).map(|i| first << i).collect() };
    add(
        "doubling from 100",
        "cost series",
        scripted(
            goal,
            costed(&doubling(100)),
            true,
            json!({ "max_tokens": 50_000 }),
        ),
        // 25,500 spent; the 25,600 step does not fit in 24,500.
        ends("paused", "budget_projected_overrun", 8, 8).spending(25_500),
    );
    add(
        "doubling from 1000",
        "cost series",
        scripted(
            goal,
            costed(&doubling(1_000)),
            true,
            json!({ "max_tokens": 50_000 }),
        ),
        // 31,000 spent; the 32,000 step does not fit in 19,000.
        ends("paused", "budget_projected_overrun", 5, 5).spending(31_000),
    );
    add(
        "doubling from 10, throttled",
        "cost series",
        scripted(
            goal,
            costed(&doubling(10)),
            true,
            json!({ "max_tokens": 50_000 }),
        ),
        // 40,950 spent; the 40,960 step does not fit in 9,050.
        ends("paused", "budget_projected_overrun", 12, 12).spending(40_950),
    );
    let linear: Vec<u64> = (1..=20).map(|i| i * 1_000).collect();
    add(
        "linear, +1000 a step",
        "cost series",
        scripted(goal, costed(&linear), true, json!({ "max_tokens": 50_000 })),
        // 45,000 spent; the next step, projected at 10,125, does not fit in 5,000.
        ends("paused", "budget_projected_overrun", 9, 9).spending(45_000),
    );
    add(
        "linear, +1000 a step, with progress",
        "cost series",
        scripted(
            goal,
            costed(&linear),
            false,
            json!({ "max_tokens": 50_000 }),
        ),
        // Paused before the step that would overrun: 45,000 spent at 45 %.
        ends("paused", "budget_projected_overrun", 9, 9).spending(45_000),
    );
    let spiky: Vec<u64> = (1..=40)
        .map(|i| if i % 5 == 0 { 20_000 } else { 100 })
        .collect();
    add(
        "spiky, 20,000 every 5th step",
        "cost series",
        scripted(goal, costed(&spiky), true, json!({ "max_tokens": 50_000 })),
        // 40,800 spent after two spikes; a third would not fit in 9,200.
        ends("paused", "budget_projected_overrun", 10, 10).spending(40_800),
    );
    add(
        "spiky, with progress",
        "cost series",
        scripted(goal, costed(&spiky), false, json!({ "max_tokens": 50_000 })),
        // The first spike makes finishing look far too dear.
        ends("paused", "budget_projected_overrun", 7, 7).spending(20_600),
    );
    let mut s = costed(&[1_000; 49]);
    s.push(done());
    add(
        "steady spend that fits the budget",
        "cost series",
        scripted(goal, s, false, json!({ "max_tokens": 50_000 })),
        ends("completed", "goal_achieved", 50, 50).spending(49_010),
    );

    // ---- ping-pong between two actions ----
    let toggle = json!([
        { "action": "set_flag", "arguments": { "on": true }, "output": "flag is on", "tokens": 10 },
        { "action": "set_flag", "arguments": { "on": false }, "output": "flag is off", "tokens": 10 }
    ]);
    add(
        "ping-pong, flag on and off",
        "ping-pong",
        json!({ "goal": goal, "executor": { "kind": "scripted", "steps": toggle, "repeat": true } }),
        ends("paused", "rework_loop", 6, 6),
    );
    let mut s: Vec<Value> = (1..=8)
        .flat_map(|i| {
            [
                step(
                    "fetch_page",
                    json!({ "page": i }),
                    &format!("page {i}: 20 rows"),
                ),
                step(
                    "store_rows",
                    json!({ "page": i }),
                    &format!("stored 20 rows, {} total", 20 * i),
                ),
            ]
        })
        .collect();
    s.push(done());
    add(
        "ping-pong that advances, fetch and store",
        "ping-pong",
        scripted(goal, s, false, json!({})),
        ends("completed", "goal_achieved", 17, 17),
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
        claim_reflection: None,
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
    llm(
        16,
        "a model that answers only in text",
        "sentinels",
        "fixed",
        json!({}),
        route(
            vec![
                text("Plan: outline the notes first.", 30),
                text("Outline: goals, setup, usage.", 30),
                text("Drafted the setup section.", 30),
                text("Drafted the usage section.", 30),
                text("Notes complete.\n<<WARDEN_GOAL_DONE: notes drafted>>", 30),
            ],
            vec![],
            false,
        ),
        ends("completed", "goal_achieved", 5, 5),
    );

    // ---- delegation: a parent waits for its children and judges by them ----
    let mut delegation: Vec<(&str, Value, Expect)> = Vec::new();
    let split = |goal: &str, subgoals: Value| {
        json!({
            "goal": goal,
            "limits": { "max_tokens": 20_000 },
            "executor": { "kind": "scripted", "steps": [done()] },
            "subgoals": subgoals,
        })
    };
    let finishing = json!([
        { "action": "work", "tokens": 20, "output": "worked" },
        { "action": "finish", "tokens": 20, "output": "ok\n<<WARDEN_GOAL_DONE: part done>>" }
    ]);
    // Each attempt a different one (the same failing call thrice would be
    // `stuck`, a pause): the error streak stops it.
    let erroring = Value::Array(
        (1..=8)
            .map(|i| {
                json!({ "action": format!("try_way_{i}"), "arguments": { "i": i },
                        "outcome": "error", "tokens": 5, "output": format!("way {i} broke") })
            })
            .collect(),
    );
    let spinning = json!([
        { "action": "spin", "arguments": { "n": 1 }, "tokens": 500, "output": "more" },
        { "action": "spin", "arguments": { "n": 2 }, "tokens": 500, "output": "more" }
    ]);
    delegation.push((
        "delegation: split parts all complete, the parent completes",
        split(
            "Build the parser and write its tests",
            json!([
                { "goal": "Build the parser", "steps": finishing },
                { "goal": "Write the parser's tests", "steps": finishing }
            ]),
        ),
        ends("completed", "goal_achieved", 1, 1),
    ));
    delegation.push((
        "delegation: a runaway child is stopped by its own budget, the parent goes on",
        split(
            "Index the archive and summarise it",
            json!([
                { "goal": "Index the archive", "budget_share": 0.1, "repeat": true, "steps": spinning },
                { "goal": "Summarise the archive", "steps": finishing }
            ]),
        ),
        ends("completed", "goal_achieved", 1, 1),
    ));
    delegation.push((
        "delegation: one child fails, the parent decides to go on",
        split(
            "Translate the guide and proofread it",
            json!([
                { "goal": "Translate the guide", "steps": erroring },
                { "goal": "Proofread the guide", "steps": finishing }
            ]),
        ),
        ends("completed", "goal_achieved", 1, 1),
    ));
    delegation.push((
        "delegation: every child fails, the parent is blocked with their reasons",
        split(
            "Migrate the database and move the files",
            json!([
                { "goal": "Migrate the database", "steps": erroring },
                { "goal": "Move the files", "steps": erroring }
            ]),
        ),
        ends("paused", "agent_blocked", 0, 0),
    ));
    for (name, body, expect) in delegation {
        cases.push(Case {
            name: name.into(),
            category: "delegation",
            body,
            route: None,
            expect,
        });
    }
    cases
}

/// How one case ended.
struct Outcome {
    status: String,
    reason: Option<String>,
    iterations: i64,
    tokens: i64,
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
    if expect.tokens_max.is_some_and(|max| got.tokens > max) {
        // Spent past where it should have stopped, whatever the ending.
        Verdict::Runaway
    } else if right && (expect.min..=expect.max).contains(&got.iterations) {
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
            tokens: 0,
            doc,
        };
    }
    assert_eq!(code, StatusCode::CREATED, "{}: {doc}", case.name);
    let id = doc["id"].as_str().expect("id").to_string();
    // A parent waiting for its children has not ended yet.
    let s = app
        .wait_until(&id, Duration::from_secs(120), |s| {
            s["status"] != "running"
                && s["status"] != "queued"
                && s["reason"] != "waiting_for_children"
        })
        .await;
    let view: SessionView = common::view(&s);
    Outcome {
        status: view.status,
        reason: s["reason"].as_str().map(str::to_string),
        iterations: view.iterations,
        tokens: view.tokens_used,
        doc: s,
    }
}

/// Replays every corpus session that ran under the policy it ran with
/// (no override) through the API: each must reproduce its recorded end
/// (status, reason, iterations). Answers (reproduced, replayed, drifts).
async fn replay_exactly(app: &TestApp, outcomes: &[Outcome]) -> (usize, usize, Vec<String>) {
    let ids: Vec<&str> = outcomes
        .iter()
        // Those that ran: ended, or paused where their loop stopped.
        .filter(|o| {
            ["completed", "stopped", "interrupted", "failed", "paused"].contains(&o.status.as_str())
        })
        .filter_map(|o| o.doc["id"].as_str())
        .collect();
    let res = app
        .client
        .post(app.url("/api/autonomous/replay"))
        .json(&json!({ "session_ids": ids, "deadline_ms": 60_000 }))
        .send()
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::OK);
    let doc: Value = res.json().await.expect("json");
    let mut drift: Vec<String> = doc["not_replayed"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| format!("not replayed: {s}"))
        .collect();
    let sessions = doc["sessions"].as_array().cloned().unwrap_or_default();
    for s in &sessions {
        let (was, now) = (&s["recorded"], &s["baseline"]);
        if s["reproduced"] != true || s["divergence"] != Value::Null {
            drift.push(format!(
                "{}: recorded {} {} ({}), replayed {} {} ({}) by {}",
                s["id"],
                was["status"],
                was["reason"],
                was["iterations"],
                now["status"],
                now["reason"],
                now["iterations"],
                now["ended_by"]
            ));
        }
    }
    let reproduced = sessions.iter().filter(|s| s["reproduced"] == true).count();
    (reproduced, ids.len(), drift)
}

#[tokio::test]
async fn the_labelled_corpus_ends_every_session_right() {
    let routes: Routes = Arc::default();
    let base = start_model(routes.clone()).await;
    let ws = std::env::temp_dir()
        .join(format!("warden-corpus-{}", uuid::Uuid::new_v4()))
        .to_string_lossy()
        .to_string();
    let app = TestApp::start_with(config_with(&[
        ("WARDEN_LLM_BASE_URL", base.as_str()),
        ("WARDEN_LLM_MODEL", "fake-model"),
        ("WARDEN_WORKSPACE_ROOT", ws.as_str()),
        ("WARDEN_MODEL_PRICES", "*=2/2"),
        // The corpus judges the policy, not crash recovery: a lease long
        // enough that a loaded CI machine never hands a session over
        // mid-case (the model's scripted answers are consumed once).
        ("WARDEN_LEASE_TTL_MS", "30000"),
        ("WARDEN_HEARTBEAT_INTERVAL_MS", "1000"),
        // Accelerating cost series are throttled; the cooldown delays
        // them without changing how they end.
        ("WARDEN_THROTTLE_COOLDOWN_MS", "50"),
    ]))
    .await;
    let mut cases = corpus();
    assert!(cases.len() >= 60, "the corpus has {} cases", cases.len());
    cases.extend(adaptive_interval_cases());
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
        "\n{:<62} {:<18} {:<44} {:<52} verdict",
        "case", "category", "expected (≤ iterations)", "got (iterations, tokens)"
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
            "{:<62} {:<18} {:<44} {:<52} {label}",
            case.name,
            case.category,
            format!(
                "{} {} (≤ {})",
                case.expect.status,
                case.expect.reason.unwrap_or("-"),
                case.expect.max
            ),
            format!(
                "{} {} ({}, {})",
                got.status,
                got.reason.as_deref().unwrap_or("-"),
                got.iterations,
                got.tokens
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
    // The rates: of the sessions that should complete, how many did; of
    // all, how many stopped before their right ending or ran past it.
    let should_complete = cases
        .iter()
        .filter(|c| c.expect.status == "completed")
        .count();
    let completed = cases
        .iter()
        .zip(&outcomes)
        .filter(|(c, got)| {
            c.expect.status == "completed" && judge(&c.expect, got) == Verdict::Correct
        })
        .count();
    let rate = |n: usize, of: usize| 100.0 * n as f64 / of.max(1) as f64;
    let (reproduced, replayable, drift) = replay_exactly(&app, &outcomes).await;
    let summary = format!(
        "termination corpus on {}: completion rate {:.1} % ({completed}/{should_complete}) · premature-stop rate {:.1} % · runaway rate {:.1} %\n\
         {} passed, {} failed ({} cases in {:.1} s)\n\
         replay with the policy each ran with reproduces {reproduced}/{replayable} recorded ends\n",
        if crate::common::embedded() {
            "embedded PostgreSQL"
        } else {
            "a Postgres server"
        },
        rate(completed, should_complete),
        rate(count("premature"), cases.len()),
        rate(count("runaway"), cases.len()),
        count("correct"),
        failed.len(),
        cases.len(),
        took.as_secs_f64()
    );
    print!("{summary}");
    // For CI's log: a passing test's output is captured, so `.ci/run`
    // prints this file after each leg.
    let store = if crate::common::embedded() {
        "embedded"
    } else {
        "server"
    };
    let report = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("termination-corpus-{store}.txt"));
    if let Err(err) = std::fs::write(&report, &summary) {
        eprintln!("cannot write {}: {err}", report.display());
    }
    assert!(failed.is_empty(), "wrong endings:\n{}", failed.join("\n"));
    assert!(
        drift.is_empty() && reproduced == replayable,
        "replay drifted from the record:\n{}",
        drift.join("\n")
    );
    adaptive_interval_report(&app, &cases, &outcomes, &report).await;

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
    let review = find("continuous, review_every 5");
    let summary = review["summary"].as_str().expect("summary");
    assert!(
        summary.contains("5 steps since a person last looked")
            && summary.contains("#5 write_part_5 → wrote part 5"),
        "{summary}"
    );
    assert_eq!(
        find("150 steps under max_iterations 200")["limits"]["review_every"],
        0
    );
    let overrun = find("cannot finish within budget");
    assert_eq!(overrun["projected_tokens_to_finish"], 197_000);
    assert_eq!(overrun["projected_cost_to_finish_usd"], "0.394");
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

// ---- the adaptive reflection interval ----
//
// Sessions that leave `limits.reflection_interval` unset reflect on an
// adaptive interval (5 to 20 steps). Each scenario runs twice: adaptive, and
// its twin at a fixed interval of 10. Both must end right (the corpus's
// scoring above); on steady sessions the adaptive twin must spend fewer
// reflection calls, and the counts go into the corpus report.

/// The name of a scenario's adaptive run.
const ADAPTIVE: &str = "adaptive interval";
/// The name of its twin at a fixed interval of 10.
const FIXED_10: &str = "fixed interval 10";

/// One scenario of the adaptive interval: `writes` productive steps, then
/// (when `claims`) a done-claim; the reflector's answers in order (the last
/// repeats); the right ending adaptive and fixed.
struct IntervalScenario {
    name: &'static str,
    steady: bool,
    writes: usize,
    claims: bool,
    reflections: Vec<Answer>,
    adaptive: Expect,
    fixed: Expect,
}

fn interval_scenarios() -> Vec<IntervalScenario> {
    let rising = |n: usize| -> Vec<Answer> {
        (1..=n)
            .map(|i| assessment("NO", "GOOD", (10 * i).min(85) as f64, false, "CONTINUE"))
            .collect()
    };
    vec![
        IntervalScenario {
            name: "steady, 40 steps then a done-claim",
            steady: true,
            writes: 40,
            claims: true,
            reflections: rising(10),
            adaptive: ends("completed", "goal_achieved", 41, 41),
            fixed: ends("completed", "goal_achieved", 41, 41),
        },
        IntervalScenario {
            name: "steady, 80 steps then a done-claim",
            steady: true,
            writes: 80,
            claims: true,
            reflections: rising(10),
            adaptive: ends("completed", "goal_achieved", 81, 81),
            fixed: ends("completed", "goal_achieved", 81, 81),
        },
        // Stuck (no loop yet) at the first look, then stuck in a loop: the
        // adaptive run looks again after 5 steps, the fixed one after 10.
        IntervalScenario {
            name: "stuck, the reflector sees a loop at its second look",
            steady: false,
            writes: 40,
            claims: false,
            reflections: vec![
                assessment("NO", "STUCK", 20.0, false, "CONTINUE"),
                assessment("NO", "STUCK", 20.0, true, "CONTINUE"),
            ],
            adaptive: ends("paused", "stuck", 15, 15),
            fixed: ends("paused", "stuck", 20, 20),
        },
    ]
}

/// The scenarios' cases, adaptive and fixed twins, keyed `adaptNN.md`.
fn adaptive_interval_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for (s, scenario) in interval_scenarios().into_iter().enumerate() {
        for fixed in [false, true] {
            let key = format!("adapt{:02}.md", 2 * s + usize::from(fixed));
            let stem = key.trim_end_matches(".md").to_string();
            let mut agent: Vec<Answer> = (1..=scenario.writes)
                .map(|i| {
                    tool_calls(
                        &[(
                            "write_file",
                            json!({ "path": format!("{stem}-{i}.md"), "content": format!("part {i}") }),
                        )],
                        100,
                    )
                })
                .collect();
            if scenario.claims {
                agent.push(tool_calls(
                    &[(
                        "task_completion",
                        json!({ "result": "notes written", "deliverables": [format!("{stem}-1.md")] }),
                    )],
                    50,
                ));
            }
            let limits = if fixed {
                json!({ "reflection_interval": 10 })
            } else {
                json!({})
            };
            cases.push(Case {
                name: format!(
                    "{}: {}",
                    if fixed { FIXED_10 } else { ADAPTIVE },
                    scenario.name
                ),
                category: "adaptive interval",
                body: json!({
                    "goal": format!("Write {key} with the project notes"),
                    "mode": "continuous", "limits": limits, "executor": { "kind": "llm" }
                }),
                route: Some(Route {
                    agent: agent.into(),
                    reflection: scenario.reflections.clone().into(),
                    sticky_reflection: true,
                    claim_reflection: Some(assessment("YES", "GOOD", 100.0, false, "STOP")),
                }),
                expect: if fixed {
                    scenario.fixed
                } else {
                    scenario.adaptive
                },
            });
        }
    }
    cases
}

/// Reflections a session ran (failed ones included).
async fn reflections_of(app: &TestApp, doc: &Value) -> usize {
    let id = doc["id"].as_str().expect("id");
    let (status, page) = app
        .get(&format!("/api/autonomous/{id}/reflections?limit=200"))
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    page["items"].as_array().map_or(0, Vec::len)
}

/// Counts reflection calls per scenario, adaptive against fixed 10, adds
/// them to the corpus report, and holds the adaptive runs of steady
/// sessions to fewer calls than their fixed twins.
async fn adaptive_interval_report(
    app: &TestApp,
    cases: &[Case],
    outcomes: &[Outcome],
    report: &std::path::Path,
) {
    let outcome = |prefix: &str, scenario: &str| {
        let name = format!("{prefix}: {scenario}");
        let i = cases
            .iter()
            .position(|c| c.name == name)
            .unwrap_or_else(|| panic!("{name} is in the corpus"));
        &outcomes[i]
    };
    let mut text = String::from(
        "adaptive reflection interval (reflection calls, adaptive vs fixed interval 10):\n",
    );
    let (mut steady_adaptive, mut steady_fixed) = (0, 0);
    for scenario in interval_scenarios() {
        let (a, f) = (
            outcome(ADAPTIVE, scenario.name),
            outcome(FIXED_10, scenario.name),
        );
        let adaptive = reflections_of(app, &a.doc).await;
        let fixed = reflections_of(app, &f.doc).await;
        text.push_str(&format!(
            "  {:<52} adaptive {adaptive:>3} · fixed 10 {fixed:>3}   (ended at iteration {} · {})\n",
            scenario.name, a.iterations, f.iterations
        ));
        if scenario.steady {
            assert!(
                adaptive < fixed,
                "{}: adaptive spent {adaptive} reflections, fixed 10 spent {fixed}",
                scenario.name
            );
            steady_adaptive += adaptive;
            steady_fixed += fixed;
        }
    }
    text.push_str(&format!(
        "  steady sessions in all: adaptive {steady_adaptive} · fixed 10 {steady_fixed} (0 premature, 0 runaway: scored above)\n"
    ));
    print!("{text}");
    let appended = std::fs::OpenOptions::new()
        .append(true)
        .open(report)
        .and_then(|mut f| std::io::Write::write_all(&mut f, text.as_bytes()));
    if let Err(err) = appended {
        eprintln!("cannot add to {}: {err}", report.display());
    }
    assert!(steady_adaptive < steady_fixed);
}
