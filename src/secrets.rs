//! Secrets at rest: a session's own `api_key` is sealed
//! with XChaCha20-Poly1305 under a 256-bit key the operator provides
//! (`WARDEN_SECRET_KEY`) or one generated on first start and kept in a file
//! outside the database (`WARDEN_SECRET_KEY_FILE`). A database dump alone
//! then reveals no session's key. Each sealed value carries the id of the
//! key that sealed it, so a wrong key is named instead of guessed at, and
//! keys can be rotated later. Nothing here is ever logged or `Debug`-printed.

use std::io::Write;
use std::path::{Path, PathBuf};

use base64::Engine;
use chacha20poly1305::aead::{Aead, Payload};
use chacha20poly1305::{KeyInit, XChaCha20Poly1305, XNonce};
use sha2::{Digest, Sha256};
use uuid::Uuid;

/// Name of a session's own model API key among its secrets.
pub const API_KEY: &str = "api_key";
/// Name of the query of a session's client-chosen URL among its secrets.
pub const URL_QUERY: &str = "url_query";

/// Length of a secret key, bytes (256 bits).
pub const KEY_BYTES: usize = 32;
/// Length of a nonce, bytes (XChaCha20: random nonces are safe at this size).
pub const NONCE_BYTES: usize = 24;

/// Why a secret could not be sealed, opened or a key loaded.
#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    /// The value was sealed under another key than the one configured.
    #[error(
        "the session's secret was encrypted under key {sealed_with}, but the configured secret key \
(WARDEN_SECRET_KEY or WARDEN_SECRET_KEY_FILE) is {current}: start Warden with the key it was created under"
    )]
    WrongKey {
        /// Id of the key that sealed it.
        sealed_with: String,
        /// Id of the configured key.
        current: String,
    },
    /// Same key id but the ciphertext does not authenticate.
    #[error("the session's secret does not decrypt (damaged or tampered with)")]
    Corrupt,
    /// The key file could not be read or written.
    #[error("secret key file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The key file does not hold a key.
    #[error("secret key file {path}: {why}")]
    BadKeyFile {
        /// The file.
        path: PathBuf,
        /// What is wrong (never the content).
        why: String,
    },
    /// The OS random source failed.
    #[error("no randomness for the secret key or a nonce: {0}")]
    Random(String),
}

/// A 256-bit key for sealing secrets; its `Debug` shows only its id.
#[derive(Clone)]
pub struct SecretKey {
    bytes: [u8; KEY_BYTES],
    id: String,
}

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretKey({}, <redacted>)", self.id)
    }
}

impl PartialEq for SecretKey {
    fn eq(&self, other: &SecretKey) -> bool {
        self.id == other.id
    }
}

impl SecretKey {
    /// A key from its bytes.
    pub fn from_bytes(bytes: [u8; KEY_BYTES]) -> SecretKey {
        // The id names the key without revealing it: a domain-separated hash.
        let mut h = Sha256::new();
        h.update(b"warden secret key id\0");
        h.update(bytes);
        let digest = h.finalize();
        let id = format!(
            "k{}",
            digest[..6]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        );
        SecretKey { bytes, id }
    }

