//! The command line as clap parses it: every command and documented flag,
//! the README's command lines, and errors that name the flag.

use clap::CommandFactory;
use clap::Parser;
use clap::error::ErrorKind;

use super::archive::ArchiveCommand;
use super::db::DbCommand;
use super::keys::KeysCommand;
use super::secrets::SecretsCommand;
use super::tenants::{Limit, TenantsCommand};
use super::{Cli, Command};
use warden::auth::Role;

/// `line` (words split at spaces, `warden` first) as clap parses it.
fn parse(line: &str) -> Result<Option<Command>, clap::Error> {
    Cli::try_parse_from(line.split_whitespace()).map(|cli| cli.command)
}

/// A line that must parse to a command.
fn command(line: &str) -> Command {
    match parse(line) {
        Ok(Some(command)) => command,
        Ok(None) => panic!("{line}: no command"),
        Err(err) => panic!("{line}: {err}"),
    }
}

/// A line clap must refuse: its error kind and message.
fn refused(line: &str) -> (ErrorKind, String) {
    match parse(line) {
        Ok(command) => panic!("{line}: accepted as {command:?}"),
        Err(err) => (err.kind(), err.to_string()),
    }
}

#[test]
fn the_definitions_are_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn no_command_serves() {
    assert!(matches!(parse("warden"), Ok(None)));
}

#[test]
fn the_commands_without_flags_parse() {
    assert!(matches!(command("warden openapi"), Command::Openapi));
    assert!(matches!(
        command("warden healthcheck"),
        Command::Healthcheck
    ));
    assert!(matches!(
        command("warden keys list"),
        Command::Keys(KeysCommand::List)
    ));
    assert!(matches!(
        command("warden tenants list"),
        Command::Tenants(TenantsCommand::List)
    ));
    assert!(matches!(
        command("warden db dump"),
        Command::Db(DbCommand::Dump)
    ));
    assert!(matches!(
        command("warden secrets rotate"),
        Command::Secrets(SecretsCommand::Rotate)
    ));
    assert!(matches!(
        command("warden secrets status"),
        Command::Secrets(SecretsCommand::Status)
    ));
    assert!(matches!(
        command("warden secrets retire"),
        Command::Secrets(SecretsCommand::Retire)
    ));
    let Command::Archive(ArchiveCommand::Import { file }) =
        command("warden archive import /tmp/0190.jsonl.zst")
    else {
        panic!("archive import")
    };
    assert_eq!(file, std::path::Path::new("/tmp/0190.jsonl.zst"));
}

#[test]
fn keys_create_takes_every_flag_in_any_order() {
    let Command::Keys(KeysCommand::Create(key)) =
        command("warden keys create --role worker --name ci --queues a,b --tenant acme")
    else {
        panic!("keys create")
    };
    assert_eq!(
        (
            key.tenant.as_str(),
            key.role,
            key.global,
            key.name.as_deref()
        ),
        ("acme", Role::Worker, false, Some("ci"))
    );
    assert_eq!(key.queues, ["a", "b"]);
    let Command::Keys(KeysCommand::Create(key)) =
        command("warden keys create --tenant ops --role admin --global")
    else {
        panic!("keys create --global")
    };
    assert_eq!((key.role, key.global), (Role::Admin, true));
    assert!(key.queues.is_empty() && key.name.is_none());
    for role in ["admin", "operator", "viewer", "worker"] {
        let Command::Keys(KeysCommand::Create(key)) =
            command(&format!("warden keys create --tenant t --role {role}"))
        else {
            panic!("{role}")
        };
        assert_eq!(key.role.as_str(), role);
    }
}

#[test]
fn keys_revoke_takes_an_id() {
    let id = "0190a9c4-5b1e-7d2a-8f3c-1234567890ab";
    let Command::Keys(KeysCommand::Revoke { id: got }) =
        command(&format!("warden keys revoke {id}"))
    else {
        panic!("keys revoke")
    };
    assert_eq!(got.to_string(), id);
    let (kind, message) = refused("warden keys revoke not-a-uuid");
    assert_eq!(kind, ErrorKind::ValueValidation);
    assert!(message.contains("<ID>"), "{message}");
}

