//! A client's side of authentication: the account it speaks as, and its answer to a server's
//! challenge.
//!
//! Owns where credentials come from (options, the environment, a file) and the proof built
//! from them; the frames that carry the proof belong to the protocol crates. The secret never
//! leaves this type: `Debug` shows the access key only.

use std::fmt;
use std::path::Path;

use crate::proof::{challenge, client_proof, Nonce, Proof, NONCE_BYTES};

/// The environment variable holding the access key.
pub const ACCESS_KEY_ENV: &str = "SHARDMQ_ACCESS_KEY";
/// The environment variable holding the secret key.
pub const SECRET_KEY_ENV: &str = "SHARDMQ_SECRET_KEY";

/// An account's access key and secret key.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    access_key: String,
    secret_key: String,
}

/// Why credentials could not be had.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("{0}")]
    Invalid(String),
    #[error("cannot read the credentials file {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

/// A server's challenge that is not [`NONCE_BYTES`] long.
#[derive(Debug, thiserror::Error)]
#[error("the server's auth_nonce is {0} bytes, not {NONCE_BYTES}")]
pub struct BadChallenge(pub usize);

impl Credentials {
    /// Both keys must be non-empty and free of control characters.
    pub fn new(
        access_key: impl Into<String>,
        secret_key: impl Into<String>,
    ) -> Result<Credentials, CredentialsError> {
        let access_key = access_key.into();
        let secret_key = secret_key.into();
        for (what, value) in [("access key", &access_key), ("secret key", &secret_key)] {
            if value.is_empty() {
                return Err(CredentialsError::Invalid(format!("the {what} is empty")));
            }
            if value.len() > 256 {
                return Err(CredentialsError::Invalid(format!(
                    "the {what} is {} bytes, over 256",
                    value.len()
                )));
            }
            if value.chars().any(char::is_control) {
                return Err(CredentialsError::Invalid(format!(
                    "the {what} contains a control character"
                )));
            }
        }
        Ok(Credentials {
            access_key,
            secret_key,
        })
    }

    /// From [`ACCESS_KEY_ENV`] and [`SECRET_KEY_ENV`]: `Ok(None)` when neither is set, an
    /// error when only one is.
    pub fn from_env() -> Result<Option<Credentials>, CredentialsError> {
        let access_key = std::env::var(ACCESS_KEY_ENV).ok().filter(|v| !v.is_empty());
        let secret_key = std::env::var(SECRET_KEY_ENV).ok().filter(|v| !v.is_empty());
        match (access_key, secret_key) {
            (None, None) => Ok(None),
            (Some(access_key), Some(secret_key)) => {
                Credentials::new(access_key, secret_key).map(Some)
            }
            _ => Err(CredentialsError::Invalid(format!(
                "{ACCESS_KEY_ENV} and {SECRET_KEY_ENV} go together: set both or neither"
            ))),
        }
    }

    /// From a file of two `key = "value"` lines, `access_key` and `secret_key` (TOML).
    pub fn from_file(path: &Path) -> Result<Credentials, CredentialsError> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct File {
            access_key: String,
            secret_key: String,
        }
        let text = std::fs::read_to_string(path).map_err(|source| CredentialsError::Io {
            path: path.display().to_string(),
            source,
        })?;
        let file: File = toml::from_str(&text).map_err(|error| {
            CredentialsError::Invalid(format!(
                "the credentials file {} is not `access_key = \"…\"` and `secret_key = \"…\"`: {}",
                path.display(),
                error.message()
            ))
        })?;
        Credentials::new(file.access_key, file.secret_key)
    }

    pub fn access_key(&self) -> &str {
        &self.access_key
    }

    /// The answer to a server's `auth_nonce`: a fresh client nonce and the proof over both.
    pub fn answer(&self, server_nonce: &[u8]) -> Result<(Nonce, Proof), BadChallenge> {
        let server_nonce: &Nonce = server_nonce
            .try_into()
            .map_err(|_| BadChallenge(server_nonce.len()))?;
        // The OS having no randomness is not worth a recoverable error here: the client
        // nonce only spreads what is signed; a zero nonce still proves the secret.
        let client_nonce = challenge().unwrap_or([0u8; NONCE_BYTES]);
        let proof = client_proof(
            &self.secret_key,
            server_nonce,
            &self.access_key,
            &client_nonce,
        );
        Ok((client_nonce, proof))
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key", &self.access_key)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Acl;

    #[test]
    fn an_answer_verifies_against_the_account() {
        let acl = Acl::from_toml_str(
            r#"
            [[accounts]]
            access_key = "orders-app"
            secret_key = "orders-secret"
            "#,
        )
        .unwrap();
        let server_nonce = challenge().unwrap();
        let good = Credentials::new("orders-app", "orders-secret").unwrap();
        let (client_nonce, proof) = good.answer(&server_nonce).unwrap();
        assert!(acl
            .verify_proof(&server_nonce, "orders-app", &client_nonce, &proof)
            .is_ok());
        let bad = Credentials::new("orders-app", "not-the-secret").unwrap();
        let (client_nonce, proof) = bad.answer(&server_nonce).unwrap();
        assert!(acl
            .verify_proof(&server_nonce, "orders-app", &client_nonce, &proof)
            .is_err());
        assert!(good.answer(&[1, 2, 3]).is_err());
    }

    #[test]
    fn debug_leaves_the_secret_out() {
        let credentials = Credentials::new("orders-app", "orders-secret").unwrap();
        let text = format!("{credentials:?}");
        assert!(text.contains("orders-app"));
        assert!(!text.contains("orders-secret"));
    }

    #[test]
    fn bad_keys_and_files_are_refused_clearly() {
        assert!(Credentials::new("", "x").is_err());
        assert!(Credentials::new("a\nb", "x").is_err());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("credentials.toml");
        std::fs::write(&path, "access_key = \"a-key\"\nsecret_key = \"a-secret\"\n").unwrap();
        let read = Credentials::from_file(&path).unwrap();
        assert_eq!(read, Credentials::new("a-key", "a-secret").unwrap());
        std::fs::write(&path, "access_key = \"a-key\"\n").unwrap();
        let error = Credentials::from_file(&path).unwrap_err().to_string();
        assert!(error.contains("secret_key"), "{error}");
    }
}