    /// Parses a key given as 64 hex digits or base64 (standard or URL-safe,
    /// padded or not) of exactly 32 bytes. The error never shows the value.
    pub fn parse(text: &str) -> Result<SecretKey, String> {
        let text = text.trim();
        let bytes = if text.len() == KEY_BYTES * 2 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
            (0..KEY_BYTES)
                .map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16))
                .collect::<Result<Vec<u8>, _>>()
                .map_err(|_| "not hex".to_string())?
        } else {
            let engines = [
                &base64::engine::general_purpose::STANDARD,
                &base64::engine::general_purpose::STANDARD_NO_PAD,
                &base64::engine::general_purpose::URL_SAFE,
                &base64::engine::general_purpose::URL_SAFE_NO_PAD,
            ];
            engines
                .iter()
                .find_map(|e| e.decode(text).ok())
                .ok_or_else(|| {
                    format!(
                        "a 256-bit key as 64 hex digits or base64 of {KEY_BYTES} bytes (e.g. openssl rand -hex 32)"
                    )
                })?
        };
        let bytes: [u8; KEY_BYTES] = bytes.try_into().map_err(|b: Vec<u8>| {
            format!(
                "a 256-bit key: {KEY_BYTES} bytes as 64 hex digits or base64, got {} bytes (e.g. openssl rand -hex 32)",
                b.len()
            )
        })?;
        Ok(SecretKey::from_bytes(bytes))
    }

    /// A new random key.
    pub fn generate() -> Result<SecretKey, SecretsError> {
        let mut bytes = [0u8; KEY_BYTES];
        getrandom::fill(&mut bytes).map_err(|e| SecretsError::Random(e.to_string()))?;
        Ok(SecretKey::from_bytes(bytes))
    }

    /// The key's public id (stored beside every value it seals).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The key itself as 64 hex digits, for `warden secrets rotate` to hand
    /// a new key to the operator once; never logged.
    pub fn expose_hex(&self) -> String {
        self.hex()
    }

    fn hex(&self) -> String {
        self.bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Reads the keys kept in `path` (one a line, the current one first;
    /// blank lines and `#` comments skipped), or, when there is no file,
    /// generates a key and writes it there readable by the owner only
    /// (0600; the directory is created 0700). Returns the keys, the current
    /// one first, and whether the file was created.
    pub fn load_or_create(path: &Path) -> Result<(Vec<SecretKey>, bool), SecretsError> {
        let io = |source| SecretsError::Io {
            path: path.to_path_buf(),
            source,
        };
        match std::fs::read_to_string(path) {
            Ok(text) => return SecretKey::from_file_text(path, &text).map(|k| (k, false)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            let mut builder = std::fs::DirBuilder::new();
            builder.recursive(true);
            #[cfg(unix)]
            std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
            builder.create(dir).map_err(io)?;
        }
        let key = SecretKey::generate()?;
        // Written whole under a private name, then linked into place: a
        // replica starting beside this one (a shared volume) sees either no
        // file or a complete one, never a half-written key.
        let draft = write_draft(path, std::slice::from_ref(&key))?;
        let published = std::fs::hard_link(&draft, path);
        let _ = std::fs::remove_file(&draft);
        match published {
            Ok(()) => Ok((vec![key], true)),
            // Another process created it first: use theirs.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let text = std::fs::read_to_string(path).map_err(io)?;
                SecretKey::from_file_text(path, &text).map(|k| (k, false))
            }
            Err(e) => Err(io(e)),
        }
    }

    fn from_file_text(path: &Path, text: &str) -> Result<Vec<SecretKey>, SecretsError> {
        let keys = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .enumerate()
            .map(|(i, line)| {
                SecretKey::parse(line).map_err(|why| SecretsError::BadKeyFile {
                    path: path.to_path_buf(),
                    why: format!("key {} of the file: expected {why}", i + 1),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if keys.is_empty() {
            return Err(SecretsError::BadKeyFile {
                path: path.to_path_buf(),
                why: "expected a 256-bit key (64 hex digits or base64) on its first line".into(),
            });
        }
        Ok(keys)
    }

    /// The key check value recorded for this key's id: a fixed text sealed
    /// under it, which only this key opens.
    pub fn check_value(&self) -> Result<Sealed, SecretsError> {
        self.seal(Uuid::nil(), KEY_CHECK_NAME, KEY_CHECK_TEXT)
    }

    /// Whether `check` is this key's check value.
    pub fn opens_check(&self, check: &Sealed) -> bool {
        self.open(Uuid::nil(), KEY_CHECK_NAME, check)
            .is_ok_and(|t| t == KEY_CHECK_TEXT)
    }

    fn cipher(&self) -> XChaCha20Poly1305 {
        XChaCha20Poly1305::new((&self.bytes).into())
    }

    /// Seals `plaintext` as the secret `name` of session `session`. The
    /// session id and name are authenticated with it, so a sealed value
    /// copied onto another session or field does not open.
    pub fn seal(&self, session: Uuid, name: &str, plaintext: &str) -> Result<Sealed, SecretsError> {
        let mut nonce = [0u8; NONCE_BYTES];
        getrandom::fill(&mut nonce).map_err(|e| SecretsError::Random(e.to_string()))?;
        let aad = associated_data(session, name);
        let ciphertext = self
            .cipher()
            .encrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: plaintext.as_bytes(),
                    aad: &aad,
                },
            )
            .map_err(|_| SecretsError::Corrupt)?;
        Ok(Sealed {
            key_id: self.id.clone(),
            nonce: nonce.to_vec(),
            ciphertext,
        })
    }

    /// Opens what [`SecretKey::seal`] sealed for the same session and name.
    pub fn open(&self, session: Uuid, name: &str, sealed: &Sealed) -> Result<String, SecretsError> {
        if sealed.key_id != self.id {
            return Err(SecretsError::WrongKey {
                sealed_with: sealed.key_id.clone(),
                current: self.id.clone(),
            });
        }
        let nonce: [u8; NONCE_BYTES] = sealed
            .nonce
            .as_slice()
            .try_into()
            .map_err(|_| SecretsError::Corrupt)?;
        let aad = associated_data(session, name);
        let plain = self
            .cipher()
            .decrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: &sealed.ciphertext,
                    aad: &aad,
                },
            )
            .map_err(|_| SecretsError::Corrupt)?;
        String::from_utf8(plain).map_err(|_| SecretsError::Corrupt)
    }
}

fn associated_data(session: Uuid, name: &str) -> Vec<u8> {
    let mut aad = Vec::with_capacity(16 + name.len());
    aad.extend_from_slice(session.as_bytes());
    aad.extend_from_slice(name.as_bytes());
    aad
}

/// Writes `keys` (one a line) to a new private file beside `path`, mode
/// 0600, synced; returns its name for the caller to publish.
fn write_draft(path: &Path, keys: &[SecretKey]) -> Result<PathBuf, SecretsError> {
    let io = |source| SecretsError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut tag = [0u8; 8];
    getrandom::fill(&mut tag).map_err(|e| SecretsError::Random(e.to_string()))?;
    let draft = path.with_extension(format!(
        "draft-{}-{}",
        std::process::id(),
        tag.iter().map(|b| format!("{b:02x}")).collect::<String>()
    ));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let text: String = keys.iter().map(|k| format!("{}\n", k.hex())).collect();
    let written = options.open(&draft).and_then(|mut file| {
        file.write_all(text.as_bytes())?;
        file.sync_all()
    });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&draft);
        return Err(io(e));
    }
    Ok(draft)
}