#[test]
fn tenants_set_takes_numbers_and_the_words_that_clear() {
    let Command::Tenants(TenantsCommand::Set(set)) = command(
        "warden tenants set acme --weight 3 --max-running 200 --max-depth 5 --max-children 12",
    ) else {
        panic!("tenants set")
    };
    assert_eq!(set.tenant, "acme");
    assert_eq!(set.weight, Some(3));
    assert_eq!(set.max_running, Some(Limit(Some(200))));
    assert_eq!(set.max_depth, Some(Limit(Some(5))));
    assert_eq!(set.max_children, Some(Limit(Some(12))));
    let Command::Tenants(TenantsCommand::Set(set)) = command(
        "warden tenants set acme --max-running none --max-depth default --max-children default",
    ) else {
        panic!("tenants set words")
    };
    assert_eq!(set.weight, None, "left out: kept as it is");
    assert_eq!(set.max_running, Some(Limit(None)));
    assert_eq!(set.max_depth, Some(Limit(None)));
    assert_eq!(set.max_children, Some(Limit(None)));
    let Command::Tenants(TenantsCommand::Set(set)) = command("warden tenants set acme") else {
        panic!("tenants set alone")
    };
    assert_eq!(
        (set.max_running, set.max_depth, set.max_children),
        (None, None, None)
    );
}

#[test]
fn config_takes_markdown() {
    let Command::Config(args) = command("warden config") else {
        panic!("config")
    };
    assert!(!args.markdown);
    let Command::Config(args) = command("warden config --markdown") else {
        panic!("config --markdown")
    };
    assert!(args.markdown);
}

#[test]
fn completions_are_written_for_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let Command::Completions { shell } = command(&format!("warden completions {shell}")) else {
            panic!("{shell}")
        };
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut Cli::command(), "warden", &mut script);
        let script = String::from_utf8(script).unwrap();
        for word in ["keys", "revoke", "max-running", "markdown"] {
            assert!(script.contains(word), "{shell} completes {word}");
        }
    }
    assert_eq!(
        refused("warden completions tcsh").0,
        ErrorKind::InvalidValue
    );
}

#[test]
fn bad_values_are_refused_naming_the_flag() {
    for (line, flag) in [
        ("warden keys create --tenant acme --role root", "--role"),
        ("warden keys create --tenant a/b --role viewer", "--tenant"),
        ("warden tenants set acme --weight 0", "--weight"),
        ("warden tenants set acme --weight 1001", "--weight"),
        ("warden tenants set acme --max-running -1", "--max-running"),
        (
            "warden tenants set acme --max-running many",
            "--max-running",
        ),
        ("warden tenants set acme --max-depth 65", "--max-depth"),
        ("warden tenants set acme --max-children 0", "--max-children"),
        (
            "warden tenants set acme --max-children none",
            "--max-children",
        ),
    ] {
        let (kind, message) = refused(line);
        assert!(
            matches!(kind, ErrorKind::InvalidValue | ErrorKind::ValueValidation),
            "{line}: {kind:?}"
        );
        assert!(message.contains(flag), "{line}: {message}");
    }
    let (_, message) = refused("warden tenants set a/b");
    assert!(message.contains("<TENANT>"), "{message}");
}

#[test]
fn unknown_and_missing_flags_are_named() {
    let (kind, message) = refused("warden keys create --tenant acme --role viewer --bogus");
    assert_eq!(kind, ErrorKind::UnknownArgument);
    assert!(message.contains("--bogus"), "{message}");
    let (kind, message) = refused("warden keys create --tenant acme");
    assert_eq!(kind, ErrorKind::MissingRequiredArgument);
    assert!(message.contains("--role"), "{message}");
    let (kind, message) = refused("warden keys create --tenant acme --tenant other --role viewer");
    assert_eq!(kind, ErrorKind::ArgumentConflict);
    assert!(message.contains("--tenant"), "{message}");
    assert_eq!(
        refused("warden db dump extra").0,
        ErrorKind::UnknownArgument
    );
    assert_eq!(refused("warden frobnicate").0, ErrorKind::InvalidSubcommand);
    assert_eq!(
        refused("warden keys").0,
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    );
}

