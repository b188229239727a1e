//! One connection from a slave to its master, speaking the ordinary frame protocol: handshake,
//! join, replica pulls, and the copies of topics, consumer offsets and per-shard state files
//! that the slave's control tasks make. Every answer the master refuses becomes an error naming
//! what was refused. When the master enforces access control (its handshake answer carries an
//! `auth_nonce`), the link authenticates with the broker's account right after the handshake;
//! the master serves replica requests to admin accounts only.

use std::io;
use std::net::SocketAddr;

use bytes::BytesMut;
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use shardmq_schema::{build_frame, wire, FrameDecoder, FrameEncoder, FrameHeader, VerifiedFrame};

use shardmq_acl::Credentials;

use crate::config::BrokerConfig;
use crate::peer_auth;
use crate::role::own_address;
use crate::store::epochs::{Epoch, EpochLog};
use crate::tls_link::LinkStream;

use super::{JoinAnswer, ReplicaChunk, SlaveTail, REPLICA_PULL_BYTES, REPLICA_SUSPEND_MS};

/// How long connecting to the master (TCP, and TLS when configured) may take.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// One connection to the master, speaking the ordinary frame protocol.
pub struct MasterLink {
    address: SocketAddr,
    stream: LinkStream,
    decoder: FrameDecoder,
    encoder: FrameEncoder,
    buffer: BytesMut,
    next_request_id: u64,
}

/// The frame of the master's answer to `what`, unless the master refused it (then an error with
/// its status and message).
fn require_ok<'a>(answer: &'a VerifiedFrame, what: &str) -> io::Result<wire::Frame<'a>> {
    let frame = answer.frame();
    if frame.status() != wire::Status::OK {
        return Err(io::Error::other(format!(
            "the master refused {what} ({:?}): {}",
            frame.status(),
            frame.message().unwrap_or_default()
        )));
    }
    Ok(frame)
}