/// Replaces the key file at `path` with `keys` (the current one first) in
/// one rename: a replica reading it meanwhile sees the old file or the new
/// one, whole.
fn replace_key_file(path: &Path, keys: &[SecretKey]) -> Result<(), SecretsError> {
    let draft = write_draft(path, keys)?;
    std::fs::rename(&draft, path).map_err(|source| {
        let _ = std::fs::remove_file(&draft);
        SecretsError::Io {
            path: path.to_path_buf(),
            source,
        }
    })
}

/// `warden secrets rotate` on a key file: a new key becomes the file's
/// first (current) and every key it held stays after it, still opening
/// what it sealed. Returns the new key and the kept ones.
pub fn rotate_key_file(path: &Path) -> Result<(SecretKey, Vec<SecretKey>), SecretsError> {
    let text = std::fs::read_to_string(path).map_err(|source| SecretsError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let kept = SecretKey::from_file_text(path, &text)?;
    let new = SecretKey::generate()?;
    let keys: Vec<SecretKey> = std::iter::once(new.clone()).chain(kept.clone()).collect();
    replace_key_file(path, &keys)?;
    Ok((new, kept))
}

/// `warden secrets retire` on a key file: keeps the current key and the
/// keys whose ids are in `still_sealing` (the database still holds values
/// they sealed), drops the others. Returns the ids dropped.
pub fn retire_from_key_file(
    path: &Path,
    still_sealing: &[String],
) -> Result<Vec<String>, SecretsError> {
    let text = std::fs::read_to_string(path).map_err(|source| SecretsError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let keys = SecretKey::from_file_text(path, &text)?;
    let (kept, dropped): (Vec<_>, Vec<_>) = keys
        .into_iter()
        .enumerate()
        .partition(|(i, k)| *i == 0 || still_sealing.contains(&k.id));
    if !dropped.is_empty() {
        let kept: Vec<SecretKey> = kept.into_iter().map(|(_, k)| k).collect();
        replace_key_file(path, &kept)?;
    }
    Ok(dropped.into_iter().map(|(_, k)| k.id).collect())
}

/// Name the key check value is sealed under (with the nil session).
const KEY_CHECK_NAME: &str = "warden key check";
/// The text a key check value seals.
const KEY_CHECK_TEXT: &str = "warden secret key check v1";

/// A sealed secret as stored: which key, the nonce and the ciphertext.
#[derive(Clone, PartialEq)]
pub struct Sealed {
    /// Id of the key that sealed it.
    pub key_id: String,
    /// Random nonce.
    pub nonce: Vec<u8>,
    /// Ciphertext with its authentication tag.
    pub ciphertext: Vec<u8>,
}

impl std::fmt::Debug for Sealed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Sealed({}, {} bytes)",
            self.key_id,
            self.ciphertext.len()
        )
    }
}

