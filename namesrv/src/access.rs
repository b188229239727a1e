//! Access control on the name server's ports (docs/acl.md, "Name servers and broker-to-broker
//! traffic"): the accounts file, the native handshake's challenge and proof, and what each
//! request of the native port, the remoting port and the controller port needs.
//!
//! Owns: the process's [`AclStore`] (loaded at start from `--acl-file`, polled every 500 ms by
//! [`Access::reload_until_stopped`]; absent when access control is off), the needs of every
//! name-server and controller request ([`native_required`], [`remoting_required`]), and the
//! refusal text, counted in `/metrics` by request kind and reason. The name server's own
//! account (`--access-key`/`--secret-key`), used by the controller's links, lives in
//! [`crate::controller::ControllerConfig`], not here.
//!
//! Never: reads the file per request (the model is an `Arc` swapped whole on reload), logs a
//! secret, or costs more than one `Option` check per request when access control is off.
//!
//! RocketMQ 4.x's name server checks nothing (its ACL runs on brokers only); everything here is
//! ShardMQ's addition, mirroring the broker's `network/access.rs`.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use shardmq_acl::{Acl, AclError, AclStore, Denied, Need, Nonce};
use shardmq_remoting::codes::request;
use shardmq_remoting::RemotingCommand;
use shardmq_schema::wire;
use tracing::{info, warn};

/// How often the accounts file is looked at (RocketMQ's `FileWatchService` polls every
/// 500 ms).
pub const RELOAD_INTERVAL: Duration = Duration::from_millis(500);

/// What a request needs from the account it comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Required {
    /// Reads (routes, topic lists, cluster info, controller status): an account the file
    /// knows, or a trusted address.
    KnownAccount,
    /// Changes (broker registration, topic deletion) and the controllers' own traffic (Raft,
    /// heartbeats, membership): the admin flag. Brokers authenticate as admin accounts.
    Admin,
}

impl Required {
    fn needs(self) -> &'static [Need<'static>] {
        match self {
            Required::KnownAccount => &[],
            Required::Admin => &[Need::Admin],
        }
    }

    /// For refusals: what the request needed.
    pub fn describe(self) -> &'static str {
        match self {
            Required::KnownAccount => "a known account",
            Required::Admin => "an admin account",
        }
    }
}

/// Access control of one name server process: off, or an accounts file.
#[derive(Debug, Default)]
pub struct Access {
    store: Option<AclStore>,
}

impl Access {
    /// Access control off: every caller is served (RocketMQ's name server).
    #[must_use]
    pub fn off() -> Arc<Access> {
        Arc::new(Access::default())
    }

    /// Loads `path` (or turns access control off when `None`). A file that does not load stops
    /// the name server from starting.
    pub fn open(path: Option<PathBuf>) -> Result<Arc<Access>, AclError> {
        let Some(path) = path else {
            return Ok(Access::off());
        };
        let store = AclStore::open(&path)?;
        info!(
            file = %path.display(),
            accounts = store.current().accounts().count(),
            "access control is on"
        );
        Ok(Arc::new(Access { store: Some(store) }))
    }

    /// A store already loaded (for tests).
    #[must_use]
    pub fn with_store(store: AclStore) -> Arc<Access> {
        Arc::new(Access { store: Some(store) })
    }

    #[must_use]
    pub fn is_on(&self) -> bool {
        self.store.is_some()
    }

    /// The current accounts, when access control is on.
    #[must_use]
    pub fn current(&self) -> Option<Arc<Acl>> {
        self.store.as_ref().map(AclStore::current)
    }

    /// Polls the accounts file until the task is dropped; a changed file that does not load
    /// leaves the old accounts in place and is logged once.
    pub async fn reload_until_stopped(self: Arc<Self>) {
        let Some(store) = &self.store else { return };
        loop {
            tokio::time::sleep(RELOAD_INTERVAL).await;
            match store.reload_if_changed() {
                Ok(true) => info!(
                    file = %store.path().display(),
                    accounts = store.current().accounts().count(),
                    "access control: accounts file reloaded"
                ),
                Ok(false) => {}
                Err(error) => warn!(
                    %error,
                    "access control: the changed accounts file does not load; the previous accounts stay in force"
                ),
            }
        }
    }

    /// The nonce a handshake answer carries, when access control is on. A machine without
    /// randomness cannot challenge: the connection then stays anonymous.
    #[must_use]
    pub fn challenge(&self) -> Option<Nonce> {
        self.store.as_ref()?;
        match shardmq_acl::challenge() {
            Ok(nonce) => Some(nonce),
            Err(error) => {
                warn!(%error, "access control: no randomness for a handshake challenge");
                None
            }
        }
    }

