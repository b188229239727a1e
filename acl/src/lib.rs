//! Access control for ShardMQ, RocketMQ's ACL 1.0 model as a library: who may do what, from
//! where, and how a client proves who it is.
//!
//! This crate decides; it never listens, never reads a request frame and never logs. The
//! broker (native and remoting listeners, its own outbound links), the name server, the client
//! and the CLI call it (`docs/acl.md`). Data enters as an accounts file (ShardMQ's `acl.toml` or RocketMQ's
//! `plain_acl.yml`), as a remote address plus an access key plus what a request needs, and as
//! signatures or proofs; it leaves as `Ok` or a [`Denied`] whose text can go to the client.
//!
//! - [`config`]: the two file shapes, validated into one [`Acl`] ([`Acl::load`]);
//! - [`model`]: accounts and [`Acl::authorize`]`(access_key, remote, &[Need])`;
//! - [`perm`]: `DENY`, `PUB`, `SUB`, `PUB|SUB` and what they allow;
//! - [`address`]: RocketMQ's address patterns (`*`, `192.168.0.*`, `192.168.1.1-5`,
//!   `192.168.1.{1,2}`, comma lists, IPv6);
//! - [`signature`]: RocketMQ's per-request HMAC-SHA1 signature ([`rocketmq_signature`]);
//! - [`proof`]: ShardMQ's challenge-response ([`challenge`], [`client_proof`],
//!   [`Acl::verify_proof`]);
//! - [`store`]: the current model of a file, reloaded when it changes ([`AclStore`]).
//!
//! A ShardMQ `acl.toml`:
//!
//! ```toml
//! # Requests from these addresses pass without credentials
//! # (RocketMQ's globalWhiteRemoteAddresses).
//! trusted_addresses = ["127.0.0.1"]
//!
//! [[accounts]]
//! access_key = "orders-app"
//! secret_key = "orders-secret"
//! admin = false
//! default_topic_perm = "DENY"          # DENY (the default), PUB, SUB or PUB|SUB
//! default_group_perm = "SUB"
//! topic_perms = { orders = "PUB|SUB", audit = "PUB" }
//! group_perms = { billing = "SUB" }
//! trusted_addresses = ["192.168.0.*"]  # pass without checks (RocketMQ's whiteRemoteAddress)
//! allowed_addresses = ["10.0.*"]       # ShardMQ only: refuse every other address
//! ```
//!
//! ```
//! use shardmq_acl::{Acl, Action, Need};
//! let acl = Acl::from_toml_str(r#"
//!     [[accounts]]
//!     access_key = "orders-app"
//!     secret_key = "orders-secret"
//!     topic_perms = { orders = "PUB" }
//! "#).unwrap();
//! let remote = "10.0.0.7".parse().unwrap();
//! assert!(acl.authorize(Some("orders-app"), remote, &[Need::Topic("orders", Action::Pub)]).is_ok());
//! let refused = acl.authorize(Some("orders-app"), remote, &[Need::Topic("orders", Action::Sub)]);
//! assert_eq!(
//!     refused.unwrap_err().to_string(),
//!     r#"account "orders-app" lacks SUB on topic "orders" (it holds PUB)"#
//! );
//! ```

pub mod address;
pub mod config;
pub mod credentials;
pub mod model;
pub mod perm;
pub mod proof;
pub mod signature;
pub mod store;

#[cfg(test)]
mod tests;

pub use address::{AddressPattern, BadPattern};
pub use config::{AclError, AclFormat};
pub use credentials::{
    BadChallenge, Credentials, CredentialsError, ACCESS_KEY_ENV, SECRET_KEY_ENV,
};
pub use model::{Account, Acl, Denied, Need, Resource, RETRY_TOPIC_PREFIX, TRACE_TOPIC};
pub use perm::{Action, Perm};
pub use proof::{challenge, client_proof, Nonce, Proof, NONCE_BYTES, PROOF_BYTES};
pub use signature::{rocketmq_signature, rocketmq_signature_matches};
pub use store::AclStore;
