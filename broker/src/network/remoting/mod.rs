//! RocketMQ's remoting protocol on a network shard's client port, so that applications written
//! against RocketMQ's clients use ShardMQ unchanged (docs/protocol.md, "RocketMQ remoting").
//!
//! Owns a remoting connection: its read loop (frames of `shardmq-remoting`, charged to the
//! shard's request byte budget before they are buffered whole, at most
//! `max_inflight_per_connection` requests at once, each on its own task so a parked pull does
//! not hold the others), its writer, and the translation of what the broker pushes to a client
//! (a group's members changed) into remoting requests. What each request means is decided by
//! the same family handlers native requests reach ([`dispatch`]): a remoting request becomes
//! the native request it corresponds to, so features, storage and replication never know which
//! protocol asked. Never: the bytes of the protocol (the `shardmq-remoting` crate).
//!
//! A connection arrives here when its first bytes are a remoting frame
//! ([`shardmq_remoting::sniff`], in `connection::serve`); the bytes read to tell are the start
//! of its first frame.

mod access;
mod admin;
mod clients;
mod consume;
mod dispatch;
mod locks;
mod query;
mod retry;
mod send;
mod transaction;

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::unix::io::AsRawFd;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use futures_lite::AsyncReadExt;
use glommio::channels::local_channel;
use glommio::net::TcpStream;
use glommio::sync::Semaphore;
use shardmq_remoting::codes::request;
use shardmq_remoting::{encode_frame, FrameDecoder, FrameLimits, RemotingCommand};
use shardmq_schema::wire;
use tracing::{debug, warn};

use super::budget::Claim;
use super::connection::{write_queued, ReadRoom};
use super::request::Connection;
use super::{NetworkShard, Outbound};

/// How much is read from the socket at a time.
const READ_CHUNK_BYTES: usize = 64 << 10;

/// The kind a remoting request counts under in the shard's in-flight requests.
const REQUEST_KIND: &str = "remoting";

/// What a remoting connection remembers between its requests.
#[derive(Default)]
pub(super) struct RemotingSession {
    /// The subscriptions of this client's last heartbeat, by (group, topic): a push consumer's
    /// pulls name none of their own (RocketMQ's `postSubscriptionWhenPull` is off by default).
    /// Each value: the expression and whether it is SQL92.
    subscriptions: RefCell<HashMap<(String, String), (String, bool)>>,
}

/// Serves one remoting connection until it closes or the broker stops.
pub async fn serve(shard: Rc<NetworkShard>, stream: TcpStream, peer: SocketAddr, first: BytesMut) {
    let socket = stream.as_raw_fd();
    let (mut reader, writer) = futures_lite::io::split(stream);
    let inflight_limit = shard.config.max_inflight_per_connection;
    let (answers, answers_rx) = local_channel::new_bounded::<Outbound>(inflight_limit * 2 + 16);
    let answers = Rc::new(answers);
    // What the broker pushes to this client arrives as native frames; a task translates them.
    let (push, push_rx) = local_channel::new_bounded::<Outbound>(16);
    let push = Rc::new(push);
    let connection_id = shard.register_connection(push.clone());
    let connection = Rc::new(Connection {
        id: connection_id,
        peer,
        is_handshaken: std::cell::Cell::new(true),
        client_id: RefCell::new(None),
        account: RefCell::new(None),
        auth_nonce: std::cell::Cell::new(None),
        is_closing: std::cell::Cell::new(false),
        out: push,
    });
    let session = Rc::new(RemotingSession::default());
    debug!(%peer, connection_id, "remoting connection opened");

    let writer_task = glommio::spawn_local(write_queued(socket, writer, answers_rx)).detach();
    let push_task = glommio::spawn_local(translate_pushes(
        shard.clone(),
        connection_id,
        push_rx,
        answers.clone(),
    ))
    .detach();

    let decoder = FrameDecoder::new(FrameLimits::default().with_max_frame_bytes(
        // The native limit counts a frame after its 4-byte length; remoting's counts it whole.
        shard.config.max_frame_bytes.saturating_add(4),
    ));
    let permits = Rc::new(Semaphore::new(inflight_limit as u64));
    let budget = shard.request_bytes.clone();
    let mut charged = 0usize;
    let frame_read_timeout = Duration::from_millis(shard.config.frame_read_timeout_ms);
    let mut frame_started: Option<Instant> = None;
    let mut buffer = first;
    // Read room is zeroed once, not before every read (connection.rs, `ReadRoom`).
    let mut room = ReadRoom::default();
    'read: loop {
        loop {
            match decoder.decode(&mut buffer) {
                Ok(Some(command)) => {
                    frame_started = None;
                    let claim = Claim::new(budget.clone(), std::mem::take(&mut charged));
                    if shard.stopping.load(std::sync::atomic::Ordering::Relaxed) {
                        // Stopping: refused at once, as on a native connection
                        // (`connection::serve`), so the drain waits only for what came before.
                        drop(claim);
                        if let Some(frames) = dispatch::refuse_while_stopping(&command) {
                            let _ = answers.send(frames).await;
                        }
                        continue;
                    }
                    let Ok(permit) = permits.acquire_static_permit(1).await else {
                        break 'read;
                    };
                    let shard = shard.clone();
                    let connection = connection.clone();
                    let session = session.clone();
                    let answers = answers.clone();
                    shard.request_started(REQUEST_KIND);
                    glommio::spawn_local(async move {
                        let answer = dispatch::handle(&shard, &connection, &session, command).await;
                        drop(claim);
                        if let Some(frames) = answer {
                            let _ = answers.send(frames).await;
                        }
                        shard.request_finished(REQUEST_KIND);
                        drop(permit);
                    })
                    .detach();
                }
                Ok(None) => break,
                Err(error) => {
                    // RocketMQ closes a connection whose frame it cannot decode; a request whose
                    // header is unreadable has no opaque to answer to either.
                    warn!(%peer, %error, "closing a remoting connection after a frame it could not decode");
                    break 'read;
                }
            }
        }
        // Admission: the frame at the front is charged in full before more of it is read.
        if let Some(front) = announced_frame_bytes(&buffer) {
            if front > charged {
                budget.acquire(front - charged).await;
                charged = front;
                frame_started = Some(Instant::now());
                buffer.reserve(front.saturating_sub(buffer.len()));
            }
        }
        if !buffer.is_empty() && frame_started.is_none() {
            frame_started = Some(Instant::now());
        }
        if shard.stopping.load(std::sync::atomic::Ordering::Relaxed) {
            break;
        }
        buffer.reserve(READ_CHUNK_BYTES);
        let start = buffer.len();
        room.offer(&mut buffer, READ_CHUNK_BYTES);
        // A frame under way must arrive whole in time; between frames a client may be quiet.
        let read = match frame_started {
            Some(started) => {
                let remaining =
                    (started + frame_read_timeout).saturating_duration_since(Instant::now());
                futures_lite::future::or(
                    async { Some(reader.read(&mut buffer[start..]).await) },
                    async {
                        glommio::timer::sleep(remaining).await;
                        None
                    },
                )
                .await
            }
            None => Some(reader.read(&mut buffer[start..]).await),
        };
        let received = match &read {
            Some(Ok(n)) => *n,
            _ => 0,
        };
        room.received(&mut buffer, start, received);
        match read {
            None => {
                warn!(%peer, buffered = buffer.len(), "closing a remoting connection: a frame did not arrive whole within {frame_read_timeout:?}");
                break;
            }
            Some(Ok(0)) | Some(Err(_)) => break,
            Some(Ok(_)) => {}
        }
    }
    drop(buffer);
    budget.release(charged);
    shard.unregister_connection(connection_id);
    let _ = permits.acquire(inflight_limit as u64).await;
    drop(connection);
    push_task.cancel();
    drop(answers);
    writer_task.await;
    debug!(%peer, connection_id, "remoting connection closed");
}