/// The key that seals new secrets, and earlier keys that still open what
/// they sealed (`WARDEN_SECRET_KEY_PREVIOUS`, while a rotation is under way).
#[derive(Clone, Debug)]
pub struct Keyring {
    current: SecretKey,
    previous: Vec<SecretKey>,
}

impl Keyring {
    /// A ring of `current` and `previous` (a previous key equal to the current one is dropped).
    pub fn new(current: SecretKey, previous: Vec<SecretKey>) -> Keyring {
        let mut kept: Vec<SecretKey> = Vec::with_capacity(previous.len());
        for key in previous {
            if key != current && !kept.contains(&key) {
                kept.push(key);
            }
        }
        Keyring {
            current,
            previous: kept,
        }
    }

    /// The key new secrets are sealed with.
    pub fn current(&self) -> &SecretKey {
        &self.current
    }

    /// Ids of the previous keys.
    pub fn previous_ids(&self) -> Vec<String> {
        self.previous.iter().map(|k| k.id.clone()).collect()
    }

    /// Ids of every key in the ring, the current one first.
    pub fn ids(&self) -> Vec<String> {
        std::iter::once(&self.current)
            .chain(&self.previous)
            .map(|k| k.id.clone())
            .collect()
    }

    /// Whether a key of the ring has id `id`.
    pub fn has(&self, id: &str) -> bool {
        std::iter::once(&self.current)
            .chain(&self.previous)
            .any(|k| k.id == id)
    }

    /// Every key of the ring, the current one first.
    pub fn keys(&self) -> impl Iterator<Item = &SecretKey> {
        std::iter::once(&self.current).chain(&self.previous)
    }

    /// Opens a secret sealed by any key of the ring.
    pub fn open(&self, session: Uuid, name: &str, sealed: &Sealed) -> Result<String, SecretsError> {
        let key = std::iter::once(&self.current)
            .chain(&self.previous)
            .find(|k| k.id == sealed.key_id)
            .ok_or_else(|| SecretsError::WrongKey {
                sealed_with: sealed.key_id.clone(),
                current: self.current.id.clone(),
            })?;
        key.open(session, name, sealed)
    }
}

/// What a replica does at start about the database's registered sealing key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyRegistration {
    /// The registered key is this replica's current key.
    Current,
    /// Nothing is registered and nothing is sealed under a foreign key:
    /// register this replica's key (first start on this database).
    Register,
    /// The registered key is one of this replica's previous keys: its
    /// current key takes over, and what the old one sealed is sealed again.
    Rotate {
        /// Id of the key being replaced.
        from: String,
    },
    /// The database needs a key this replica does not have (or has under
    /// the right id but not the right bytes): starting would fail every
    /// session it claims.
    Refuse {
        /// Id of the key the database needs.
        found: String,
        /// Why it is needed.
        why: Needed,
    },
}

/// Why the database needs a key a refused replica lacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needed {
    /// It is the fleet's registered (current) key.
    Registered,
    /// Secrets are still sealed under it (a re-seal has not finished, or
    /// a value under it did not open and was left as it was).
    StillSeals,
    /// The replica has a key of that id that does not open the id's key
    /// check value: a different key, or a damaged check value.
    CheckFails,
}

