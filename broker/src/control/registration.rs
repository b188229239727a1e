//! Announcing the broker to its name servers: register at start, every
//! `register_interval_ms` (30 s) and right after a topic change; unregister on clean shutdown.
//!
//! Runs on network shard 0, one task per name server, each over one long-lived connection
//! (RocketMQ's brokers do the same): a name server drops a broker whose connection closes, so
//! when this process dies its kernel closes the connections and clients stop being routed to
//! it at once, instead of after the name server's broker timeout (120 s). The connection is
//! checked every 100 ms; one the name server closed (a restart) is opened again and the broker
//! registers at once. An unreachable name server costs a logged warning and a retry a second.
//!
//! Every registration carries the controller epoch as its state version: a name server refuses
//! a master registration below the highest it has seen for the broker name, so a deposed
//! master that wakes from a pause cannot take the route back from the master that replaced it.
//!
//! A name server that enforces access control challenges in its handshake answer; the broker
//! answers with its account (`access_key`/`secret_key`, which must be an admin account there)
//! before registering, and a refused account fails the connection like any other failure.

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_lite::{future, AsyncReadExt, AsyncWriteExt};
use shardmq_schema::{build_frame, wire, FrameDecoder, FrameEncoder, FrameHeader, VerifiedFrame};
use shardmq_services::tls_link::LinkStream;
use tracing::{debug, info, warn};

use shardmq_services::peer_auth;

use crate::config::BrokerConfig;
use crate::network::NetworkShard;

const CALL_TIMEOUT: Duration = Duration::from_secs(3);
/// How often the connection is checked for having been closed by the name server.
const CHECK_INTERVAL: Duration = Duration::from_millis(100);
/// Wait before connecting again after a failure.
const RETRY_INTERVAL: Duration = Duration::from_secs(1);

pub async fn run(shard: Rc<NetworkShard>) {
    let links: Vec<_> = shard
        .config
        .namesrv
        .iter()
        .map(|address| glommio::spawn_local(keep_registered(shard.clone(), address.clone())))
        .collect();
    for link in links {
        link.await;
    }
}

/// Keeps this broker registered with the name server at `address` until the broker stops,
/// then unregisters.
async fn keep_registered(shard: Rc<NetworkShard>, address: String) {
    let interval = Duration::from_millis(shard.config.register_interval_ms.max(10));
    let mut link: Option<Link> = None;
    let mut registered_version = u64::MAX;
    let mut next_round = Instant::now();
    loop {
        if shard.stopping.load(Ordering::Relaxed) {
            break;
        }
        if link.as_ref().is_some_and(|l| !l.is_open()) {
            info!(namesrv = %address, "the name server closed the registration connection; registering again");
            link = None;
            next_round = Instant::now();
        }
        let version = shard.topics().version;
        if version != registered_version || Instant::now() >= next_round {
            match register_once(&shard, &address, &mut link).await {
                Ok(()) => {
                    registered_version = version;
                    next_round = Instant::now() + interval;
                }
                Err(e) => {
                    warn!(namesrv = %address, error = %e, "cannot register with namesrv");
                    link = None;
                    // Retried after a second, whether or not the topics change meanwhile.
                    registered_version = version;
                    next_round = Instant::now() + RETRY_INTERVAL;
                }
            }
        }
        future::or(
            shard.changed.notified(),
            glommio::timer::sleep(CHECK_INTERVAL),
        )
        .await;
    }
    unregister(&shard, &address, link).await;
}

