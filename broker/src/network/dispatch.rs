//! Where a request frame goes: the handshake, the refusal of writes on a slave, then a table from
//! the body type to the handler of its family (`produce`, `consume`, `query`, `clients`,
//! `topics`, `replica`, `admin`, `transaction`, `queue_locks`, `send_back`). The table holds no
//! logic; adding a request type is one row here and one function in its family's file. Also
//! what every answer shares: the metrics and the error frame of a refusal.

use shardmq_schema::{build_frame, negotiate_protocol_version, wire, FrameHeader, VerifiedFrame};
use shardmq_schema::{MIN_PROTOCOL_VERSION, PROTOCOL_VERSION};

use super::produce::EarlyRun;
use super::request::{frame_error, refuse, Answer, Connection, Refusal};
use super::{
    access, admin, clients, consume, produce, query, queue_locks, replica, send_back, topics,
    transaction,
};
use super::{NetworkShard, Outbound};

/// Handles one request frame; `None` for one-way frames that need no answer.
/// `early` is what was checked of the frame's run of records while it arrived, if anything.
pub(super) async fn handle(
    shard: &NetworkShard,
    connection: &Connection,
    frame: VerifiedFrame,
    early: Option<EarlyRun>,
) -> Option<Outbound> {
    let request = frame.frame();
    let request_id = request.request_id();
    let is_one_way = request.kind() == wire::FrameKind::ONE_WAY;
    let started = std::time::Instant::now();
    let answer = dispatch(shard, connection, &frame, early).await;
    let metrics = crate::metrics::broker();
    if request.body_type() == wire::Body::SendRequest
        || request.body_type() == wire::Body::SendRecordsRequest
    {
        let seconds = started.elapsed().as_secs_f64();
        metrics.send_latency.observe(seconds);
        metrics.send_latency_buckets.observe(seconds);
    }
    if is_one_way {
        return None;
    }
    metrics.answered(match &answer {
        Ok(_) => wire::Status::OK,
        Err(refusal) => refusal.status,
    });
    Some(match answer {
        Ok(frames) => frames,
        Err(refusal) => match shard
            .with_encoder(|e| e.encode_error_response(request_id, refusal.status, &refusal.message))
        {
            Ok(frame) => vec![frame],
            Err(_) => Vec::new(),
        },
    })
}

/// The request's body, typed, or the refusal of a request this broker does not serve (a body
/// type whose table is absent).
macro_rules! body {
    ($request:expr, $as:ident) => {
        $request.$as().ok_or_else(|| unknown(&$request))?
    };
}