/// Decides from the registered key id, the ids that still seal secrets
/// and must be opened (`needed`), and the ring keys whose recorded check
/// value they did not open.
pub fn registration(
    registered: Option<&str>,
    needed: &[String],
    failed_checks: &[String],
    ring: &Keyring,
) -> KeyRegistration {
    let refuse = |found: &str, why| KeyRegistration::Refuse {
        found: found.to_string(),
        why,
    };
    if let Some(id) = ring.ids().iter().find(|id| failed_checks.contains(id)) {
        return refuse(id, Needed::CheckFails);
    }
    if let Some(id) = registered.filter(|id| !ring.has(id)) {
        return refuse(id, Needed::Registered);
    }
    if let Some(id) = needed.iter().find(|id| !ring.has(id)) {
        return refuse(id, Needed::StillSeals);
    }
    match registered {
        None => KeyRegistration::Register,
        Some(id) if id == ring.current.id => KeyRegistration::Current,
        Some(id) => KeyRegistration::Rotate {
            from: id.to_string(),
        },
    }
}

/// What a replica does with a claimed session whose secret is sealed under
/// a key it does not have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForeignSeal {
    /// The fleet's registered key sealed it: this replica's key was rotated
    /// away while it ran. Give the lease up for a replica that has the key
    /// (the failure model bounds the attempts).
    HandOver,
    /// No replica is known to have the key: end the session, naming it.
    Fail,
}

