//! RocketMQ's per-request signature (ACL 1.0), for the remoting listener and a remoting
//! client.
//!
//! Owns the signing rule and nothing else: no accounts beyond looking one up in
//! [`Acl::verify_rocketmq_request`], no request decoding. A request's ext fields and body
//! enter; a Base64 signature or a verdict leaves. Nothing is allocated per request on the
//! verifying side.
//!
//! The rule, from RocketMQ 4.9.x `AclClientRPCHook.doBeforeRequest` and
//! `AclUtils.combineRequestContent`, and rocketmq-auth 1.0.0's `AclClientRpcHook`:
//! `Signature = Base64(HmacSHA1(secretKey, v1 ‖ v2 ‖ … ‖ body))`, where `v1, v2, …` are the
//! UTF-8 values of every ext field (the client adds `AccessKey`, and `SecurityToken` when it
//! has one, before signing) in ascending key order, leaving out `Signature`; keys themselves
//! are not signed and an absent body adds nothing. Java sorts keys in a `TreeMap` (UTF-16
//! order), the Rust client in a `BTreeMap` (byte order); the two agree for every key below
//! U+E000, which covers every field RocketMQ defines. Java never holds a null value (headers
//! skip null fields in `makeCustomHeaderToNet`). The broker's check
//! (`PlainAccessValidator.parse`) also leaves out `_UNIQUE_KEY_QUERY`, so verification does
//! too.

use std::collections::BTreeMap;

use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use sha1::Sha1;

use crate::model::{Account, Acl, Denied};

/// The ext field holding the access key.
pub const ACCESS_KEY_FIELD: &str = "AccessKey";
/// The ext field holding the signature.
pub const SIGNATURE_FIELD: &str = "Signature";
/// The ext field holding an optional security token (signed like any other field).
pub const SECURITY_TOKEN_FIELD: &str = "SecurityToken";
/// The ext field the broker leaves out of the signed content (`MixAll.UNIQUE_MSG_QUERY_FLAG`).
pub const UNIQUE_KEY_QUERY_FIELD: &str = "_UNIQUE_KEY_QUERY";

type HmacSha1 = Hmac<Sha1>;