/// One registration over `link` (connected first when there is none). An answer that refuses
/// the registration is logged, not an error: the connection is fine.
async fn register_once(
    shard: &NetworkShard,
    address: &str,
    link: &mut Option<Link>,
) -> Result<(), String> {
    let frame =
        encode_register(shard).map_err(|e| format!("cannot encode the registration: {e}"))?;
    if link.is_none() {
        *link = Some(Link::connect(address, &shard.config).await?);
    }
    let answer = link.as_mut().expect("connected above").call(frame).await?;
    if answer.frame().status() != wire::Status::OK {
        warn!(
            namesrv = %address,
            status = ?answer.frame().status(),
            message = answer.frame().message().unwrap_or(""),
            "namesrv refused the registration"
        );
        return Ok(());
    }
    debug!(namesrv = %address, "registered");
    // A slave without ha_master learns its master's HA address here.
    let named = answer
        .frame()
        .body_as_register_broker_response()
        .and_then(|r| r.ha_server_address())
        .and_then(|a| a.parse().ok());
    if let Some(ha) = named {
        if shard.config.role() == crate::config::BrokerRole::Slave
            && shard.config.ha_master.is_empty()
        {
            crate::role::learn_master(ha);
        }
    }
    Ok(())
}

async fn unregister(shard: &NetworkShard, address: &str, link: Option<Link>) {
    let config = &shard.config;
    let own_address = shard.store_host.get().to_string();
    let frame = FrameEncoder::new().encode(|b| {
        let cluster = b.create_string(&config.cluster_name);
        let broker = b.create_string(&config.broker_name);
        let own_address = b.create_string(&own_address);
        let body = wire::UnregisterBrokerRequest::create(
            b,
            &wire::UnregisterBrokerRequestArgs {
                cluster_name: Some(cluster),
                broker_name: Some(broker),
                broker_id: config.broker_id,
                broker_address: Some(own_address),
            },
        );
        build_frame(
            b,
            &FrameHeader::request(2),
            wire::Body::UnregisterBrokerRequest,
            Some(body.as_union_value()),
        )
    });
    let Ok(frame) = frame else { return };
    let mut link = match link {
        Some(link) => link,
        None => match Link::connect(address, config).await {
            Ok(link) => link,
            Err(e) => {
                warn!(namesrv = %address, error = %e, "cannot unregister from namesrv");
                return;
            }
        },
    };
    match link.call(frame).await {
        Ok(_) => info!(namesrv = %address, "unregistered"),
        Err(e) => warn!(namesrv = %address, error = %e, "cannot unregister from namesrv"),
    }
}

/// RocketMQ's default topic (`TBW102`): a broker that creates topics on first send registers
/// it, so a RocketMQ producer whose topic has no route yet takes this route instead and sends
/// there, naming its own topic, which the broker then creates (`docs/protocol.md`, "RocketMQ
/// remoting"). The broker hosts no such topic itself.
pub const AUTO_CREATE_TOPIC: &str = "TBW102";

fn auto_create_topic(queues: u32) -> crate::topics::TopicConfig {
    let mut config = crate::topics::TopicConfig::new(AUTO_CREATE_TOPIC, queues);
    config.perm |= crate::topics::PERM_INHERIT;
    config
}

fn encode_register(shard: &NetworkShard) -> Result<Bytes, shardmq_schema::FrameError> {
    let config = &shard.config;
    let table = shard.topics();
    let address = shard.store_host.get().to_string();
    let ha_address = shard.ha_host.get().map(|a| a.to_string());
    FrameEncoder::with_max_frame_bytes(config.max_frame_bytes).encode(|b| {
        let ha_address = ha_address.as_deref().map(|a| b.create_string(a));
        let mut topics: Vec<_> = table.topics.values().map(|t| t.to_wire(b)).collect();
        if config.auto_create_topics && !table.topics.contains_key(AUTO_CREATE_TOPIC) {
            topics.push(auto_create_topic(config.default_topic_queues).to_wire(b));
        }
        let topics = b.create_vector(&topics);
        let cluster = b.create_string(&config.cluster_name);
        let broker = b.create_string(&config.broker_name);
        let address = b.create_string(&address);
        let body = wire::RegisterBrokerRequest::create(
            b,
            &wire::RegisterBrokerRequestArgs {
                cluster_name: Some(cluster),
                broker_name: Some(broker),
                broker_id: config.broker_id,
                broker_address: Some(address),
                ha_server_address: ha_address,
                topics: Some(topics),
                topic_config_version: table.version,
                state_version: config.controller_epoch,
            },
        );
        build_frame(
            b,
            &FrameHeader::request(2),
            wire::Body::RegisterBrokerRequest,
            Some(body.as_union_value()),
        )
    })
}