    /// Checks an `AuthRequest` answering `nonce`: the access key and whether the account is an
    /// admin, or the refusal text (counted). `Err` also when access control is off.
    pub fn authenticate(
        &self,
        nonce: &Nonce,
        peer: IpAddr,
        auth: &wire::AuthRequest<'_>,
    ) -> Result<(String, bool), String> {
        let Some(acl) = self.current() else {
            return Err("this server does not enforce access control".to_owned());
        };
        let access_key = auth.access_key().unwrap_or_default();
        let client_nonce: Option<&Nonce> = auth
            .client_nonce()
            .and_then(|nonce| nonce.bytes().try_into().ok());
        let Some(client_nonce) = client_nonce else {
            return Err(format!(
                "AuthRequest.client_nonce must be {} bytes",
                shardmq_acl::NONCE_BYTES
            ));
        };
        let proof = auth.proof().map(|proof| proof.bytes()).unwrap_or_default();
        let verified = acl
            .verify_proof(nonce, access_key, client_nonce, proof)
            .and_then(|account| {
                // An account held to other addresses is refused here already.
                acl.authorize(Some(access_key), peer, &[])
                    .map(|()| account.is_admin())
            });
        match verified {
            Ok(is_admin) => Ok((access_key.to_owned(), is_admin)),
            Err(refusal) => {
                warn!(%peer, %refusal, "access control: authentication refused");
                Err(refused("AuthRequest", Required::KnownAccount, &refusal))
            }
        }
    }

    /// Decides a request of `kind` from `peer`, speaking as `account` (`None`: anonymous).
    /// `Err` is the refusal's text, already counted.
    pub fn check(
        &self,
        kind: &str,
        account: Option<&str>,
        peer: IpAddr,
        required: Required,
    ) -> Result<(), String> {
        let Some(acl) = self.current() else {
            return Ok(());
        };
        acl.authorize(account, peer, required.needs())
            .map_err(|refusal| refused(kind, required, &refusal))
    }

    /// Decides a remoting request: RocketMQ's signature over its ext fields and body (unless
    /// the address is trusted), then what its code needs.
    pub fn check_remoting(&self, command: &RemotingCommand, peer: IpAddr) -> Result<(), String> {
        let Some(acl) = self.current() else {
            return Ok(());
        };
        let kind = remoting_kind(command.code);
        let required = remoting_required(command.code);
        let access_key = command
            .ext_fields
            .get(shardmq_acl::signature::ACCESS_KEY_FIELD)
            .map(String::as_str);
        if !acl.is_trusted(access_key, peer) && access_key.is_some() {
            acl.verify_rocketmq_request(&command.ext_fields, &command.body)
                .map_err(|refusal| refused(kind, required, &refusal))?;
        }
        acl.authorize(access_key, peer, required.needs())
            .map_err(|refusal| refused(kind, required, &refusal))
    }
}

/// Counts a refusal and words it: the request, what it needed, and the account's fault.
fn refused(kind: &str, required: Required, refusal: &Denied) -> String {
    crate::metrics::namesrv().access_denied(kind, reason(refusal));
    format!("{kind} needs {}: {refusal}", required.describe())
}

/// The metric label of a refusal (the broker's labels).
#[must_use]
pub fn reason(denied: &Denied) -> &'static str {
    match denied {
        Denied::NoCredentials { .. } | Denied::NoAccessKey => "no_credentials",
        Denied::UnknownAccount { .. } => "unknown_account",
        Denied::AddressNotAllowed { .. } => "address",
        Denied::NotAdmin { .. } => "not_admin",
        Denied::MissingPermission { .. } => "permission",
        Denied::BadSignature { .. } => "signature",
        Denied::BadProof { .. } => "proof",
    }
}

/// What a native name-server or controller request needs. Reads need a known account;
/// everything else, including kinds this server does not serve, needs the admin flag (a
/// request the server would refuse anyway is refused for its account first).
#[must_use]
pub fn native_required(body: wire::Body) -> Required {
    use wire::Body;
    match body {
        Body::GetRouteRequest
        | Body::TopicListRequest
        | Body::ClusterInfoRequest
        | Body::ControllerStatusRequest => Required::KnownAccount,
        // RegisterBrokerRequest, UnregisterBrokerRequest, ControllerRaftRequest,
        // ControllerHeartbeatRequest, ControllerMembershipRequest and the rest.
        _ => Required::Admin,
    }
}

/// What a remoting request to the name server needs: route, cluster and topic-list reads a
/// known account; broker registration, topic deletion, RocketMQ's admin codes and every code
/// not served here the admin flag.
#[must_use]
pub fn remoting_required(code: i32) -> Required {
    match code {
        request::GET_ROUTEINFO_BY_TOPIC
        | request::GET_BROKER_CLUSTER_INFO
        | request::GET_ALL_TOPIC_LIST_FROM_NAMESERVER
        | request::GET_TOPICS_BY_CLUSTER => Required::KnownAccount,
        _ => Required::Admin,
    }
}