#[test]
fn help_is_answered_at_every_level() {
    let mut lines = vec!["warden --help".to_string(), "warden help".to_string()];
    for sub in Cli::command().get_subcommands() {
        lines.push(format!("warden {} --help", sub.get_name()));
        for inner in sub.get_subcommands() {
            lines.push(format!(
                "warden {} {} --help",
                sub.get_name(),
                inner.get_name()
            ));
        }
    }
    assert!(lines.len() > 15, "{lines:?}");
    for line in lines {
        assert_eq!(refused(&line).0, ErrorKind::DisplayHelp, "{line}");
    }
    assert_eq!(refused("warden --version").0, ErrorKind::DisplayVersion);
}

/// The pages whose shell blocks show the command line: the README and
/// every page under docs/ that runs `warden`.
const DOCUMENTED: [&str; 8] = [
    include_str!("../../README.md"),
    include_str!("../../docs/guides/cli.md"),
    include_str!("../../docs/reference/cli.md"),
    include_str!("../../docs/operations/storage.md"),
    include_str!("../../docs/operations/fleet.md"),
    include_str!("../../docs/operations/security.md"),
    include_str!("../../docs/operations/retention.md"),
    include_str!("../../docs/operations/upgrades.md"),
];

/// The `warden ...` and `cargo run ... [-- ...]` lines of the documentation's
/// shell blocks, as words (up to a comment or a redirection; `$VAR` as an id).
fn readme_command_lines() -> Vec<String> {
    let readme = DOCUMENTED.join("\n");
    let mut lines = Vec::new();
    let mut in_shell = false;
    for line in readme.lines().map(str::trim) {
        if let Some(language) = line.strip_prefix("```") {
            in_shell = language == "sh";
            continue;
        }
        let words = if !in_shell {
            continue;
        } else if let Some(rest) = line.strip_prefix("warden ") {
            rest
        } else if let Some((_, rest)) = line.split_once("cargo run") {
            if rest.contains("--bin") {
                continue;
            }
            rest.split_once(" -- ").map_or("", |(_, words)| words)
        } else {
            continue;
        };
        let words: Vec<&str> = std::iter::once("warden")
            .chain(words.split_whitespace())
            .take_while(|w| !["#", ">", "|", "2>"].contains(w))
            .map(|w| match w.starts_with('$') {
                true => "0190a9c4-5b1e-7d2a-8f3c-1234567890ab",
                false => w,
            })
            .collect();
        lines.push(words.join(" "));
    }
    lines
}

#[test]
fn the_readme_command_lines_parse() {
    let lines = readme_command_lines();
    assert!(
        lines.iter().any(|l| l == "warden"),
        "the README serves: {lines:?}"
    );
    for want in [
        "keys create",
        "keys list",
        "keys revoke",
        "db dump",
        "--help",
        "completions",
        "sessions watch",
    ] {
        assert!(
            lines.iter().any(|l| l.contains(want)),
            "the README shows `warden {want}`: {lines:?}"
        );
    }
    for line in &lines {
        match parse(line) {
            Ok(_) => {}
            Err(err) if matches!(err.kind(), ErrorKind::DisplayHelp) => {}
            Err(err) => panic!("README: `{line}`: {err}"),
        }
    }
}

#[test]
fn listen_is_a_flag_of_serving_only() {
    let cli = Cli::try_parse_from(["warden", "--listen", "0.0.0.0:9000"]).expect("parses");
    assert_eq!(cli.listen.as_deref(), Some("0.0.0.0:9000"));
    assert!(cli.command.is_none());
    let err = Cli::try_parse_from(["warden", "--listen", "0.0.0.0:9000", "openapi"])
        .expect_err("a command does not serve");
    assert_eq!(
        err.kind(),
        clap::error::ErrorKind::ArgumentConflict,
        "{err}"
    );
}
