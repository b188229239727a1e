//! Access control on the broker's connections (docs/acl.md): the accounts file, the native
//! handshake's challenge and proof, and the decision for every request.
//!
//! Owns: the process's [`AclStore`] (loaded once at start from `acl_file`, reloaded by network
//! shard 0 when the file changes; absent when access control is off), what each native request
//! needs ([`native_needs`]) and the refusal every protocol sends (`ACCESS_DENIED` naming the
//! account, the resource and the permission, counted in `/metrics`). The remoting protocol's
//! per-request signature is checked in `remoting/` with the same store and refusal.
//!
//! Never: reads the file per request (the model is an `Arc` swapped whole on reload), or
//! costs anything when access control is off (one check of an empty `OnceLock` per request).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use shardmq_acl::{Acl, AclStore, Action, Denied, Need};
use shardmq_schema::{build_frame, wire, FrameHeader};
use tracing::{info, warn};

use super::request::{frame_error, refuse, Answer, Connection, Refusal};
use super::NetworkShard;
use crate::config::BrokerConfig;

/// How often network shard 0 looks at the accounts file (RocketMQ's `FileWatchService` polls
/// every 500 ms).
pub const RELOAD_INTERVAL: Duration = Duration::from_millis(500);

static STORE: OnceLock<Option<Arc<AclStore>>> = OnceLock::new();

/// Loads `config.acl_file`, once per process, before the shards start. An accounts file that
/// does not load stops the broker from starting, with the file's error.
pub fn init(config: &BrokerConfig) -> Result<(), String> {
    // The broker's own account: a key or secret that no server could accept stops the start,
    // as on the name server, rather than connecting without an account.
    if let (Some(access_key), Some(secret_key)) = (&config.access_key, &config.secret_key) {
        shardmq_acl::Credentials::new(access_key.as_str(), secret_key.as_str())
            .map_err(|error| format!("the broker's account (access_key/secret_key): {error}"))?;
    }
    let store = match &config.acl_file {
        None => None,
        Some(path) => {
            let store = AclStore::open(path)
                .map_err(|error| format!("access control (acl_file): {error}"))?;
            info!(
                file = %path.display(),
                accounts = store.current().accounts().count(),
                "access control is on"
            );
            Some(Arc::new(store))
        }
    };
    STORE
        .set(store)
        .map_err(|_| "access control was initialized twice".to_owned())
}

/// The accounts file's store, when access control is on.
pub fn store() -> Option<&'static AclStore> {
    STORE.get().and_then(|store| store.as_deref())
}

/// The current model, when access control is on.
pub fn current() -> Option<Arc<Acl>> {
    store().map(AclStore::current)
}

