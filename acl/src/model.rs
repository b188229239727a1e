//! The access-control model: accounts, what each holds, and the decision for one request.
//!
//! Owns [`Acl`] (the whole file, loaded), [`Account`], the needs a request states ([`Need`])
//! and the refusal ([`Denied`]). Built only by the loaders in `config` (so every model here has
//! passed validation) and read-only afterwards; never reads files or sockets. Requests enter
//! through [`Acl::authorize`] with the remote address and the access key the caller has
//! already authenticated (`signature`, `proof`); the answer leaves as `Ok` or a [`Denied`]
//! whose text can go to the client as is.
//!
//! The decision is RocketMQ's `PlainPermissionManager.validate` + `checkPerm` (4.9.x):
//! 1. a remote address on the global trusted list passes, with or without an account;
//! 2. otherwise the access key must name an account;
//! 3. (ShardMQ only) an account with `allowed_addresses` refuses every other address;
//! 4. an address on the account's trusted list passes;
//! 5. each need is checked: `Admin` needs the admin flag; a resource need is met by the
//!    account's permission for that topic or group, or by its default when there is none.
//!    A retry topic `%RETRY%g` is group `g` needing SUB; `RMQ_SYS_TRACE_TOPIC` needing PUB is
//!    always met; an admin account with no per-topic and no per-group entry meets every
//!    resource need (all three as in RocketMQ).

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;

use crate::address::AddressPattern;
use crate::perm::{Action, Perm};

/// RocketMQ's prefix of a consumer group's retry topic (`MixAll.RETRY_GROUP_TOPIC_PREFIX`).
pub const RETRY_TOPIC_PREFIX: &str = "%RETRY%";
/// RocketMQ's message-trace topic, which anyone may publish to (`TopicValidator`).
pub const TRACE_TOPIC: &str = "RMQ_SYS_TRACE_TOPIC";

/// The loaded file: trusted addresses and accounts by access key.
#[derive(Debug, Clone, Default)]
pub struct Acl {
    pub(crate) trusted_addresses: Vec<AddressPattern>,
    pub(crate) accounts: HashMap<String, Account>,
}

/// One account. `Debug` leaves the secret out.
#[derive(Clone)]
pub struct Account {
    pub(crate) access_key: String,
    pub(crate) secret_key: String,
    pub(crate) is_admin: bool,
    pub(crate) default_topic_perm: Perm,
    pub(crate) default_group_perm: Perm,
    pub(crate) topic_perms: HashMap<String, Perm>,
    pub(crate) group_perms: HashMap<String, Perm>,
    pub(crate) trusted_addresses: Vec<AddressPattern>,
    pub(crate) allowed_addresses: Option<Vec<AddressPattern>>,
}

/// One thing a request needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need<'a> {
    Topic(&'a str, Action),
    Group(&'a str, Action),
    /// The admin flag (RocketMQ: create/update/delete topic, broker config, subscription
    /// groups; ShardMQ's admin calls).
    Admin,
}

/// A topic or a group, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resource {
    Topic(String),
    Group(String),
}

/// Why a request is refused. The text names the account, the resource and what is missing,
/// and never the secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    #[error("no access key given, and {remote} is not a trusted address")]
    NoCredentials { remote: IpAddr },
    #[error("the request carries no access key")]
    NoAccessKey,
    #[error("no account has access key {access_key:?}")]
    UnknownAccount { access_key: String },
    #[error("account {access_key:?} may not connect from {remote}")]
    AddressNotAllowed { access_key: String, remote: IpAddr },
    #[error("account {access_key:?} is not an admin, and the request needs the admin flag")]
    NotAdmin { access_key: String },
    #[error("account {access_key:?} lacks {needed} on {resource} (it holds {held})")]
    MissingPermission {
        access_key: String,
        resource: Resource,
        needed: Action,
        held: Perm,
    },
    #[error("account {access_key:?}: the request signature does not match")]
    BadSignature { access_key: String },
    #[error("account {access_key:?}: the proof of the secret does not match")]
    BadProof { access_key: String },
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Resource::Topic(name) => write!(f, "topic {name:?}"),
            Resource::Group(name) => write!(f, "group {name:?}"),
        }
    }
}

impl Acl {
    pub fn account(&self, access_key: &str) -> Option<&Account> {
        self.accounts.get(access_key)
    }

    pub fn accounts(&self) -> impl Iterator<Item = &Account> {
        self.accounts.values()
    }

    pub fn trusted_addresses(&self) -> &[AddressPattern] {
        &self.trusted_addresses
    }

    /// Whether a request from `remote` with this access key passes without credentials being
    /// checked (steps 1, 3 and 4 above). RocketMQ checks no signature for such a request;
    /// callers skip the signature or proof check when this is true.
    pub fn is_trusted(&self, access_key: Option<&str>, remote: IpAddr) -> bool {
        if self.is_globally_trusted(remote) {
            return true;
        }
        let Some(account) = access_key.and_then(|key| self.account(key)) else {
            return false;
        };
        account.is_address_allowed(remote) && account.is_address_trusted(remote)
    }