/// Decides from the key that sealed the secret and the registered key.
pub fn foreign_seal(sealed_with: &str, registered: Option<&str>) -> ForeignSeal {
    if registered == Some(sealed_with) {
        ForeignSeal::HandOver
    } else {
        ForeignSeal::Fail
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    fn key(byte: u8) -> SecretKey {
        SecretKey::from_bytes([byte; KEY_BYTES])
    }

    #[test]
    fn a_ring_opens_what_any_of_its_keys_sealed_and_seals_with_the_current() {
        let (old, new, stranger) = (key(1), key(2), key(3));
        let session = Uuid::new_v4();
        let by_old = old.seal(session, API_KEY, "sk-old").unwrap();
        let ring = Keyring::new(new.clone(), vec![old.clone(), new.clone(), old.clone()]);
        assert_eq!(ring.current(), &new);
        assert_eq!(
            ring.previous_ids(),
            vec![old.id().to_string()],
            "deduplicated, current dropped"
        );
        assert_eq!(ring.ids(), vec![new.id().to_string(), old.id().to_string()]);
        assert_eq!(ring.open(session, API_KEY, &by_old).unwrap(), "sk-old");
        let by_new = ring.current().seal(session, API_KEY, "sk-new").unwrap();
        assert_eq!(by_new.key_id, new.id());
        assert_eq!(ring.open(session, API_KEY, &by_new).unwrap(), "sk-new");
        let by_stranger = stranger.seal(session, API_KEY, "sk-x").unwrap();
        match ring.open(session, API_KEY, &by_stranger) {
            Err(SecretsError::WrongKey {
                sealed_with,
                current,
            }) => {
                assert_eq!(sealed_with, stranger.id());
                assert_eq!(current, new.id());
            }
            other => panic!("expected WrongKey, got {other:?}"),
        }
        // The key id matches but the value was tampered with.
        let mut tampered = by_old.clone();
        tampered.ciphertext[0] ^= 1;
        assert!(matches!(
            ring.open(session, API_KEY, &tampered),
            Err(SecretsError::Corrupt)
        ));
        assert!(
            !format!("{ring:?}").contains("0101010101"),
            "no key bytes in Debug"
        );
    }

    #[test]
    fn registration_covers_every_case() {
        let (old, new, stranger) = (key(1), key(2), key(3));
        let ring = Keyring::new(new.clone(), vec![old.clone()]);
        let alone = Keyring::new(new.clone(), Vec::new());
        let old_alone = Keyring::new(old.clone(), Vec::new());
        let ids = |keys: &[&SecretKey]| keys.iter().map(|k| k.id().to_string()).collect::<Vec<_>>();
        let refuse = |k: &SecretKey, why| Refuse {
            found: k.id().into(),
            why,
        };
        use KeyRegistration::*;
        #[allow(clippy::type_complexity)]
        let cases: &[(
            Option<&str>,
            Vec<String>,
            Vec<String>,
            &Keyring,
            KeyRegistration,
        )] = &[
            // First start on a fresh database, or one from before the registry.
            (None, vec![], vec![], &ring, Register),
            (None, vec![], vec![], &alone, Register),
            (None, ids(&[&old]), vec![], &ring, Register),
            // Before the registry, a secret sealed under a key nobody here has.
            (
                None,
                ids(&[&stranger]),
                vec![],
                &ring,
                refuse(&stranger, Needed::StillSeals),
            ),
            // Registered: ours, or one we are rotating away from.
            (Some(new.id()), vec![], vec![], &ring, Current),
            (Some(new.id()), ids(&[&new]), vec![], &alone, Current),
            (
                Some(old.id()),
                ids(&[&old]),
                vec![],
                &ring,
                Rotate {
                    from: old.id().into(),
                },
            ),
            // The re-seal is done: the old key may go.
            (Some(new.id()), ids(&[&new]), vec![], &alone, Current),
            // It is not: the old key is still needed, and named.
            (
                Some(new.id()),
                ids(&[&new, &old]),
                vec![],
                &alone,
                refuse(&old, Needed::StillSeals),
            ),
            // A replica started with the old key after the rotation.
            (
                Some(new.id()),
                vec![],
                vec![],
                &old_alone,
                refuse(&new, Needed::Registered),
            ),
            // Another fleet's key, with or without a previous key here.
            (
                Some(stranger.id()),
                vec![],
                vec![],
                &ring,
                refuse(&stranger, Needed::Registered),
            ),
            (
                Some(stranger.id()),
                vec![],
                vec![],
                &alone,
                refuse(&stranger, Needed::Registered),
            ),
            // A key with the right id that does not open its check value,
            // current or previous; it is named before anything else.
            (
                Some(new.id()),
                vec![],
                ids(&[&new]),
                &ring,
                refuse(&new, Needed::CheckFails),
            ),
            (
                Some(stranger.id()),
                vec![],
                ids(&[&old]),
                &ring,
                refuse(&old, Needed::CheckFails),
            ),
            // A failed check of a key not in the ring is not this replica's.
            (Some(new.id()), vec![], ids(&[&stranger]), &alone, Current),
        ];
        for (registered, in_use, failed, ring, expected) in cases {
            assert_eq!(
                &registration(*registered, in_use, failed, ring),
                expected,
                "registered {registered:?}, in use {in_use:?}, failed {failed:?}"
            );
        }
    }

    #[test]
    fn a_check_value_opens_only_under_its_key() {
        let (a, b) = (key(1), key(2));
        let check = a.check_value().unwrap();
        assert!(a.opens_check(&check));
        assert!(!b.opens_check(&check));
        let mut forged = b.check_value().unwrap();
        forged.key_id = a.id().to_string();
        assert!(!a.opens_check(&forged), "another key's value under a's id");
        // Sealed for the nil session: no session's secret is a check value.
        let secret = a.seal(Uuid::nil(), API_KEY, KEY_CHECK_TEXT).unwrap();
        assert!(!a.opens_check(&secret));
    }

    #[test]
    fn rotating_a_key_file_puts_a_new_key_first_and_retiring_drops_unused_ones() {
        let dir = std::env::temp_dir().join(format!("warden-key-{}", Uuid::new_v4()));
        let path = dir.join("secret.key");
        let (first, _) = SecretKey::load_or_create(&path).unwrap();
        let (new, kept) = rotate_key_file(&path).unwrap();
        assert_eq!(kept, first);
        let (keys, created) = SecretKey::load_or_create(&path).unwrap();
        assert!(!created);
        assert_eq!(keys, vec![new.clone(), first[0].clone()]);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let (newer, _) = rotate_key_file(&path).unwrap();
        // The oldest still seals something; the middle one does not.
        let dropped = retire_from_key_file(&path, &[first[0].id().to_string()]).unwrap();
        assert_eq!(dropped, vec![new.id().to_string()]);
        let (keys, _) = SecretKey::load_or_create(&path).unwrap();
        assert_eq!(keys, vec![newer.clone(), first[0].clone()]);
        // The current key stays whatever the database says.
        let dropped = retire_from_key_file(&path, &[]).unwrap();
        assert_eq!(dropped, vec![first[0].id().to_string()]);
        assert_eq!(SecretKey::load_or_create(&path).unwrap().0, vec![newer]);
        // Comments and blank lines are skipped; a bad line is named by number.
        std::fs::write(&path, format!("# current\n{HEX}\n\nnot a key\n")).unwrap();
        let err = SecretKey::load_or_create(&path).unwrap_err().to_string();
        assert!(err.contains("key 2") && !err.contains("not a key"), "{err}");
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "no drafts left"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_foreign_seal_is_handed_over_only_when_the_fleet_has_its_key() {
        assert_eq!(foreign_seal("k2", Some("k2")), ForeignSeal::HandOver);
        assert_eq!(foreign_seal("k2", Some("k1")), ForeignSeal::Fail);
        assert_eq!(foreign_seal("k2", None), ForeignSeal::Fail);
    }

    #[test]
    fn keys_parse_from_hex_or_base64_of_32_bytes_only() {
        let hex = SecretKey::parse(HEX).unwrap();
        let bytes: Vec<u8> = (0u8..32).collect();
        for engine in [
            &base64::engine::general_purpose::STANDARD,
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
        ] {
            let b64 = SecretKey::parse(&engine.encode(&bytes)).unwrap();
            assert_eq!(b64, hex);
        }
        for bad in [
            "",
            "00",
            &HEX[..62],
            &format!("{HEX}00"),
            "not a key at all!",
            &base64::engine::general_purpose::STANDARD.encode([1u8; 16]),
        ] {
            let err = SecretKey::parse(bad).unwrap_err();
            assert!(err.contains("256-bit"), "{bad}: {err}");
            assert!(
                bad.is_empty() || !err.contains(bad),
                "the value is not echoed"
            );
        }
        let debug = format!("{hex:?}");
        assert!(!debug.contains("0001020304") && debug.contains(hex.id()));
    }

    #[test]
    fn sealed_values_open_only_with_their_key_session_and_name() {
        let key = SecretKey::parse(HEX).unwrap();
        let other = SecretKey::generate().unwrap();
        let session = Uuid::new_v4();
        let sealed = key.seal(session, "api_key", "sk-plain-123").unwrap();
        assert!(!sealed.ciphertext.windows(12).any(|w| w == b"sk-plain-123"));
        assert_eq!(sealed.key_id, key.id());
        assert_eq!(
            key.open(session, "api_key", &sealed).unwrap(),
            "sk-plain-123"
        );
        // Two seals of the same value differ (random nonce).
        assert_ne!(
            key.seal(session, "api_key", "sk-plain-123").unwrap(),
            sealed
        );
        assert!(matches!(
            other.open(session, "api_key", &sealed),
            Err(SecretsError::WrongKey { .. })
        ));
        assert!(matches!(
            key.open(Uuid::new_v4(), "api_key", &sealed),
            Err(SecretsError::Corrupt)
        ));
        assert!(matches!(
            key.open(session, "other", &sealed),
            Err(SecretsError::Corrupt)
        ));
        let mut tampered = sealed.clone();
        tampered.ciphertext[0] ^= 1;
        assert!(matches!(
            key.open(session, "api_key", &tampered),
            Err(SecretsError::Corrupt)
        ));
        assert!(!format!("{sealed:?}").contains("sk-plain"));
    }

    #[test]
    fn a_key_file_is_created_once_owner_only_and_reused() {
        let dir = std::env::temp_dir().join(format!("warden-key-{}", Uuid::new_v4()));
        let path = dir.join("nested").join("secret.key");
        let (first, created) = SecretKey::load_or_create(&path).unwrap();
        assert!(created);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let (again, created) = SecretKey::load_or_create(&path).unwrap();
        assert!(!created);
        assert_eq!(again, first);
        assert_eq!(first.len(), 1);
        std::fs::write(&path, "garbage").unwrap();
        let err = SecretKey::load_or_create(&path).unwrap_err().to_string();
        assert!(
            err.contains("secret.key") && !err.contains("garbage"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn replicas_starting_together_agree_on_one_complete_key() {
        let dir = std::env::temp_dir().join(format!("warden-key-{}", Uuid::new_v4()));
        let path = dir.join("secret.key");
        let keys: Vec<_> = std::thread::scope(|scope| {
            let starts: Vec<_> = (0..8)
                .map(|_| scope.spawn(|| SecretKey::load_or_create(&path)))
                .collect();
            starts
                .into_iter()
                .map(|s| s.join().expect("joined").expect("a key"))
                .collect()
        });
        assert_eq!(keys.iter().filter(|(_, created)| *created).count(), 1);
        assert!(keys.iter().all(|(k, _)| *k == keys[0].0));
        // No drafts are left beside the key.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        let _ = std::fs::remove_dir_all(dir);
    }
}