/// Polls the accounts file until the broker stops; a changed file that does not load leaves
/// the old accounts in place and is logged once.
pub async fn reload_until_stopped(stopping: Arc<AtomicBool>) {
    let Some(store) = store() else { return };
    while !stopping.load(Ordering::Relaxed) {
        glommio::timer::sleep(RELOAD_INTERVAL).await;
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

/// The refusal of a request of kind `request` (counted by kind and reason).
pub fn denied(request: &str, denied: &Denied) -> Refusal {
    crate::metrics::broker().access_denied(request, reason(denied));
    refuse(wire::Status::ACCESS_DENIED, denied.to_string())
}

/// The metric label of a refusal.
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

/// Decides a native request (after the handshake; the handshake and the proof itself are
/// not decided here). `Ok` at once when access control is off.
pub(super) fn check_native(
    connection: &Connection,
    request: &wire::Frame<'_>,
) -> Result<(), Refusal> {
    let Some(acl) = current() else { return Ok(()) };
    let needs = native_needs(request);
    let account = connection.account.borrow();
    acl.authorize(account.as_deref(), connection.peer.ip(), &needs)
        .map_err(|refusal| {
            denied(
                request.body_type().variant_name().unwrap_or("unknown"),
                &refusal,
            )
        })
}

/// What a native request needs (RocketMQ's `PlainAccessValidator.parse` for the requests
/// both have; docs/acl.md, "Which requests need what"). A request that names nothing (a topic
/// list, broker status) needs only a known account or a trusted address. A missing or empty
/// name adds no need: the request's own handler refuses it as invalid.
pub fn native_needs<'a>(request: &wire::Frame<'a>) -> Vec<Need<'a>> {
    use wire::Body;
    let mut needs = Vec::new();
    let topic = |needs: &mut Vec<Need<'a>>, topic: Option<&'a str>, action| {
        if let Some(topic) = topic.filter(|t| !t.is_empty()) {
            needs.push(Need::Topic(topic, action));
        }
    };
    let group = |needs: &mut Vec<Need<'a>>, group: Option<&'a str>, action| {
        if let Some(group) = group.filter(|g| !g.is_empty()) {
            needs.push(Need::Group(group, action));
        }
    };
    match request.body_type() {
        Body::SendRequest => {
            if let Some(r) = request.body_as_send_request() {
                topic(&mut needs, r.topic(), Action::Pub);
            }
        }
        Body::SendRecordsRequest => {
            if let Some(r) = request.body_as_send_records_request() {
                topic(&mut needs, r.topic(), Action::Pub);
            }
        }
        Body::SendHalfRequest => {
            if let Some(r) = request.body_as_send_half_request() {
                topic(&mut needs, r.topic(), Action::Pub);
            }
        }
        Body::EndTransactionRequest => {
            // RocketMQ checks nothing but the signature here; the half message's topic was
            // checked when it was sent. The producer group is ShardMQ's addition.
            if let Some(r) = request.body_as_end_transaction_request() {
                group(&mut needs, r.producer_group(), Action::Pub);
            }
        }
        Body::PullRequest => {
            if let Some(r) = request.body_as_pull_request() {
                topic(&mut needs, r.topic(), Action::Sub);
                group(&mut needs, r.consumer_group(), Action::Sub);
            }
        }
        Body::QueryConsumerOffsetRequest => {
            if let Some(r) = request.body_as_query_consumer_offset_request() {
                topic(&mut needs, r.topic(), Action::Sub);
                group(&mut needs, r.consumer_group(), Action::Sub);
            }
        }
        Body::CommitConsumerOffsetRequest => {
            if let Some(r) = request.body_as_commit_consumer_offset_request() {
                topic(&mut needs, r.topic(), Action::Sub);
                group(&mut needs, r.consumer_group(), Action::Sub);
            }
        }
        Body::QueueOffsetsRequest => {
            if let Some(r) = request.body_as_queue_offsets_request() {
                topic(&mut needs, r.topic(), Action::Any);
            }
        }
        Body::OffsetByTimeRequest => {
            if let Some(r) = request.body_as_offset_by_time_request() {
                topic(&mut needs, r.topic(), Action::Any);
            }
        }
        Body::ConsumerSendBackRequest => {
            if let Some(r) = request.body_as_consumer_send_back_request() {
                group(&mut needs, r.consumer_group(), Action::Sub);
            }
        }
        Body::LockBatchRequest => {
            if let Some(r) = request.body_as_lock_batch_request() {
                group(&mut needs, r.consumer_group(), Action::Sub);
                for queue in r.queues().iter().flatten() {
                    topic(&mut needs, queue.topic(), Action::Sub);
                }
            }
        }
        Body::UnlockBatchRequest => {
            if let Some(r) = request.body_as_unlock_batch_request() {
                group(&mut needs, r.consumer_group(), Action::Sub);
                for queue in r.queues().iter().flatten() {
                    topic(&mut needs, queue.topic(), Action::Sub);
                }
            }
        }
        Body::HeartbeatRequest => {
            if let Some(r) = request.body_as_heartbeat_request() {
                for info in r.consumer_groups().iter().flatten() {
                    group(&mut needs, info.group(), Action::Sub);
                    for subscription in info.subscriptions().iter().flatten() {
                        topic(&mut needs, subscription.topic(), Action::Sub);
                    }
                }
            }
        }
        Body::UnregisterClientRequest => {
            if let Some(r) = request.body_as_unregister_client_request() {
                group(&mut needs, r.consumer_group(), Action::Sub);
            }
        }
        Body::ConsumerListRequest => {
            if let Some(r) = request.body_as_consumer_list_request() {
                group(&mut needs, r.consumer_group(), Action::Sub);
            }
        }
        Body::QueryByKeyRequest => {
            if let Some(r) = request.body_as_query_by_key_request() {
                topic(&mut needs, r.topic(), Action::Sub);
            }
        }
        Body::TopicStatsRequest => {
            if let Some(r) = request.body_as_topic_stats_request() {
                topic(&mut needs, r.topic(), Action::Any);
            }
        }
        // Changing topics, and a slave's replication (brokers authenticate as admin accounts).
        Body::UpsertTopicRequest
        | Body::DeleteTopicRequest
        | Body::ReplicaJoinRequest
        | Body::ReplicaPullRequest
        | Body::ReplicaReturnRequest
        | Body::ReplicaFileRequest
        | Body::ReplicaOffsetsRequest => needs.push(Need::Admin),
        // Names nothing: a known account (or a trusted address) is enough.
        _ => {}
    }
    needs
}

/// The nonce a new connection's handshake answer carries, when access control is on. A
/// machine without randomness cannot challenge: the connection then stays anonymous.
pub(super) fn challenge() -> Option<shardmq_acl::Nonce> {
    store()?;
    match shardmq_acl::challenge() {
        Ok(nonce) => Some(nonce),
        Err(error) => {
            warn!(%error, "access control: no randomness for a handshake challenge");
            None
        }
    }
}

