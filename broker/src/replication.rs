//! Master/slave replication, asynchronous or synchronous (docs/replication.md).
//!
//! A slave pulls its master's CommitLog over an ordinary connection to the master's HA address,
//! one loop per storage shard, run on that storage shard's own executor: the bytes land in that
//! shard's store, so the socket work is done where they are appended and no copy crosses cores.
//! Each `ReplicaPullRequest` names where the slave's log ends (so it also acknowledges what it
//! holds); the master's storage shard answers with the bytes from there
//! ([`MessageStore::read_for_replica`]), holding the request while it has nothing new, and the
//! slave appends them ([`MessageStore::append_replicated`]) and, once they are written (synced
//! under sync flush), acknowledges them with its next pull; a sync master's sends wait for that
//! acknowledgement (`storage_shard.rs`). Network shard 0 of a slave copies the master's topic
//! table every 2 s and its consumer offsets every 10 s.
//!
//! Owns the slave's side and the master's storage-side answer; the master's request handler is
//! in `network::handlers`.

use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use shardmq_schema::{
    build_frame, wire, FrameDecoder, FrameEncoder, FrameHeader, VerifiedFrame,
    MIN_PROTOCOL_VERSION, PROTOCOL_VERSION,
};
use tracing::{info, warn};

use crate::config::BrokerConfig;
use crate::store::{MessageStore, StoreError};

/// Most bytes one replica pull asks for.
pub const REPLICA_PULL_BYTES: u32 = 4 << 20;
/// How long the master holds a replica pull that finds nothing new.
pub const REPLICA_SUSPEND_MS: u32 = 1_000;
/// Pause before reconnecting to a master that could not be reached or answered with an error.
const RECONNECT_PAUSE: Duration = Duration::from_secs(1);
/// How often a slave copies its master's topic table.
pub const TOPIC_SYNC_INTERVAL: Duration = Duration::from_secs(2);

/// One connection to the master, speaking the ordinary frame protocol.
pub struct MasterLink {
    address: SocketAddr,
    stream: TcpStream,
    decoder: FrameDecoder,
    encoder: FrameEncoder,
    buffer: BytesMut,
    next_request_id: u64,
}

impl MasterLink {
    /// Connects and shakes hands.
    pub async fn connect(address: SocketAddr, client_id: &str) -> io::Result<MasterLink> {
        let stream = TcpStream::connect(address).await.map_err(io::Error::from)?;
        let _ = stream.set_nodelay(true);
        let mut link = MasterLink {
            address,
            stream,
            decoder: FrameDecoder::with_max_frame_bytes(
                2 * shardmq_schema::DEFAULT_MAX_FRAME_BYTES,
            ),
            encoder: FrameEncoder::new(),
            buffer: BytesMut::with_capacity(64 << 10),
            next_request_id: 1,
        };
        let answer = link
            .request(|b, header| {
                let client_id = b.create_string(client_id);
                let body = wire::HandshakeRequest::create(
                    b,
                    &wire::HandshakeRequestArgs {
                        protocol_version: PROTOCOL_VERSION,
                        min_protocol_version: MIN_PROTOCOL_VERSION,
                        client_id: Some(client_id),
                        client_version: None,
                    },
                );
                build_frame(
                    b,
                    &header,
                    wire::Body::HandshakeRequest,
                    Some(body.as_union_value()),
                )
            })
            .await?;
        if answer.frame().status() != wire::Status::OK {
            return Err(io::Error::other(format!(
                "the master at {address} refused the handshake: {:?}",
                answer.frame().status()
            )));
        }
        Ok(link)
    }

    /// Sends one request and reads its answer (the link has one request in flight at a time).
    pub async fn request(
        &mut self,
        build: impl FnOnce(
            &mut flatbuffers::FlatBufferBuilder<'static>,
            FrameHeader<'static>,
        ) -> flatbuffers::WIPOffset<wire::Frame<'static>>,
    ) -> io::Result<VerifiedFrame> {
        let id = self.next_request_id;
        self.next_request_id += 1;
        let frame = self
            .encoder
            .encode(|b| build(b, FrameHeader::request(id)))
            .map_err(io::Error::other)?;
        self.stream.write_all(&frame).await?;
        loop {
            if let Some(frame) = self
                .decoder
                .decode(&mut self.buffer)
                .map_err(io::Error::other)?
            {
                if frame.frame().request_id() == id {
                    return Ok(frame);
                }
                continue;
            }
            // Into the room the decoder reserved for a frame under way (up to 4 MiB at once).
            let start = self.buffer.len();
            let room = (self.buffer.capacity() - start).clamp(64 << 10, 4 << 20);
            self.buffer.resize(start + room, 0);
            let read = self.stream.read(&mut self.buffer[start..]).await?;
            self.buffer.truncate(start + read);
            if read == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("the master at {} closed the connection", self.address),
                ));
            }
        }
    }

    /// The CommitLog bytes of `storage_shard` from `from`: `(data, master's end)`.
    async fn pull(
        &mut self,
        storage_shard: usize,
        from: u64,
        acknowledged: u64,
        broker_id: i64,
    ) -> io::Result<(Bytes, u64)> {
        let answer = self
            .request(|b, header| {
                let body = wire::ReplicaPullRequest::create(
                    b,
                    &wire::ReplicaPullRequestArgs {
                        storage_shard: storage_shard as u32,
                        from,
                        max_bytes: REPLICA_PULL_BYTES,
                        suspend_timeout_ms: REPLICA_SUSPEND_MS,
                        broker_id,
                        slave_address: None,
                        acknowledged,
                    },
                );
                build_frame(
                    b,
                    &header,
                    wire::Body::ReplicaPullRequest,
                    Some(body.as_union_value()),
                )
            })
            .await?;
        let frame = answer.frame();
        if frame.status() != wire::Status::OK {
            return Err(io::Error::other(format!(
                "the master answered {:?}: {}",
                frame.status(),
                frame.message().unwrap_or_default()
            )));
        }
        let body = frame
            .body_as_replica_pull_response()
            .ok_or_else(|| io::Error::other("a ReplicaPullResponse without its body"))?;
        if body.from() != from {
            return Err(io::Error::other(format!(
                "the master answered for {} when asked for {from}",
                body.from()
            )));
        }
        let data = body
            .data()
            .and_then(|data| answer.share(data.bytes()))
            .unwrap_or_default();
        Ok((data, body.master_end()))
    }
}

