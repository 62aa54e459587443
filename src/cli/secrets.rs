//! `warden secrets ...`: rotate the key ring, see what each key seals,
//! drop keys that seal nothing.

use std::path::Path;
use std::process::ExitCode;

use clap::Subcommand;
use warden::config::settings;
use warden::store::Store;

use super::store::{Schema, on_cli_store};

/// The subcommands of `warden secrets`.
#[derive(Debug, Subcommand)]
pub enum SecretsCommand {
    /// Make a new current key; the old keys still open what they sealed
    ///
    /// The new key becomes the key file's first (current) line, the old keys
    /// stay after it. With WARDEN_SECRET_KEYS or WARDEN_SECRET_KEY set, prints
    /// a new key to put first in WARDEN_SECRET_KEYS instead. Restart the
    /// replicas one by one: the first with the new key re-seals every secret
    /// under it in the background.
    Rotate,
    /// How many secrets each key id still seals, and the fleet's current key
    ///
    /// Reads DATABASE_URL, or the embedded database when it is unset.
    Status,
    /// Drop from the key file every old key that seals nothing any more
    ///
    /// Reads DATABASE_URL, or the embedded database when it is unset.
    Retire,
}

/// Where the keys come from: the environment, else the key file.
struct KeySource {
    env_keys: bool,
    key_file: std::path::PathBuf,
}

impl KeySource {
    fn of_process() -> KeySource {
        let vars = settings::process_env();
        KeySource {
            env_keys: settings::WARDEN_SECRET_KEYS.lookup(&vars).is_some()
                || settings::WARDEN_SECRET_KEY.lookup(&vars).is_some(),
            key_file: settings::WARDEN_SECRET_KEY_FILE
                .value(&vars)
                .unwrap_or_default()
                .into(),
        }
    }
}

/// Runs `warden secrets ...`.
pub(super) async fn run(command: SecretsCommand) -> ExitCode {
    let keys = KeySource::of_process();
    match command {
        SecretsCommand::Rotate if keys.env_keys => new_env_key(),
        SecretsCommand::Rotate => rotate_file(&keys.key_file),
        SecretsCommand::Status => {
            on_cli_store("secrets", Schema::Read, async |store| status(store).await).await
        }
        SecretsCommand::Retire => {
            on_cli_store("secrets", Schema::Write, async |store| {
                retire(store, &keys).await
            })
            .await
        }
    }
}

/// Rotation by hand: a new key for the operator to put first in the list.
fn new_env_key() -> ExitCode {
    match warden::secrets::SecretKey::generate() {
        Ok(key) => {
            eprintln!(
                "new secret key {} (shown only now); put it first in WARDEN_SECRET_KEYS, \
the current keys after it, on every replica (WARDEN_SECRET_KEYS=<new>,<current>,...), and restart them one by one",
                key.id()
            );
            println!("{}", key.expose_hex());
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("warden secrets: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Rotation of the key file: a new first line, the old ones kept.
fn rotate_file(key_file: &Path) -> ExitCode {
    match warden::secrets::rotate_key_file(key_file) {
        Ok((new, kept)) => {
            let kept: Vec<&str> = kept.iter().map(|k| k.id()).collect();
            println!(
                "{}: new current key {}, kept {}; restart the replicas one by one (each reads the file at start): \
the first re-seals every secret under {} in the background; `warden secrets status` shows the progress",
                key_file.display(),
                new.id(),
                kept.join(", "),
                new.id()
            );
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("warden secrets: {err}");
            ExitCode::FAILURE
        }
    }
}

/// The fleet's registered key id and how many secrets each key id seals.
async fn sealed(store: &Store) -> Result<(Option<String>, Vec<(String, i64)>), ExitCode> {
    match (
        store.registered_secret_key().await,
        store.secret_counts().await,
    ) {
        (Ok(registered), Ok(counts)) => Ok((registered, counts)),
        (Err(err), _) | (_, Err(err)) => {
            eprintln!("warden secrets: {err}");
            Err(ExitCode::FAILURE)
        }
    }
}

/// `warden secrets status`: the table, and whether old keys can go.
async fn status(store: &Store) -> ExitCode {
    let (registered, counts) = match sealed(store).await {
        Ok(sealed) => sealed,
        Err(code) => return code,
    };
    println!(
        "current key (registered by the fleet): {}",
        registered.as_deref().unwrap_or("none yet")
    );
    println!("KEY ID\tSECRETS");
    if let Some(id) = registered
        .as_deref()
        .filter(|id| !counts.iter().any(|(k, _)| k == id))
    {
        println!("{id}\t0");
    }
    for (id, n) in &counts {
        println!("{id}\t{n}");
    }
    let old: i64 = counts
        .iter()
        .filter(|(id, _)| Some(id.as_str()) != registered.as_deref())
        .map(|(_, n)| n)
        .sum();
    if old == 0 {
        println!(
            "every secret is sealed under the current key: older keys can be dropped (`warden secrets retire`)"
        );
    } else {
        println!(
            "{old} secrets are still sealed under older keys: keep those keys until the re-seal is done"
        );
    }
    ExitCode::SUCCESS
}

/// `warden secrets retire`: drops the key file's keys that seal nothing.
async fn retire(store: &Store, keys: &KeySource) -> ExitCode {
    let (registered, counts) = match sealed(store).await {
        Ok(sealed) => sealed,
        Err(code) => return code,
    };
    if keys.env_keys {
        eprintln!(
            "warden secrets retire: the keys come from WARDEN_SECRET_KEYS or WARDEN_SECRET_KEY: \
drop from it every key `warden secrets status` lists with no secret"
        );
        return ExitCode::from(2);
    }
    let still: Vec<String> = counts
        .into_iter()
        .map(|(id, _)| id)
        .chain(registered)
        .collect();
    let key_file = &keys.key_file;
    match warden::secrets::retire_from_key_file(key_file, &still) {
        Ok(dropped) if dropped.is_empty() => {
            println!(
                "{}: every key still seals something; nothing dropped",
                key_file.display()
            );
            ExitCode::SUCCESS
        }
        Ok(dropped) => {
            println!("{}: dropped {}", key_file.display(), dropped.join(", "));
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("warden secrets: {err}");
            ExitCode::FAILURE
        }
    }
}
