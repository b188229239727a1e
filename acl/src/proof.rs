//! ShardMQ's challenge-response: a connection proves it holds an account's secret without
//! sending it.
//!
//! Owns the nonce and the proof computation; the handshake frames that carry them belong to
//! the protocol crates. The server sends [`challenge`]'s 32 random bytes; the client answers
//! its access key, a nonce of its own and [`client_proof`] =
//! `HMAC-SHA256(secret, server_nonce ‖ access_key ‖ client_nonce)`; the server checks the
//! answer with [`Acl::verify_proof`], in constant time. The access key sits between two
//! fixed-length nonces, so the concatenation is unambiguous. The client's nonce makes the
//! proof depend on both sides' randomness, so neither side alone chooses what is signed.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::model::{Account, Acl, Denied};

/// Bytes in a nonce.
pub const NONCE_BYTES: usize = 32;
/// Bytes in a proof (an HMAC-SHA256 tag).
pub const PROOF_BYTES: usize = 32;

pub type Nonce = [u8; NONCE_BYTES];
pub type Proof = [u8; PROOF_BYTES];

type HmacSha256 = Hmac<Sha256>;

/// A fresh random nonce from the operating system. Fails only when the OS has no randomness
/// to give, which a server must treat as fatal for the handshake.
pub fn challenge() -> Result<Nonce, getrandom::Error> {
    let mut nonce = [0u8; NONCE_BYTES];
    getrandom::fill(&mut nonce)?;
    Ok(nonce)
}

/// The client's answer to `server_nonce`.
pub fn client_proof(
    secret: &str,
    server_nonce: &Nonce,
    access_key: &str,
    client_nonce: &Nonce,
) -> Proof {
    proof_mac(secret, server_nonce, access_key, client_nonce)
        .finalize()
        .into_bytes()
        .into()
}

fn proof_mac(
    secret: &str,
    server_nonce: &Nonce,
    access_key: &str,
    client_nonce: &Nonce,
) -> HmacSha256 {
    let mut mac =
        HmacSha256::new_from_slice(secret.as_bytes()).expect("HMAC takes a key of any length");
    mac.update(server_nonce);
    mac.update(access_key.as_bytes());
    mac.update(client_nonce);
    mac
}

impl Acl {
    /// Checks a client's answer to `server_nonce`. An unknown access key is refused before
    /// any HMAC is computed; access keys are not secret, so that timing difference tells an
    /// attacker nothing the refusal's text does not.
    pub fn verify_proof(
        &self,
        server_nonce: &Nonce,
        access_key: &str,
        client_nonce: &Nonce,
        proof: &[u8],
    ) -> Result<&Account, Denied> {
        let account = self
            .account(access_key)
            .ok_or_else(|| Denied::UnknownAccount {
                access_key: access_key.to_owned(),
            })?;
        proof_mac(account.secret_key(), server_nonce, access_key, client_nonce)
            .verify_slice(proof)
            .map(|()| account)
            .map_err(|_| Denied::BadProof {
                access_key: access_key.to_owned(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_sha256_matches_rfc_4231_case_2() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?". Split so the
        // data is server nonce ‖ access key ‖ client nonce is not possible with 32-byte
        // nonces, so check the primitive directly.
        let mut mac = HmacSha256::new_from_slice(b"Jefe").unwrap();
        mac.update(b"what do ya want for nothing?");
        let tag: [u8; 32] = mac.finalize().into_bytes().into();
        let hex: String = tag.iter().map(|byte| format!("{byte:02x}")).collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn proof_is_hmac_over_the_three_parts_in_order() {
        let server = [1u8; 32];
        let client = [2u8; 32];
        let mut mac = HmacSha256::new_from_slice(b"secret-key").unwrap();
        let mut message = Vec::new();
        message.extend_from_slice(&server);
        message.extend_from_slice(b"access-key");
        message.extend_from_slice(&client);
        mac.update(&message);
        let expected: [u8; 32] = mac.finalize().into_bytes().into();
        assert_eq!(
            client_proof("secret-key", &server, "access-key", &client),
            expected
        );
    }

    #[test]
    fn challenges_differ() {
        let first = challenge().unwrap();
        let second = challenge().unwrap();
        assert_ne!(first, second);
        assert_ne!(first, [0u8; 32]);
    }
}
