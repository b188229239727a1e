//! The broker's side of authenticating the connections it opens itself: to its name servers,
//! its controllers and its master (docs/acl.md, "Name servers and broker-to-broker traffic").
//!
//! Owns: the broker's account (from `access_key`/`secret_key`), the `AuthRequest` that answers
//! a server's handshake challenge, and the check of the server's answer. Never: sockets; each
//! caller sends the frame over its own connection (glommio or blocking) and hands the answer
//! back here.
//!
//! A server that enforces access control puts an `auth_nonce` in its handshake answer; a broker
//! with an account answers it right after the handshake, and a refusal is an error naming the
//! server and the account, so that the connection attempt fails like any other. A broker
//! without an account goes on anonymously: the server then refuses its requests unless its
//! address is trusted.

use shardmq_acl::{Credentials, Nonce, Proof};
use shardmq_schema::{wire, FrameHeader};
use tracing::warn;

use crate::config::BrokerConfig;

/// The broker's own account, when `access_key` and `secret_key` are set (the configuration
/// checks they come together). Keys that are not valid credentials are logged and ignored.
#[must_use]
pub fn credentials(config: &BrokerConfig) -> Option<Credentials> {
    let (access_key, secret_key) = (config.access_key.as_ref()?, config.secret_key.as_ref()?);
    match Credentials::new(access_key.as_str(), secret_key.as_str()) {
        Ok(credentials) => Some(credentials),
        Err(error) => {
            warn!(%error, "the broker's access_key/secret_key are not usable; connecting without an account");
            None
        }
    }
}

/// The broker's answer to a server's challenge.
pub struct Answer {
    access_key: String,
    client_nonce: Nonce,
    proof: Proof,
}

impl Answer {
    /// Whose account the answer proves.
    #[must_use]
    pub fn access_key(&self) -> &str {
        &self.access_key
    }

    /// The `AuthRequest` frame carrying the answer.
    pub fn build<'b>(
        &self,
        builder: &mut flatbuffers::FlatBufferBuilder<'b>,
        header: &FrameHeader<'_>,
    ) -> flatbuffers::WIPOffset<wire::Frame<'b>> {
        shardmq_schema::build_auth_request(
            builder,
            header,
            &self.access_key,
            &self.client_nonce,
            &self.proof,
        )
    }
}

/// The answer to `handshake` (the server's `HandshakeResponse` frame): `None` when the server
/// did not challenge or the broker has no account; an error when the challenge is malformed.
pub fn answer(
    credentials: Option<&Credentials>,
    handshake: &wire::Frame<'_>,
    server: &str,
) -> Result<Option<Answer>, String> {
    let nonce = handshake
        .body_as_handshake_response()
        .and_then(|response| response.auth_nonce());
    let Some(nonce) = nonce else {
        return Ok(None);
    };
    let Some(credentials) = credentials else {
        warn!(%server, "{server} enforces access control and this broker has no account (access_key/secret_key): its requests go anonymous");
        return Ok(None);
    };
    let (client_nonce, proof) = credentials
        .answer(nonce.bytes())
        .map_err(|error| format!("{server}: {error}"))?;
    Ok(Some(Answer {
        access_key: credentials.access_key().to_owned(),
        client_nonce,
        proof,
    }))
}

/// Checks the server's answer to an `AuthRequest`: `Ok` for an `AuthResponse`, else an error
/// (also logged) naming the server and the account.
pub fn accepted(answer: &wire::Frame<'_>, server: &str, access_key: &str) -> Result<(), String> {
    if answer.status() == wire::Status::OK && answer.body_as_auth_response().is_some() {
        return Ok(());
    }
    let refusal = format!(
        "{server} refused this broker's account {access_key:?} ({:?}): {}",
        answer.status(),
        answer.message().unwrap_or_default()
    );
    warn!("{refusal}");
    Err(refusal)
}