/// The metric label of a remoting request.
fn remoting_kind(code: i32) -> &'static str {
    match code {
        request::GET_ROUTEINFO_BY_TOPIC => "GET_ROUTEINFO_BY_TOPIC",
        request::GET_BROKER_CLUSTER_INFO => "GET_BROKER_CLUSTER_INFO",
        request::GET_ALL_TOPIC_LIST_FROM_NAMESERVER => "GET_ALL_TOPIC_LIST_FROM_NAMESERVER",
        request::GET_TOPICS_BY_CLUSTER => "GET_TOPICS_BY_CLUSTER",
        request::DELETE_TOPIC_IN_NAMESRV => "DELETE_TOPIC_IN_NAMESRV",
        request::REGISTER_BROKER => "REGISTER_BROKER",
        request::UNREGISTER_BROKER => "UNREGISTER_BROKER",
        _ => "remoting_other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ACCOUNTS: &str = r#"
        trusted_addresses = ["10.9.9.9"]

        [[accounts]]
        access_key = "broker-account"
        secret_key = "broker-secret"
        admin = true

        [[accounts]]
        access_key = "reader-account"
        secret_key = "reader-secret"
    "#;

    fn access() -> (tempfile::TempDir, Arc<Access>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("acl.toml");
        std::fs::write(&path, ACCOUNTS).unwrap();
        let access = Access::with_store(AclStore::open(&path).unwrap());
        (dir, access)
    }

    const PEER: [u8; 4] = [127, 0, 0, 1];

    #[test]
    fn reads_need_a_known_account_and_changes_and_controller_traffic_need_admin() {
        use wire::Body;
        for read in [
            Body::GetRouteRequest,
            Body::TopicListRequest,
            Body::ClusterInfoRequest,
            Body::ControllerStatusRequest,
        ] {
            assert_eq!(native_required(read), Required::KnownAccount, "{read:?}");
        }
        for change in [
            Body::RegisterBrokerRequest,
            Body::UnregisterBrokerRequest,
            Body::ControllerRaftRequest,
            Body::ControllerHeartbeatRequest,
            Body::ControllerMembershipRequest,
            Body::DeleteTopicRequest,
            Body::SendRequest,
        ] {
            assert_eq!(native_required(change), Required::Admin, "{change:?}");
        }
        for read in [
            request::GET_ROUTEINFO_BY_TOPIC,
            request::GET_BROKER_CLUSTER_INFO,
            request::GET_ALL_TOPIC_LIST_FROM_NAMESERVER,
            request::GET_TOPICS_BY_CLUSTER,
        ] {
            assert_eq!(remoting_required(read), Required::KnownAccount, "{read}");
        }
        for change in [
            request::REGISTER_BROKER,
            request::UNREGISTER_BROKER,
            request::DELETE_TOPIC_IN_NAMESRV,
            request::UPDATE_AND_CREATE_TOPIC,
            request::DELETE_TOPIC_IN_BROKER,
            9999,
        ] {
            assert_eq!(remoting_required(change), Required::Admin, "{change}");
        }
    }

    #[test]
    fn native_checks_name_the_account_and_the_need() {
        let (_dir, access) = access();
        let peer = IpAddr::from(PEER);
        let admin = Required::Admin;
        let known = Required::KnownAccount;
        assert!(access
            .check("x", Some("broker-account"), peer, admin)
            .is_ok());
        assert!(access
            .check("x", Some("reader-account"), peer, known)
            .is_ok());
        let refusal = access
            .check("RegisterBrokerRequest", Some("reader-account"), peer, admin)
            .unwrap_err();
        assert!(
            refusal.contains("RegisterBrokerRequest needs an admin account")
                && refusal.contains("reader-account"),
            "{refusal}"
        );
        let refusal = access
            .check("GetRouteRequest", None, peer, known)
            .unwrap_err();
        assert!(refusal.contains("no access key"), "{refusal}");
        // A trusted address passes anonymously.
        let trusted = IpAddr::from([10, 9, 9, 9]);
        assert!(access.check("x", None, trusted, admin).is_ok());
        // Off: everything passes.
        assert!(Access::off().check("x", None, peer, admin).is_ok());
    }

    #[test]
    fn remoting_requests_are_signed_and_admin_codes_need_admin() {
        let (_dir, access) = access();
        let peer = IpAddr::from(PEER);
        let signed = |code: i32, key: &str, secret: &str| {
            let mut command = RemotingCommand::request(code, 1).with_ext("topic", "orders");
            command.ext_fields.insert("AccessKey".into(), key.into());
            let signature =
                shardmq_acl::rocketmq_signature(secret, &command.ext_fields, &command.body);
            command.ext_fields.insert("Signature".into(), signature);
            command
        };
        let route = request::GET_ROUTEINFO_BY_TOPIC;
        let delete = request::DELETE_TOPIC_IN_NAMESRV;
        assert!(access
            .check_remoting(&signed(route, "reader-account", "reader-secret"), peer)
            .is_ok());
        let refusal = access
            .check_remoting(&signed(route, "reader-account", "wrong-secret"), peer)
            .unwrap_err();
        assert!(refusal.contains("signature"), "{refusal}");
        let refusal = access
            .check_remoting(&signed(delete, "reader-account", "reader-secret"), peer)
            .unwrap_err();
        assert!(refusal.contains("not an admin"), "{refusal}");
        assert!(access
            .check_remoting(&signed(delete, "broker-account", "broker-secret"), peer)
            .is_ok());
        let anonymous = RemotingCommand::request(route, 2).with_ext("topic", "orders");
        assert!(access.check_remoting(&anonymous, peer).is_err());
    }
}