impl MasterLink {
    /// Connects (in TLS when the broker has a CA to trust), shakes hands and, when the master
    /// challenges and `credentials` are given, authenticates (`crate::peer_auth::credentials`
    /// gives the broker's account).
    pub async fn connect(
        address: SocketAddr,
        client_id: &str,
        credentials: Option<&Credentials>,
    ) -> io::Result<MasterLink> {
        let stream = LinkStream::connect(address, CONNECT_TIMEOUT).await?;
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
            .request(|b, header| shardmq_schema::build_handshake_request(b, &header, client_id))
            .await?;
        let handshake = require_ok(&answer, &format!("the handshake at {address}"))?;
        let server = format!("the master at {address}");
        if let Some(auth) =
            peer_auth::answer(credentials, &handshake, &server).map_err(io::Error::other)?
        {
            let answer = link.request(|b, header| auth.build(b, &header)).await?;
            peer_auth::accepted(&answer.frame(), &server, auth.access_key())
                .map_err(|refusal| io::Error::new(io::ErrorKind::PermissionDenied, refusal))?;
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
        // Under TLS, written bytes may wait in the session until flushed.
        self.stream.flush().await?;
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

    /// Joins the master for one storage shard: says who this slave is and what its log holds,
    /// and learns the master's terms and where their shared bytes end.
    pub(super) async fn join(
        &mut self,
        config: &BrokerConfig,
        storage_shard: usize,
        end: u64,
        epochs: &EpochLog,
    ) -> io::Result<JoinAnswer> {
        let own = own_address().map(|a| a.to_string()).unwrap_or_default();
        let answer = self
            .request(|b, header| {
                let cluster = b.create_string(&config.cluster_name);
                let broker = b.create_string(&config.broker_name);
                let address = b.create_string(&own);
                let entries: Vec<wire::EpochEntry> = epochs
                    .entries()
                    .iter()
                    .map(|e| wire::EpochEntry::new(e.epoch, e.start))
                    .collect();
                let entries = b.create_vector(&entries);
                let incarnations: Vec<u64> =
                    epochs.entries().iter().map(|e| e.incarnation).collect();
                let incarnations = b.create_vector(&incarnations);
                let body = wire::ReplicaJoinRequest::create(
                    b,
                    &wire::ReplicaJoinRequestArgs {
                        cluster_name: Some(cluster),
                        broker_name: Some(broker),
                        broker_id: config.broker_id,
                        storage_shards: config.storage_cores.len() as u32,
                        storage_shard: storage_shard as u32,
                        end,
                        epochs: Some(entries),
                        slave_address: Some(address),
                        epoch_incarnations: Some(incarnations),
                    },
                );
                build_frame(
                    b,
                    &header,
                    wire::Body::ReplicaJoinRequest,
                    Some(body.as_union_value()),
                )
            })
            .await?;
        let body = require_ok(&answer, "the join")?
            .body_as_replica_join_response()
            .ok_or_else(|| io::Error::other("a ReplicaJoinResponse without its body"))?;
        let incarnations = body.epoch_incarnations();
        Ok(JoinAnswer {
            epoch: body.epoch(),
            epochs: body
                .epochs()
                .iter()
                .flat_map(|v| v.iter())
                .enumerate()
                .map(|(index, e)| Epoch {
                    epoch: e.epoch(),
                    start: e.start(),
                    incarnation: incarnations
                        .filter(|v| index < v.len())
                        .map_or(0, |v| v.get(index)),
                })
                .collect(),
            master_end: body.master_end(),
            consistent_end: body.consistent_end(),
            log_start: body.log_start(),
            tail: match body.tail() {
                wire::ReplicaTail::RETURN => SlaveTail::Return {
                    end: body.tail_end(),
                },
                wire::ReplicaTail::KEEP => SlaveTail::Keep {
                    end: body.tail_end(),
                },
                _ => SlaveTail::Cut,
            },
        })
    }

    /// Returns `data`, this slave's CommitLog bytes of `storage_shard` from `from`, to a master
    /// that asked for them (its log lost them); `last` with the final piece. The answer is
    /// where the master's log ends.
    pub(super) async fn return_bytes(
        &mut self,
        storage_shard: usize,
        broker_id: i64,
        from: u64,
        data: &[u8],
        last: bool,
    ) -> io::Result<u64> {
        let answer = self
            .request(|b, header| {
                let data = b.create_vector(data);
                let body = wire::ReplicaReturnRequest::create(
                    b,
                    &wire::ReplicaReturnRequestArgs {
                        storage_shard: storage_shard as u32,
                        broker_id,
                        from,
                        data: Some(data),
                        last,
                    },
                );
                build_frame(
                    b,
                    &header,
                    wire::Body::ReplicaReturnRequest,
                    Some(body.as_union_value()),
                )
            })
            .await?;
        let body = require_ok(&answer, "the returned bytes")?
            .body_as_replica_return_response()
            .ok_or_else(|| io::Error::other("a ReplicaReturnResponse without its body"))?;
        Ok(body.end())
    }

    /// The CommitLog bytes of `storage_shard` from `from`, in master term `epoch`.
    pub(super) async fn pull(
        &mut self,
        storage_shard: usize,
        from: u64,
        acknowledged: u64,
        broker_id: i64,
        epoch: u64,
    ) -> io::Result<ReplicaChunk> {
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
                        epoch,
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
        let body = require_ok(&answer, "the pull")?
            .body_as_replica_pull_response()
            .ok_or_else(|| io::Error::other("a ReplicaPullResponse without its body"))?;
        if body.from() != from {
            return Err(io::Error::other(format!(
                "the master answered for {} when asked for {from}",
                body.from()
            )));
        }
        let bytes = body
            .data()
            .and_then(|data| answer.share(data.bytes()))
            .unwrap_or_default();
        Ok(ReplicaChunk {
            bytes,
            master_end: body.master_end(),
            epoch: body.epoch(),
            lag_ms: body.lag_ms(),
            confirmed: body.confirmed(),
        })
    }
}

impl MasterLink {
    /// One of the master's state files of `storage_shard` (`None`: it has none) and the
    /// master's CommitLog end when it read it.
    pub(super) async fn file(
        &mut self,
        storage_shard: usize,
        name: &str,
    ) -> io::Result<Option<(Vec<u8>, u64)>> {
        let answer = self
            .request(|b, header| {
                let name = b.create_string(name);
                let body = wire::ReplicaFileRequest::create(
                    b,
                    &wire::ReplicaFileRequestArgs {
                        storage_shard: storage_shard as u32,
                        name: Some(name),
                    },
                );
                build_frame(
                    b,
                    &header,
                    wire::Body::ReplicaFileRequest,
                    Some(body.as_union_value()),
                )
            })
            .await?;
        let body = require_ok(&answer, name)?
            .body_as_replica_file_response()
            .ok_or_else(|| io::Error::other("a ReplicaFileResponse without its body"))?;
        Ok(body.present().then(|| {
            (
                body.data().map(|d| d.bytes().to_vec()).unwrap_or_default(),
                body.master_end(),
            )
        }))
    }

    /// A page of the committed consumer offsets of the master's `storage_shard`, after
    /// (group, topic, queue) `after` (from the first when `None`), and whether more follow.
    pub async fn offsets_page(
        &mut self,
        storage_shard: usize,
        after: Option<&(String, String, u32)>,
    ) -> io::Result<(Vec<super::OffsetRow>, bool)> {
        let answer = self
            .request(|b, header| {
                let (group, topic) = match after {
                    Some((g, t, _)) => (Some(b.create_string(g)), Some(b.create_string(t))),
                    None => (None, None),
                };
                let body = wire::ReplicaOffsetsRequest::create(
                    b,
                    &wire::ReplicaOffsetsRequestArgs {
                        storage_shard: storage_shard as u32,
                        has_cursor: after.is_some(),
                        after_group: group,
                        after_topic: topic,
                        after_queue_id: after.map_or(0, |(_, _, q)| *q),
                    },
                );
                build_frame(
                    b,
                    &header,
                    wire::Body::ReplicaOffsetsRequest,
                    Some(body.as_union_value()),
                )
            })
            .await?;
        let body = require_ok(&answer, "consumer offsets")?
            .body_as_replica_offsets_response()
            .ok_or_else(|| io::Error::other("a ReplicaOffsetsResponse without its body"))?;
        let rows = body
            .rows()
            .iter()
            .flat_map(|v| v.iter())
            .map(|r| {
                (
                    r.group().unwrap_or_default().to_owned(),
                    r.topic().unwrap_or_default().to_owned(),
                    r.queue_id(),
                    r.offset(),
                )
            })
            .collect();
        Ok((rows, body.more()))
    }

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
}
