//! The built `warden` binary's command line: help at every level, errors
//! that name the flag (exit 2), completions. Every call here stops at the
//! parser, so none opens a database; `DATABASE_URL` points at a closed port
//! so that a call that did would fail instead of making `./.warden`.

use std::process::{Command, Output};

/// `warden args...`, its output captured.
fn warden(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_warden"))
        .args(args)
        .env("DATABASE_URL", "postgres://warden@127.0.0.1:1/none")
        .env_remove("CLICOLOR_FORCE")
        .output()
        .expect("warden runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn help_answers_with_every_command() {
    let out = warden(&["--help"]);
    let help = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(help.contains("Usage: warden [OPTIONS]"), "{help}");
    assert!(help.contains("warden <COMMAND>"), "{help}");
    assert!(help.contains("--listen <ADDR>"), "{help}");
    for command in [
        "openapi",
        "healthcheck",
        "keys",
        "secrets",
        "tenants",
        "db",
        "config",
        "archive",
        "sessions",
        "workers",
        "completions",
    ] {
        assert!(
            help.lines()
                .any(|l| l.trim_start().starts_with(&format!("{command} "))),
            "--help lists {command}: {help}"
        );
    }
}

#[test]
fn keys_help_answers_with_its_subcommands_and_flags() {
    let out = warden(&["keys", "--help"]);
    let help = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(help.contains("Usage: warden keys <COMMAND>"), "{help}");
    for sub in ["create", "list", "revoke"] {
        assert!(help.contains(sub), "keys --help lists {sub}: {help}");
    }
    let out = warden(&["keys", "create", "--help"]);
    let help = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0));
    for flag in ["--tenant", "--role", "--global", "--name", "--queues"] {
        assert!(
            help.contains(flag),
            "keys create --help shows {flag}: {help}"
        );
    }
}

#[test]
fn a_bad_flag_exits_2_naming_it() {
    let out = warden(&[
        "keys", "create", "--tenant", "acme", "--role", "viewer", "--bogus",
    ]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--bogus"), "{err}");
    assert!(out.stdout.is_empty());

    let out = warden(&["tenants", "set", "acme", "--weight", "0"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--weight"), "{err}");

    let out = warden(&["keys", "create", "--tenant", "acme"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--role"), "a missing flag is named: {err}");
}

#[test]
fn an_unknown_command_exits_2_naming_it() {
    let out = warden(&["frobnicate"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("'frobnicate'"), "{err}");
}

#[test]
fn completions_are_printed_for_bash() {
    let out = warden(&["completions", "bash"]);
    let script = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(script.contains("complete -F _warden"), "{script}");
    assert!(script.contains("--max-running"), "{script}");
}