/// The table: each body type to its family's handler.
async fn dispatch(
    shard: &NetworkShard,
    connection: &Connection,
    frame: &VerifiedFrame,
    early: Option<EarlyRun>,
) -> Answer {
    let request = frame.frame();
    let id = request.request_id();
    if let Some(handshake) = request.body_as_handshake_request() {
        return handshake_answer(shard, connection, id, handshake);
    }
    if !connection.is_handshaken.get() {
        return Err(refuse(
            wire::Status::HANDSHAKE_REQUIRED,
            "the first request on a connection must be a HandshakeRequest",
        ));
    }
    if let Some(auth) = request.body_as_auth_request() {
        return access::authenticate(shard, connection, id, auth);
    }
    access::check_native(connection, &request)?;
    if shard.config.role() == crate::config::BrokerRole::Slave && is_write_request(&request) {
        return Err(refuse(
            wire::Status::SERVICE_NOT_AVAILABLE,
            format!(
                "this broker is a slave of {} (broker id {}): it takes no sends or topic changes; use the master",
                shard.config.ha_master, shard.config.broker_id
            ),
        ));
    }
    use wire::Body;
    let c = connection;
    match request.body_type() {
        // Producing.
        Body::SendRequest => {
            produce::send(shard, c, id, body!(request, body_as_send_request)).await
        }
        Body::SendRecordsRequest => {
            let r = body!(request, body_as_send_records_request);
            produce::send_records(shard, frame, early, id, r).await
        }
        Body::SendHalfRequest => {
            transaction::handle_send_half(shard, c, id, body!(request, body_as_send_half_request))
                .await
        }
        Body::EndTransactionRequest => {
            transaction::handle_end_transaction(
                shard,
                id,
                body!(request, body_as_end_transaction_request),
            )
            .await
        }
        // Consuming.
        Body::PullRequest => consume::pull(shard, id, body!(request, body_as_pull_request)).await,
        Body::QueryConsumerOffsetRequest => {
            consume::query_consumer_offset(
                shard,
                id,
                body!(request, body_as_query_consumer_offset_request),
            )
            .await
        }
        Body::CommitConsumerOffsetRequest => {
            consume::commit_consumer_offset(
                shard,
                id,
                body!(request, body_as_commit_consumer_offset_request),
            )
            .await
        }
        Body::QueueOffsetsRequest => {
            consume::queue_offsets(shard, id, body!(request, body_as_queue_offsets_request)).await
        }
        Body::OffsetByTimeRequest => {
            consume::offset_by_time(shard, id, body!(request, body_as_offset_by_time_request)).await
        }
        Body::ConsumerSendBackRequest => {
            send_back::handle_send_back(
                shard,
                id,
                body!(request, body_as_consumer_send_back_request),
            )
            .await
        }
        Body::LockBatchRequest => {
            queue_locks::handle_lock_batch(shard, c, id, body!(request, body_as_lock_batch_request))
                .await
        }
        Body::UnlockBatchRequest => {
            queue_locks::handle_unlock_batch(
                shard,
                c,
                id,
                body!(request, body_as_unlock_batch_request),
            )
            .await
        }
        // Clients and groups.
        Body::HeartbeatRequest => {
            clients::heartbeat(shard, c, id, body!(request, body_as_heartbeat_request)).await
        }
        Body::UnregisterClientRequest => {
            clients::unregister_client(
                shard,
                c,
                id,
                body!(request, body_as_unregister_client_request),
            )
            .await
        }
        Body::ConsumerListRequest => {
            clients::consumer_list(shard, id, body!(request, body_as_consumer_list_request)).await
        }
        // Topics.
        Body::UpsertTopicRequest => {
            topics::upsert_topic(shard, id, body!(request, body_as_upsert_topic_request)).await
        }
        Body::DeleteTopicRequest => {
            topics::delete_topic(shard, id, body!(request, body_as_delete_topic_request)).await
        }
        Body::BrokerTopicsRequest => {
            topics::broker_topics(shard, id, body!(request, body_as_broker_topics_request))
        }
        Body::TopicListRequest => {
            body!(request, body_as_topic_list_request);
            topics::topic_list(shard, id)
        }
        Body::TopicStatsRequest => {
            let r = body!(request, body_as_topic_stats_request);
            topics::stats(shard, id, r.topic().unwrap_or_default()).await
        }
        // Queries.
        Body::QueryByKeyRequest => {
            query::by_key(shard, id, body!(request, body_as_query_by_key_request)).await
        }
        Body::QueryByIdRequest => {
            query::by_id(shard, id, body!(request, body_as_query_by_id_request)).await
        }
        // Administration.
        Body::BrokerStatusRequest => {
            body!(request, body_as_broker_status_request);
            admin::broker_status(shard, id).await
        }
        Body::GroupListRequest => {
            body!(request, body_as_group_list_request);
            admin::group_list(shard, id).await
        }
        // Replication (a master serving its slaves).
        Body::ReplicaJoinRequest => {
            let link = (shard.id, connection.id);
            replica::join(
                shard,
                id,
                link,
                body!(request, body_as_replica_join_request),
            )
            .await
        }
        Body::ReplicaPullRequest => {
            let link = (shard.id, connection.id);
            replica::pull(
                shard,
                id,
                link,
                body!(request, body_as_replica_pull_request),
            )
            .await
        }
        Body::ReplicaReturnRequest => {
            let link = (shard.id, connection.id);
            replica::return_tail(
                shard,
                id,
                link,
                body!(request, body_as_replica_return_request),
            )
            .await
        }
        Body::ReplicaFileRequest => {
            replica::file(shard, id, body!(request, body_as_replica_file_request)).await
        }
        Body::ReplicaOffsetsRequest => {
            replica::offsets(shard, id, body!(request, body_as_replica_offsets_request)).await
        }
        _ => Err(unknown(&request)),
    }
}