/// The slave's replication loop for one storage shard: pulls from the master's HA address and
/// appends, reconnecting after any failure, until cancelled.
pub async fn follow(storage_shard: usize, config: Rc<BrokerConfig>, store: MessageStore) {
    let Ok(master) = config.ha_master.parse::<SocketAddr>() else {
        return;
    };
    let client_id = format!(
        "{}-slave-{}-{storage_shard}",
        config.broker_name, config.broker_id
    );
    let mut was_connected = true;
    loop {
        let mut link = match MasterLink::connect(master, &client_id).await {
            Ok(link) => {
                info!(storage_shard, %master, "replicating from the master");
                was_connected = true;
                link
            }
            Err(error) => {
                if was_connected {
                    warn!(storage_shard, %master, %error, "cannot reach the master; retrying every second");
                    was_connected = false;
                }
                glommio::timer::sleep(RECONNECT_PAUSE).await;
                continue;
            }
        };
        loop {
            let from = store.commitlog_offsets().1;
            let acknowledged = store.visible_offset();
            let pull = link.pull(storage_shard, from, acknowledged, config.broker_id);
            let (data, _master_end) = match pull.await {
                Ok(answer) => answer,
                Err(error) => {
                    warn!(storage_shard, %master, %error, "replication from the master stopped; reconnecting");
                    break;
                }
            };
            if data.is_empty() {
                continue;
            }
            match store.append_replicated(from, &data).await {
                // Acknowledged with the next pull once written (synced under sync flush): a
                // sync master's sends wait for that.
                Ok(_) => store.wait_visible_to_current_end().await,
                Err(StoreError::Busy { .. }) => {
                    // The disk is behind: let it catch up, then ask again from the same end.
                    glommio::timer::sleep(Duration::from_millis(10)).await;
                }
                Err(error) => {
                    warn!(storage_shard, %master, %error, "replicated bytes refused");
                    glommio::timer::sleep(RECONNECT_PAUSE).await;
                    break;
                }
            }
        }
        glommio::timer::sleep(RECONNECT_PAUSE).await;
    }
}

/// How often a slave copies its master's consumer offsets (RocketMQ's 10 s).
pub const OFFSET_SYNC_INTERVAL: Duration = Duration::from_secs(10);

impl MasterLink {
    /// The master's topic configs, user and system topics.
    pub async fn topics(&mut self) -> io::Result<Vec<crate::topics::TopicConfig>> {
        let answer = self
            .request(|b, header| {
                let body = wire::BrokerTopicsRequest::create(
                    b,
                    &wire::BrokerTopicsRequestArgs {
                        include_system: true,
                    },
                );
                build_frame(
                    b,
                    &header,
                    wire::Body::BrokerTopicsRequest,
                    Some(body.as_union_value()),
                )
            })
            .await?;
        let topics = answer
            .frame()
            .body_as_broker_topics_response()
            .and_then(|r| r.topics())
            .ok_or_else(|| io::Error::other("a BrokerTopicsResponse without topics"))?;
        Ok(topics
            .iter()
            .map(|t| crate::topics::TopicConfig::from_wire(&t))
            .collect())
    }

    /// The master's consumer groups and the topics each has offsets for or subscribes to.
    pub async fn groups(&mut self) -> io::Result<Vec<(String, Vec<String>)>> {
        let answer = self
            .request(|b, header| {
                let body = wire::GroupListRequest::create(b, &wire::GroupListRequestArgs {});
                build_frame(
                    b,
                    &header,
                    wire::Body::GroupListRequest,
                    Some(body.as_union_value()),
                )
            })
            .await?;
        let groups = answer
            .frame()
            .body_as_group_list_response()
            .and_then(|r| r.groups())
            .ok_or_else(|| io::Error::other("a GroupListResponse without groups"))?;
        Ok(groups
            .iter()
            .map(|g| {
                let topics = g
                    .topics()
                    .iter()
                    .flat_map(|t| t.iter())
                    .map(str::to_owned)
                    .collect();
                (g.group().unwrap_or_default().to_owned(), topics)
            })
            .collect())
    }

    /// The master's committed offset of `group` for one queue, if it has one.
    pub async fn committed_offset(
        &mut self,
        group: &str,
        topic: &str,
        queue_id: u32,
    ) -> io::Result<Option<u64>> {
        let answer = self
            .request(|b, header| {
                let (group, topic) = (b.create_string(group), b.create_string(topic));
                let body = wire::QueryConsumerOffsetRequest::create(
                    b,
                    &wire::QueryConsumerOffsetRequestArgs {
                        consumer_group: Some(group),
                        topic: Some(topic),
                        queue_id: queue_id as i32,
                    },
                );
                build_frame(
                    b,
                    &header,
                    wire::Body::QueryConsumerOffsetRequest,
                    Some(body.as_union_value()),
                )
            })
            .await?;
        Ok(answer
            .frame()
            .body_as_offset_response()
            .and_then(|r| u64::try_from(r.offset()).ok()))
    }
}