    /// The decision for one request (steps 1 to 5 above). `access_key` must already be
    /// authenticated unless [`Acl::is_trusted`] said it need not be.
    pub fn authorize(
        &self,
        access_key: Option<&str>,
        remote: IpAddr,
        needs: &[Need<'_>],
    ) -> Result<(), Denied> {
        if self.is_globally_trusted(remote) {
            return Ok(());
        }
        let access_key = access_key.ok_or(Denied::NoCredentials { remote })?;
        let account = self
            .account(access_key)
            .ok_or_else(|| Denied::UnknownAccount {
                access_key: access_key.to_owned(),
            })?;
        if !account.is_address_allowed(remote) {
            return Err(Denied::AddressNotAllowed {
                access_key: access_key.to_owned(),
                remote,
            });
        }
        if account.is_address_trusted(remote) {
            return Ok(());
        }
        needs.iter().try_for_each(|need| account.check(need))
    }

    fn is_globally_trusted(&self, remote: IpAddr) -> bool {
        self.trusted_addresses
            .iter()
            .any(|pattern| pattern.matches(remote))
    }
}

impl Account {
    pub fn access_key(&self) -> &str {
        &self.access_key
    }

    /// The shared secret, for signing and verifying; never for logs or replies.
    pub fn secret_key(&self) -> &str {
        &self.secret_key
    }

    pub fn is_admin(&self) -> bool {
        self.is_admin
    }

    pub fn default_topic_perm(&self) -> Perm {
        self.default_topic_perm
    }

    pub fn default_group_perm(&self) -> Perm {
        self.default_group_perm
    }

    /// The permission that applies to a topic: its own entry, else the default.
    pub fn topic_perm(&self, topic: &str) -> Perm {
        self.topic_perms
            .get(topic)
            .copied()
            .unwrap_or(self.default_topic_perm)
    }

    /// The permission that applies to a group: its own entry, else the default.
    pub fn group_perm(&self, group: &str) -> Perm {
        self.group_perms
            .get(group)
            .copied()
            .unwrap_or(self.default_group_perm)
    }

    pub fn topic_perms(&self) -> &HashMap<String, Perm> {
        &self.topic_perms
    }

    pub fn group_perms(&self) -> &HashMap<String, Perm> {
        &self.group_perms
    }

    pub fn trusted_addresses(&self) -> &[AddressPattern] {
        &self.trusted_addresses
    }

    pub fn allowed_addresses(&self) -> Option<&[AddressPattern]> {
        self.allowed_addresses.as_deref()
    }

    fn is_address_allowed(&self, remote: IpAddr) -> bool {
        self.allowed_addresses
            .as_ref()
            .is_none_or(|patterns| patterns.iter().any(|pattern| pattern.matches(remote)))
    }

    fn is_address_trusted(&self, remote: IpAddr) -> bool {
        self.trusted_addresses
            .iter()
            .any(|pattern| pattern.matches(remote))
    }

    /// RocketMQ's `checkPerm` for one need. Allocates only to describe a refusal.
    fn check(&self, need: &Need<'_>) -> Result<(), Denied> {
        let (is_group, name, needed) = match *need {
            Need::Admin if self.is_admin => return Ok(()),
            Need::Admin => {
                return Err(Denied::NotAdmin {
                    access_key: self.access_key.clone(),
                })
            }
            _ if self.is_admin && self.topic_perms.is_empty() && self.group_perms.is_empty() => {
                return Ok(())
            }
            Need::Topic(TRACE_TOPIC, Action::Pub) => return Ok(()),
            Need::Topic(topic, action) => match topic.strip_prefix(RETRY_TOPIC_PREFIX) {
                Some(group) => (true, group, Action::Sub),
                None => (false, topic, action),
            },
            Need::Group(group, action) => (true, group, action),
        };
        let held = if is_group {
            self.group_perm(name)
        } else {
            self.topic_perm(name)
        };
        if held.allows(needed) {
            return Ok(());
        }
        let resource = if is_group {
            Resource::Group(name.to_owned())
        } else {
            Resource::Topic(name.to_owned())
        };
        Err(Denied::MissingPermission {
            access_key: self.access_key.clone(),
            resource,
            needed,
            held,
        })
    }
}

impl fmt::Debug for Account {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Account")
            .field("access_key", &self.access_key)
            .field("secret_key", &"<hidden>")
            .field("is_admin", &self.is_admin)
            .field("default_topic_perm", &self.default_topic_perm)
            .field("default_group_perm", &self.default_group_perm)
            .field("topic_perms", &self.topic_perms)
            .field("group_perms", &self.group_perms)
            .field("trusted_addresses", &self.trusted_addresses)
            .field("allowed_addresses", &self.allowed_addresses)
            .finish()
    }
}