/// The signature a RocketMQ client attaches: over every field but `Signature`, then the body.
pub fn rocketmq_signature(
    secret: &str,
    ext_fields: &BTreeMap<String, String>,
    body: &[u8],
) -> String {
    let mac = signed_content(secret, ext_fields, body, &[SIGNATURE_FIELD]);
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

/// Whether `ext_fields["Signature"]` is the broker's expected signature for this request,
/// compared in constant time.
pub fn rocketmq_signature_matches(
    secret: &str,
    ext_fields: &BTreeMap<String, String>,
    body: &[u8],
) -> bool {
    let Some(claimed) = ext_fields.get(SIGNATURE_FIELD) else {
        return false;
    };
    // A SHA-1 tag is 20 bytes; its Base64 is 28 characters.
    let mut claimed_tag = [0u8; 20];
    match base64::engine::general_purpose::STANDARD.decode_slice(claimed, &mut claimed_tag) {
        Ok(20) => {}
        _ => return false,
    }
    signed_content(
        secret,
        ext_fields,
        body,
        &[SIGNATURE_FIELD, UNIQUE_KEY_QUERY_FIELD],
    )
    .verify_slice(&claimed_tag)
    .is_ok()
}

fn signed_content(
    secret: &str,
    ext_fields: &BTreeMap<String, String>,
    body: &[u8],
    left_out: &[&str],
) -> HmacSha1 {
    let mut mac =
        HmacSha1::new_from_slice(secret.as_bytes()).expect("HMAC takes a key of any length");
    for (key, value) in ext_fields {
        if !left_out.contains(&key.as_str()) {
            mac.update(value.as_bytes());
        }
    }
    mac.update(body);
    mac
}

impl Acl {
    /// Authenticates a remoting request: its `AccessKey` must name an account and its
    /// `Signature` must match that account's secret. Callers skip this when
    /// [`Acl::is_trusted`] holds, as RocketMQ does.
    pub fn verify_rocketmq_request(
        &self,
        ext_fields: &BTreeMap<String, String>,
        body: &[u8],
    ) -> Result<&Account, Denied> {
        let access_key = ext_fields
            .get(ACCESS_KEY_FIELD)
            .ok_or(Denied::NoAccessKey)?;
        let account = self
            .account(access_key)
            .ok_or_else(|| Denied::UnknownAccount {
                access_key: access_key.clone(),
            })?;
        if rocketmq_signature_matches(account.secret_key(), ext_fields, body) {
            Ok(account)
        } else {
            Err(Denied::BadSignature {
                access_key: access_key.clone(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect()
    }

    // Every expected value below was computed once, outside this crate, with OpenSSL:
    //   printf '<content>' | openssl dgst -sha1 -hmac '<secret>' -binary | base64

    #[test]
    fn rocketmq_signer_test_vector() {
        // AclSignerTest.calSignatureTest signs "RocketMQ" with "12345678".
        let signed = fields(&[("k", "RocketMQ")]);
        assert_eq!(
            rocketmq_signature("12345678", &signed, b""),
            "IUc8rrO/0gDch8CjObLQsW2rsiA="
        );
    }

    #[test]
    fn values_in_key_order_without_keys_then_body() {
        // rocketmq-auth 1.0.0's runtime tests sign "alicetopic-a" for a send by "alice" to
        // "topic-a": "AccessKey" sorts before "topic", and the keys are not signed.
        let mut request = fields(&[("topic", "topic-a"), ("AccessKey", "alice")]);
        let signature = rocketmq_signature("secret", &request, b"");
        assert_eq!(signature, "3yomro7y0WqWcbV+9tQa4av5w3Q=");
        request.insert(SIGNATURE_FIELD.into(), signature);
        // The Signature field itself is not signed.
        assert_eq!(
            rocketmq_signature("secret", &request, b""),
            "3yomro7y0WqWcbV+9tQa4av5w3Q="
        );
        assert!(rocketmq_signature_matches("secret", &request, b""));

        // Content "ak12345" "topicA" then the body bytes 00 01 "body".
        let request = fields(&[("AccessKey", "ak12345"), ("b", "topicA")]);
        assert_eq!(
            rocketmq_signature("secretKey12", &request, b"\x00\x01body"),
            "hczHnirXrpXDbCTc0CqYMgWaw68="
        );
    }

    #[test]
    fn verification_refuses_any_change() {
        let mut request = fields(&[("AccessKey", "alice"), ("topic", "topic-a")]);
        request.insert(
            SIGNATURE_FIELD.into(),
            rocketmq_signature("secret", &request, b"body"),
        );
        assert!(rocketmq_signature_matches("secret", &request, b"body"));
        assert!(!rocketmq_signature_matches("secret", &request, b"bodY"));
        assert!(!rocketmq_signature_matches("secreT", &request, b"body"));
        let mut changed = request.clone();
        changed.insert("topic".into(), "topic-b".into());
        assert!(!rocketmq_signature_matches("secret", &changed, b"body"));
        let mut added = request.clone();
        added.insert("queueId".into(), "1".into());
        assert!(!rocketmq_signature_matches("secret", &added, b"body"));
        // The broker leaves _UNIQUE_KEY_QUERY out.
        let mut flagged = request.clone();
        flagged.insert(UNIQUE_KEY_QUERY_FIELD.into(), "true".into());
        assert!(rocketmq_signature_matches("secret", &flagged, b"body"));
        for garbage in ["", "not base64!", "3yomro7y0WqWcbV+9tQa4av5w3Q", "AAAA"] {
            let mut bad = request.clone();
            bad.insert(SIGNATURE_FIELD.into(), garbage.into());
            assert!(
                !rocketmq_signature_matches("secret", &bad, b"body"),
                "{garbage:?}"
            );
        }
        request.remove(SIGNATURE_FIELD);
        assert!(!rocketmq_signature_matches("secret", &request, b"body"));
    }
}