/// The refusal of a request kind this broker does not serve.
fn unknown(request: &wire::Frame<'_>) -> Refusal {
    refuse(
        wire::Status::UNKNOWN_REQUEST,
        format!(
            "request kind {:?} is not served by this broker",
            request.body_type()
        ),
    )
}

fn handshake_answer(
    shard: &NetworkShard,
    connection: &Connection,
    id: u64,
    r: wire::HandshakeRequest<'_>,
) -> Answer {
    let negotiated = negotiate_protocol_version(r.protocol_version(), r.min_protocol_version());
    let refusal_message;
    let (status, message) = match negotiated {
        Some(_) => (wire::Status::OK, None),
        None => {
            refusal_message = format!(
                "client speaks protocol versions {}..={}, this broker {MIN_PROTOCOL_VERSION}..={PROTOCOL_VERSION}",
                r.min_protocol_version(),
                r.protocol_version()
            );
            (
                wire::Status::UNSUPPORTED_VERSION,
                Some(refusal_message.as_str()),
            )
        }
    };
    match negotiated {
        Some(_) => {
            if let Some(client_id) = r.client_id().filter(|c| !c.is_empty()) {
                *connection.client_id.borrow_mut() = Some(client_id.to_owned());
                shard.set_client(connection.id, client_id.to_owned());
            }
            connection.is_handshaken.set(true);
            connection.auth_nonce.set(access::challenge());
        }
        // The answer still describes this broker, so the client can say what to upgrade; then
        // the connection closes (docs/protocol.md, handshake).
        None => connection.close_after_answers(),
    }
    let config = &shard.config;
    let auth_nonce = connection.auth_nonce.get();
    shard
        .with_encoder(|encoder| {
            encoder.encode(|b| {
                let auth_nonce = auth_nonce.map(|nonce| b.create_vector(&nonce[..]));
                let name = b.create_string("shardmq-broker");
                let version_text = b.create_string(env!("CARGO_PKG_VERSION"));
                let cluster = b.create_string(&config.cluster_name);
                let broker = b.create_string(&config.broker_name);
                let server = wire::ServerInfo::create(
                    b,
                    &wire::ServerInfoArgs {
                        name: Some(name),
                        version: Some(version_text),
                        cluster_name: Some(cluster),
                        broker_name: Some(broker),
                        broker_id: config.broker_id,
                    },
                );
                let body = wire::HandshakeResponse::create(
                    b,
                    &wire::HandshakeResponseArgs {
                        protocol_version: negotiated.unwrap_or(0),
                        min_protocol_version: MIN_PROTOCOL_VERSION,
                        max_protocol_version: PROTOCOL_VERSION,
                        server: Some(server),
                        max_frame_bytes: config.max_frame_bytes as u32,
                        max_message_bytes: config.max_message_bytes as u32,
                        auth_nonce,
                    },
                );
                let mut header = FrameHeader::response(id, status);
                if let Some(message) = message {
                    header = header.with_message(message);
                }
                build_frame(
                    b,
                    &header,
                    wire::Body::HandshakeResponse,
                    Some(body.as_union_value()),
                )
            })
        })
        .map(|frame| vec![frame])
        .map_err(frame_error)
}

/// Requests a slave refuses: they would write its CommitLog or topic table, which only its
/// master's replication may change.
fn is_write_request(request: &wire::Frame<'_>) -> bool {
    request.body_as_send_request().is_some()
        || request.body_as_send_records_request().is_some()
        || request.body_as_send_half_request().is_some()
        || request.body_as_end_transaction_request().is_some()
        || request.body_as_upsert_topic_request().is_some()
        || request.body_as_delete_topic_request().is_some()
        || request.body_as_consumer_send_back_request().is_some()
}
