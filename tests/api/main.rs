//! Warden's integration tests, one binary: each module drives a real
//! Warden over HTTP against its own database (`common::TestApp::start`
//! makes one and keeps it as long as the app: a private database on the
//! `DATABASE_URL` server, or, with it unset, a temporary embedded
//! PostgreSQL), and reads the answers as typed views (`common::views`).
//! One binary links once and shares the harness; `TEST_LOG=1 cargo test`
//! prints the servers' logs (`RUST_LOG` filters them, default `info`).

mod common;

mod admission;
mod approvals;
mod auth;
mod children;
mod cli;
mod confirmation;
mod connections;
mod control;
mod creates;
mod deletion;
mod docs;
mod egress;
mod estimates;
mod fairness;
mod fleet;
mod fork;
mod goals;
mod http;
mod insights;
mod isolation;
mod mcp;
mod memory;
mod model;
mod money;
mod notify;
mod openapi;
mod owners;
mod quotas;
mod recovery;
mod replay;
mod retention;
mod secrets;
mod sessions;
mod soft_budgets;
mod store;
mod streams;
mod telemetry;
mod telemetry_conformance;
mod termination;
mod upgrades;
mod worker_crash;
mod workers;
mod workspace_files;