/// The whole size of the frame at the front of `buffer` once its length prefix is in (the
/// decoder refuses a length out of bounds before anything of it is charged or buffered).
fn announced_frame_bytes(buffer: &[u8]) -> Option<usize> {
    let prefix: [u8; 4] = buffer.get(..4)?.try_into().ok()?;
    let length = i32::from_be_bytes(prefix);
    usize::try_from(length).ok().map(|length| length + 4)
}

/// Forwards what the broker pushes to this client, as RocketMQ's requests (both oneway, as
/// RocketMQ sends them): a consumer group's members changed becomes NOTIFY_CONSUMER_IDS_CHANGED,
/// a transaction check-back CHECK_TRANSACTION_STATE ([`transaction::check_state_request`]).
/// Anything else has no remoting form and is dropped, logged.
async fn translate_pushes(
    shard: Rc<NetworkShard>,
    connection_id: u64,
    pushes: local_channel::LocalReceiver<Outbound>,
    answers: Rc<local_channel::LocalSender<Outbound>>,
) {
    let native = shardmq_schema::FrameDecoder::new();
    while let Some(frames) = pushes.recv().await {
        for frame in frames {
            let Some(verified) = frame
                .get(shardmq_schema::FRAME_LENGTH_PREFIX_BYTES..)
                .and_then(|bytes| native.verify(frame.slice_ref(bytes)).ok())
            else {
                continue;
            };
            let notice = verified.frame();
            let command = if let Some(changed) = notice.body_as_consumer_ids_changed_notice() {
                RemotingCommand::request(request::NOTIFY_CONSUMER_IDS_CHANGED, 0)
                    .with_ext(
                        "consumerGroup",
                        changed.consumer_group().unwrap_or_default(),
                    )
                    .with_oneway()
            } else if notice.body_type() == wire::Body::CheckTransactionStateRequest {
                match transaction::check_state_request(&shard, &verified) {
                    Ok((command, unknown)) => {
                        shard.client_calls.complete(connection_id, unknown);
                        command
                    }
                    Err(refusal) => {
                        warn!(message = %refusal.message, "a check-back cannot be sent to a RocketMQ client");
                        continue;
                    }
                }
            } else {
                debug!(
                    body = ?notice.body_type(),
                    "a push with no remoting form is not sent to a RocketMQ client"
                );
                continue;
            };
            let mut bytes = BytesMut::new();
            if encode_frame(&command, usize::MAX, &mut bytes).is_ok() {
                let _ = answers.send(vec![bytes.freeze()]).await;
            }
        }
    }
}