/// Answers an `AuthRequest`: the connection speaks as the account from now on, or is refused
/// and closed.
pub(super) fn authenticate(
    shard: &NetworkShard,
    connection: &Connection,
    id: u64,
    r: wire::AuthRequest<'_>,
) -> Answer {
    let Some(acl) = current() else {
        return Err(refuse(
            wire::Status::INVALID_ARGUMENT,
            "this broker does not enforce access control: it sent no auth_nonce, so there is nothing to prove",
        ));
    };
    let Some(nonce) = connection.auth_nonce.take() else {
        connection.close_after_answers();
        return Err(refuse(
            wire::Status::ACCESS_DENIED,
            "an AuthRequest answers the handshake's auth_nonce, once per connection",
        ));
    };
    let access_key = r.access_key().unwrap_or_default();
    let client_nonce: Option<&[u8]> = r.client_nonce().map(|v| v.bytes());
    let client_nonce: Option<&shardmq_acl::Nonce> = client_nonce.and_then(|n| n.try_into().ok());
    let Some(client_nonce) = client_nonce else {
        connection.close_after_answers();
        return Err(refuse(
            wire::Status::ACCESS_DENIED,
            format!(
                "AuthRequest.client_nonce must be {} bytes",
                shardmq_acl::NONCE_BYTES
            ),
        ));
    };
    let proof = r.proof().map(|v| v.bytes()).unwrap_or_default();
    let verified = acl
        .verify_proof(&nonce, access_key, client_nonce, proof)
        .and_then(|account| {
            // An account held to other addresses is refused here already, not on its first
            // request.
            acl.authorize(Some(access_key), connection.peer.ip(), &[])
                .map(|()| account)
        });
    let account = match verified {
        Ok(account) => account,
        Err(refusal) => {
            warn!(peer = %connection.peer, %refusal, "access control: authentication refused");
            connection.close_after_answers();
            return Err(denied("AuthRequest", &refusal));
        }
    };
    *connection.account.borrow_mut() = Some(access_key.to_owned());
    let is_admin = account.is_admin();
    shard
        .with_encoder(|encoder| {
            encoder.encode(|b| {
                let access_key = b.create_string(access_key);
                let body = wire::AuthResponse::create(
                    b,
                    &wire::AuthResponseArgs {
                        access_key: Some(access_key),
                        admin: is_admin,
                    },
                );
                build_frame(
                    b,
                    &FrameHeader::response(id, wire::Status::OK),
                    wire::Body::AuthResponse,
                    Some(body.as_union_value()),
                )
            })
        })
        .map(|frame| vec![frame])
        .map_err(frame_error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use flatbuffers::FlatBufferBuilder;

    fn frame(
        build: impl FnOnce(
            &mut FlatBufferBuilder<'static>,
        ) -> (
            wire::Body,
            flatbuffers::WIPOffset<flatbuffers::UnionWIPOffset>,
        ),
    ) -> Vec<u8> {
        let mut builder = FlatBufferBuilder::new();
        let (kind, body) = build(&mut builder);
        let root = build_frame(&mut builder, &FrameHeader::request(1), kind, Some(body));
        builder.finish(root, None);
        builder.finished_data().to_vec()
    }

    fn needs_of(bytes: &[u8]) -> Vec<Need<'_>> {
        native_needs(&wire::root_as_frame(bytes).expect("a valid frame"))
    }

    #[test]
    fn needs_follow_rocketmqs_validator() {
        let pull = frame(|b| {
            let topic = b.create_string("orders");
            let group = b.create_string("billing");
            let body = wire::PullRequest::create(
                b,
                &wire::PullRequestArgs {
                    topic: Some(topic),
                    consumer_group: Some(group),
                    ..Default::default()
                },
            );
            (wire::Body::PullRequest, body.as_union_value())
        });
        assert_eq!(
            needs_of(&pull),
            vec![
                Need::Topic("orders", Action::Sub),
                Need::Group("billing", Action::Sub)
            ]
        );
        let send = frame(|b| {
            let topic = b.create_string("orders");
            let body = wire::SendRecordsRequest::create(
                b,
                &wire::SendRecordsRequestArgs {
                    topic: Some(topic),
                    ..Default::default()
                },
            );
            (wire::Body::SendRecordsRequest, body.as_union_value())
        });
        assert_eq!(needs_of(&send), vec![Need::Topic("orders", Action::Pub)]);
        let delete = frame(|b| {
            let topic = b.create_string("orders");
            let body = wire::DeleteTopicRequest::create(
                b,
                &wire::DeleteTopicRequestArgs {
                    topic: Some(topic),
                    force: false,
                },
            );
            (wire::Body::DeleteTopicRequest, body.as_union_value())
        });
        assert_eq!(needs_of(&delete), vec![Need::Admin]);
        let list = frame(|b| {
            let body = wire::TopicListRequest::create(b, &wire::TopicListRequestArgs::default());
            (wire::Body::TopicListRequest, body.as_union_value())
        });
        assert!(needs_of(&list).is_empty());
    }
}