/// One long-lived connection to a name server, past its handshake.
struct Link {
    stream: LinkStream,
    decoder: FrameDecoder,
    buffer: BytesMut,
}

impl Link {
    /// Connects, shakes hands and, when the name server challenges, authenticates with the
    /// broker's account.
    async fn connect(address: &str, config: &BrokerConfig) -> Result<Self, String> {
        let server = format!("the name server at {address}");
        let address: SocketAddr = address.parse().map_err(|e| format!("bad address: {e}"))?;
        let work = async {
            let stream = LinkStream::connect(address, CALL_TIMEOUT)
                .await
                .map_err(|e| format!("connect: {e}"))?;
            let mut link = Link {
                stream,
                decoder: FrameDecoder::new(),
                buffer: BytesMut::new(),
            };
            let handshake = FrameEncoder::new()
                .encode(|b| {
                    shardmq_schema::build_handshake_request(
                        b,
                        &FrameHeader::request(1),
                        "shardmq-broker",
                    )
                })
                .map_err(|e| e.to_string())?;
            let answer = link.exchange(handshake).await?;
            if answer.frame().status() != wire::Status::OK {
                return Err(format!("handshake refused: {:?}", answer.frame().status()));
            }
            let credentials = peer_auth::credentials(config);
            if let Some(auth) = peer_auth::answer(credentials.as_ref(), &answer.frame(), &server)? {
                let request = FrameEncoder::new()
                    .encode(|b| auth.build(b, &FrameHeader::request(3)))
                    .map_err(|e| e.to_string())?;
                let answer = link.exchange(request).await?;
                peer_auth::accepted(&answer.frame(), &server, auth.access_key())?;
            }
            Ok(link)
        };
        with_timeout(work).await
    }

    /// Sends `request` and returns its answer (the name server answers in order).
    async fn call(&mut self, request: Bytes) -> Result<VerifiedFrame, String> {
        with_timeout(self.exchange(request)).await
    }

    async fn exchange(&mut self, request: Bytes) -> Result<VerifiedFrame, String> {
        self.stream
            .write_all(&request)
            .await
            .map_err(|e| format!("write: {e}"))?;
        // Under TLS, written bytes may wait in the session until flushed.
        self.stream
            .flush()
            .await
            .map_err(|e| format!("write: {e}"))?;
        read_frame(&mut self.stream, &self.decoder, &mut self.buffer).await
    }

    /// Whether the name server has not closed the connection (nor sent anything unasked,
    /// which it never does): a non-blocking peek, so nothing is taken from the stream.
    fn is_open(&self) -> bool {
        let mut byte = 0u8;
        // SAFETY: peeks at most one byte into `byte`, which outlives the call.
        let peeked = unsafe {
            libc::recv(
                self.stream.as_raw_fd(),
                (&mut byte as *mut u8).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if peeked < 0 {
            let error = std::io::Error::last_os_error();
            return matches!(
                error.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
            );
        }
        // 0: the peer closed; 1: bytes nobody asked for, so the stream is out of step.
        false
    }
}

async fn with_timeout<T>(
    work: impl std::future::Future<Output = Result<T, String>>,
) -> Result<T, String> {
    future::or(work, async {
        glommio::timer::sleep(CALL_TIMEOUT * 2).await;
        Err("timed out".to_string())
    })
    .await
}

async fn read_frame(
    stream: &mut LinkStream,
    decoder: &FrameDecoder,
    buffer: &mut BytesMut,
) -> Result<VerifiedFrame, String> {
    loop {
        if let Some(frame) = decoder.decode(buffer).map_err(|e| e.to_string())? {
            return Ok(frame);
        }
        let mut chunk = [0u8; 4096];
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err("connection closed".into());
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
}
