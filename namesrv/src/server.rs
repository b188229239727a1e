//! The network side: the listener, one task per connection, and the scan that drops silent
//! brokers.
//!
//! Owns: sockets, read and write buffers, and every limit that protects the process from its
//! peers: `max_connections`, `max_frame_bytes` (and a small pre-handshake frame limit, so that
//! an unknown peer cannot make us buffer 16 MiB), `max_in_flight_per_connection` (requests
//! decoded but not yet written back, and at most 1 MiB of their answers), and `idle_timeout`
//! (a peer that neither sends nor reads for that long is dropped). Never: what a request
//! means (that is [`RequestHandler`]) or how routes are built (that is [`RouteTable`]).
//!
//! Data enters as bytes from sockets, passes through the shared `FrameDecoder` into the
//! handler, and leaves as the response bytes the handler appended, written in batches: all
//! the answers to the frames one read brought in go out in one write.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use shardmq_remoting::Sniffed;
use shardmq_schema::{wire, FrameDecoder, FrameEncoder, DEFAULT_MAX_FRAME_BYTES};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::time::{timeout, MissedTickBehavior};
use tracing::{debug, info, warn};

use crate::access::Access;
use crate::handler::{AfterFrame, RequestHandler, Session};
use crate::registry::{RegistryLimits, RouteTable};
use crate::remoting::{serve_remoting_connection, RemotingHandler};

/// What answers each protocol's requests.
#[derive(Debug)]
struct Handlers {
    native: RequestHandler,
    remoting: RemotingHandler,
}

/// Bytes a connection asks the socket for at once.
pub(crate) const READ_CHUNK_BYTES: usize = 16 * 1024;

/// Answers buffered for one write: past this the connection writes before it decodes more,
/// so that pipelined requests for large answers (topic lists) cannot pile up memory.
pub(crate) const MAX_PENDING_WRITE_BYTES: usize = 1024 * 1024;

/// Largest frame accepted before the handshake: a `HandshakeRequest` is a few hundred bytes.
const PRE_HANDSHAKE_MAX_FRAME_BYTES: usize = 64 * 1024;

/// After a fatal frame error, how long the server keeps reading (and discarding) what the peer
/// still sends, so that closing does not reset the connection before the peer has read the
/// error response.
const LINGER_ON_CLOSE: Duration = Duration::from_millis(500);

/// Most bytes discarded while lingering.
const LINGER_MAX_DISCARD_BYTES: usize = 1024 * 1024;

/// Pause after a failed accept (out of file descriptors, for instance) before the next one.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// How long shutdown waits for connections to finish their current batch.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Everything the server needs to run. [`Default`] gives RocketMQ's NameServer defaults.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// `host:port` to listen on; port 0 picks a free port ([`NamesrvServer::local_addr`]).
    pub listen: String,
    /// A broker that has not registered for this long is dropped (RocketMQ: 120 s).
    pub broker_timeout: Duration,
    /// How often to look for silent brokers (RocketMQ: 5 s).
    pub scan_interval: Duration,
    /// Connections served at once; more are answered `SYSTEM_BUSY` and closed.
    pub max_connections: usize,
    /// Largest frame accepted after the handshake (length prefix excluded), announced in
    /// `HandshakeResponse.max_frame_bytes`.
    pub max_frame_bytes: usize,
    /// Requests of one connection decoded but not yet answered on the wire: past this the
    /// server writes its answers before it decodes more.
    pub max_in_flight_per_connection: usize,
    /// A connection that neither delivers a byte nor accepts our answers for this long is
    /// closed (RocketMQ's `serverChannelMaxIdleTimeSeconds`: 120 s).
    pub idle_timeout: Duration,
    /// What the route table may hold.
    pub registry_limits: RegistryLimits,
    /// `host:port` where Prometheus metrics are served at `/metrics`; `None`: not served.
    pub metrics_listen: Option<String>,
    /// TLS on the listener (docs/tls.md); `None`: plain only.
    pub tls: Option<crate::tls::ListenerTls>,
    /// Access control (docs/acl.md): off by default (RocketMQ's name server has none).
    pub access: Arc<Access>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:9876".to_owned(),
            broker_timeout: Duration::from_secs(120),
            scan_interval: Duration::from_secs(5),
            max_connections: 10_000,
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            max_in_flight_per_connection: 128,
            idle_timeout: Duration::from_secs(120),
            registry_limits: RegistryLimits::default(),
            metrics_listen: None,
            tls: None,
            access: Access::off(),
        }
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {listen}: {source}")]
    Bind { listen: String, source: io::Error },
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
}

/// A bound name server, ready to [`run`](Self::run).
#[derive(Debug)]
pub struct NamesrvServer {
    listener: TcpListener,
    metrics_listener: Option<TcpListener>,
    config: ServerConfig,
    registry: Arc<Mutex<RouteTable>>,
}

impl NamesrvServer {
    /// Checks `config` and binds its listen address.
    pub async fn bind(config: ServerConfig) -> Result<Self, ServerError> {
        validate_config(&config)?;
        let listener =
            TcpListener::bind(&config.listen)
                .await
                .map_err(|source| ServerError::Bind {
                    listen: config.listen.clone(),
                    source,
                })?;
        let metrics_listener = match &config.metrics_listen {
            Some(listen) => {
                Some(
                    TcpListener::bind(listen)
                        .await
                        .map_err(|source| ServerError::Bind {
                            listen: listen.clone(),
                            source,
                        })?,
                )
            }
            None => None,
        };
        let registry = Arc::new(Mutex::new(RouteTable::new(config.registry_limits)));
        Ok(Self {
            listener,
            metrics_listener,
            config,
            registry,
        })
    }

    /// The address actually bound (the chosen port when the config said 0).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The metrics endpoint's address, when metrics are served.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_listener
            .as_ref()
            .and_then(|l| l.local_addr().ok())
    }

    /// Serves until `shutdown` completes, then stops accepting, tells every connection to
    /// close after its current batch, and waits up to 2 s for them.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let config = Arc::new(self.config);
        let handler = Arc::new(Handlers {
            native: RequestHandler::new(Arc::clone(&self.registry), config.max_frame_bytes)
                .with_access(Arc::clone(&config.access)),
            remoting: RemotingHandler::new(Arc::clone(&self.registry))
                .with_access(Arc::clone(&config.access)),
        });
        let reload = tokio::spawn(Arc::clone(&config.access).reload_until_stopped());
        let (stop_sender, stop_receiver) = watch::channel(false);
        let connection_slots = Arc::new(Semaphore::new(config.max_connections));
        let metrics = self.metrics_listener.map(|listener| {
            tokio::spawn(crate::metrics::serve(listener, Arc::clone(&self.registry)))
        });
        let scan = tokio::spawn(scan_silent_brokers(
            Arc::clone(&self.registry),
            config.broker_timeout,
            config.scan_interval,
        ));

        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, peer)) => admit(
                        stream,
                        peer,
                        &connection_slots,
                        &handler,
                        &config,
                        &stop_receiver,
                    ),
                    Err(accept_error) => {
                        warn!("accept failed: {accept_error}");
                        tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                    }
                },
            }
        }

        info!(
            "shutting down: closing the listener and {} connection(s)",
            config.max_connections - connection_slots.available_permits()
        );
        drop(self.listener);
        stop_sender.send_replace(true);
        scan.abort();
        reload.abort();
        if let Some(metrics) = metrics {
            metrics.abort();
        }
        let all_slots = u32::try_from(config.max_connections).unwrap_or(u32::MAX);
        if timeout(SHUTDOWN_GRACE, connection_slots.acquire_many(all_slots))
            .await
            .is_err()
        {
            warn!(
                "{} connection(s) still open after {} ms; leaving them",
                config.max_connections - connection_slots.available_permits(),
                SHUTDOWN_GRACE.as_millis()
            );
        }
    }
}

fn validate_config(config: &ServerConfig) -> Result<(), ServerError> {
    let checks = [
        (
            config.broker_timeout.is_zero(),
            "broker_timeout must be above 0",
        ),
        (
            config.scan_interval.is_zero(),
            "scan_interval must be above 0",
        ),
        (
            config.idle_timeout.is_zero(),
            "idle_timeout must be above 0",
        ),
        (
            config.max_connections == 0,
            "max_connections must be above 0",
        ),
        (
            u32::try_from(config.max_connections).is_err(),
            "max_connections must fit in 32 bits",
        ),
        (
            config.max_in_flight_per_connection == 0,
            "max_in_flight_per_connection must be above 0",
        ),
        (
            config.max_frame_bytes < PRE_HANDSHAKE_MAX_FRAME_BYTES
                || u32::try_from(config.max_frame_bytes).is_err(),
            "max_frame_bytes must be between 64 KiB and 4 GiB",
        ),
    ];
    match checks.into_iter().find(|(is_wrong, _)| *is_wrong) {
        Some((_, reason)) => Err(ServerError::InvalidConfig(reason.to_owned())),
        None => Ok(()),
    }
}

/// Starts serving `stream`, or refuses it with `SYSTEM_BUSY` when every connection slot is
/// taken.
fn admit(
    stream: TcpStream,
    peer: SocketAddr,
    connection_slots: &Arc<Semaphore>,
    handler: &Arc<Handlers>,
    config: &Arc<ServerConfig>,
    stop: &watch::Receiver<bool>,
) {
    let Ok(slot) = Arc::clone(connection_slots).try_acquire_owned() else {
        warn!(%peer, "refusing a connection: {} open, at max_connections", config.max_connections);
        refuse_busy(&stream, config.max_connections);
        return;
    };
    if let Err(nodelay_error) = stream.set_nodelay(true) {
        debug!(%peer, "cannot set TCP_NODELAY: {nodelay_error}");
    }
    let handler = Arc::clone(handler);
    let config = Arc::clone(config);
    let stop = stop.clone();
    tokio::spawn(async move {
        debug!(%peer, "connection opened");
        let reason = match &config.tls {
            None => serve_stream(stream, peer, &handler, &config, stop).await,
            Some(tls) => {
                crate::tls::serve(stream, peer, tls, config.idle_timeout, |stream| {
                    serve_stream(stream, peer, &handler, &config, stop)
                })
                .await
            }
        };
        debug!(%peer, "connection closed: {reason}");
        drop(slot);
    });
}

/// Serves one connection, plain or decrypted, of either protocol, until it ends.
async fn serve_stream<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    peer: SocketAddr,
    handler: &Handlers,
    config: &ServerConfig,
    stop: watch::Receiver<bool>,
) -> Closed {
    match tell_protocol(&mut stream, config.idle_timeout).await {
        Ok((Protocol::Native, read_buffer)) => {
            let mut session = Session::new(peer);
            let reason = serve_connection(
                stream,
                read_buffer,
                &mut session,
                &handler.native,
                config,
                stop,
            )
            .await;
            handler.native.connection_closed(&session);
            reason
        }
        Ok((Protocol::Remoting, read_buffer)) => {
            debug!(%peer, "a RocketMQ remoting connection");
            serve_remoting_connection(stream, peer, read_buffer, &handler.remoting, config, stop)
                .await
        }
        Err(reason) => reason,
    }
}

/// Best effort: one non-blocking write of a `SYSTEM_BUSY` frame, then the stream is dropped.
fn refuse_busy(stream: &TcpStream, max_connections: usize) {
    let message = format!("{max_connections} connections open, at max_connections");
    if let Ok(frame) =
        FrameEncoder::new().encode_error_response(0, wire::Status::SYSTEM_BUSY, &message)
    {
        let _ = stream.try_write(&frame);
    }
}

/// Why a connection ended, for the log.
#[derive(Debug)]
pub(crate) enum Closed {
    /// A plain connection to a listener that enforces TLS, or a failed TLS handshake.
    Refused(String),
    ByPeer,
    Idle,
    Shutdown,
    AfterResponse,
    /// Its first bytes are neither protocol's, or a remoting frame could not be decoded.
    Malformed(String),
    Io(io::Error),
}

impl std::fmt::Display for Closed {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::ByPeer => formatter.write_str("by the peer"),
            Self::Refused(reason) => write!(formatter, "refused: {reason}"),
            Self::Idle => formatter.write_str("idle timeout"),
            Self::Shutdown => formatter.write_str("shutting down"),
            Self::AfterResponse => formatter.write_str("after a final response"),
            Self::Malformed(reason) => write!(formatter, "malformed input: {reason}"),
            Self::Io(io_error) => write!(formatter, "I/O error: {io_error}"),
        }
    }
}

/// The two protocols one port serves.
enum Protocol {
    /// ShardMQ's own frames (docs/protocol.md).
    Native,
    /// RocketMQ's remoting frames, for RocketMQ clients and tools ([`crate::remoting`]).
    Remoting,
}

/// Reads a new connection's first bytes until they tell the protocol (`shardmq_remoting::sniff`:
/// at most 12 bytes are needed); returns them with what else that read brought. Bytes that are
/// neither protocol's go to the native decoder, which answers them as the malformed frame they
/// are.
async fn tell_protocol<S: AsyncRead + Unpin>(
    stream: &mut S,
    idle_timeout: Duration,
) -> Result<(Protocol, BytesMut), Closed> {
    let mut read_buffer = BytesMut::with_capacity(READ_CHUNK_BYTES);
    loop {
        match shardmq_remoting::sniff(&read_buffer) {
            Sniffed::Remoting => return Ok((Protocol::Remoting, read_buffer)),
            Sniffed::Native | Sniffed::Neither => return Ok((Protocol::Native, read_buffer)),
            Sniffed::NeedMore => {}
        }
        match timeout(idle_timeout, stream.read_buf(&mut read_buffer)).await {
            Ok(Ok(0)) => return Err(Closed::ByPeer),
            Ok(Ok(_)) => {}
            Ok(Err(io_error)) => return Err(Closed::Io(io_error)),
            Err(_) => return Err(Closed::Idle),
        }
    }
}

/// Reads frames, answers them, and returns when the connection is over.
async fn serve_connection<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    mut read_buffer: BytesMut,
    session: &mut Session,
    handler: &RequestHandler,
    config: &ServerConfig,
    mut stop: watch::Receiver<bool>,
) -> Closed {
    let mut decoder = FrameDecoder::with_max_frame_bytes(PRE_HANDSHAKE_MAX_FRAME_BYTES);
    let mut encoder = FrameEncoder::with_max_frame_bytes(config.max_frame_bytes);
    let mut write_buffer = BytesMut::new();
    loop {
        if *stop.borrow_and_update() {
            return Closed::Shutdown;
        }
        let mut after = AfterFrame::KeepOpen;
        let mut in_flight = 0;
        let mut is_batch_full = false;
        while after == AfterFrame::KeepOpen {
            if in_flight >= config.max_in_flight_per_connection
                || write_buffer.len() >= MAX_PENDING_WRITE_BYTES
            {
                is_batch_full = true;
                break;
            }
            match decoder.decode(&mut read_buffer) {
                Ok(Some(frame)) => {
                    after = handler.handle_frame(session, &frame, &mut encoder, &mut write_buffer);
                }
                Ok(None) => break,
                Err(decode_error) => {
                    after = handler.handle_decode_error(
                        session,
                        &decode_error,
                        &mut encoder,
                        &mut write_buffer,
                    );
                }
            }
            in_flight += 1;
            if session.is_handshaken() && decoder.max_frame_bytes() != config.max_frame_bytes {
                decoder = FrameDecoder::with_max_frame_bytes(config.max_frame_bytes);
            }
        }
        if !write_buffer.is_empty() {
            match timeout(
                config.idle_timeout,
                write_flushed(&mut stream, &write_buffer),
            )
            .await
            {
                Ok(Ok(())) => write_buffer.clear(),
                Ok(Err(io_error)) => return Closed::Io(io_error),
                Err(_) => return Closed::Idle,
            }
        }
        if after == AfterFrame::Close {
            linger_close(stream).await;
            return Closed::AfterResponse;
        }
        if is_batch_full {
            // More whole frames may be buffered already: answer them before reading more, but
            // let the other connections run first.
            tokio::task::yield_now().await;
            continue;
        }
        read_buffer.reserve(READ_CHUNK_BYTES);
        tokio::select! {
            changed = stop.changed() => {
                // Err: the server is gone, which is a shutdown too.
                let _ = changed;
                return Closed::Shutdown;
            }
            read = timeout(config.idle_timeout, stream.read_buf(&mut read_buffer)) => match read {
                Ok(Ok(0)) => return Closed::ByPeer,
                Ok(Ok(_)) => {}
                Ok(Err(io_error)) => return Closed::Io(io_error),
                Err(_) => return Closed::Idle,
            },
        }
    }
}

/// Writes `bytes` and flushes them: under TLS they may otherwise wait in the session.
pub(crate) async fn write_flushed<S: AsyncWrite + Unpin>(
    stream: &mut S,
    bytes: &[u8],
) -> io::Result<()> {
    stream.write_all(bytes).await?;
    stream.flush().await
}

/// Closes our side, then reads and discards what the peer still sends until it closes too
/// (bounded in time and bytes). Closing a socket with unread input makes the kernel send a
/// reset, which can destroy the final response before the peer reads it.
async fn linger_close<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S) {
    if stream.shutdown().await.is_err() {
        return;
    }
    let deadline = tokio::time::Instant::now() + LINGER_ON_CLOSE;
    let mut discard = [0u8; 4096];
    let mut discarded_bytes = 0;
    while discarded_bytes < LINGER_MAX_DISCARD_BYTES {
        match tokio::time::timeout_at(deadline, stream.read(&mut discard)).await {
            Ok(Ok(read_bytes)) if read_bytes > 0 => discarded_bytes += read_bytes,
            _ => return,
        }
    }
}

/// `duration` in whole milliseconds, as logs and the command line state durations.
#[must_use]
pub fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Every `scan_interval`, drops the brokers silent for over `broker_timeout` and logs each.
async fn scan_silent_brokers(
    registry: Arc<Mutex<RouteTable>>,
    broker_timeout: Duration,
    scan_interval: Duration,
) {
    let mut ticks = tokio::time::interval(scan_interval);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let expired = registry
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .expire_silent(Instant::now(), broker_timeout);
        for dropped in expired {
            crate::metrics::namesrv().brokers_expired.inc();
            let broker = &dropped.broker;
            info!(
                silent_ms = millis(dropped.silent_for),
                broker_timeout_ms = millis(broker_timeout),
                "broker {}/{} id {} at {} expired: silent for {} ms, over broker_timeout_ms ({})",
                broker.cluster_name,
                broker.broker_name,
                broker.broker_id,
                broker.broker_address,
                millis(dropped.silent_for),
                millis(broker_timeout)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_is_valid() {
        validate_config(&ServerConfig::default()).unwrap();
    }

    #[test]
    fn zero_intervals_are_refused() {
        let config = ServerConfig {
            scan_interval: Duration::ZERO,
            ..ServerConfig::default()
        };
        assert!(matches!(
            validate_config(&config),
            Err(ServerError::InvalidConfig(_))
        ));
    }

    #[test]
    fn closed_reasons_read_well() {
        assert_eq!(Closed::Idle.to_string(), "idle timeout");
    }

    /// Starts a server on a free loopback port; returns its address and a sender that stops it.
    async fn start(config: ServerConfig) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let server = NamesrvServer::bind(ServerConfig {
            listen: "127.0.0.1:0".to_owned(),
            ..config
        })
        .await
        .unwrap();
        let addr = server.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(server.run(async move {
            let _ = stopped.await;
        }));
        (addr, stop)
    }

    /// Reads one frame, or `None` at end of stream.
    async fn read_frame(stream: &mut TcpStream) -> Option<shardmq_schema::VerifiedFrame> {
        let decoder = FrameDecoder::new();
        let mut buffer = BytesMut::new();
        loop {
            if let Some(frame) = decoder.decode(&mut buffer).unwrap() {
                return Some(frame);
            }
            let read = timeout(Duration::from_secs(10), stream.read_buf(&mut buffer))
                .await
                .expect("the server answers or closes in time")
                .ok()?;
            if read == 0 {
                return None;
            }
        }
    }

    #[tokio::test]
    async fn connections_over_the_limit_are_refused_busy() {
        let (addr, _stop) = start(ServerConfig {
            max_connections: 1,
            ..ServerConfig::default()
        })
        .await;
        // Accepted in order: the first takes the only slot.
        let _first = TcpStream::connect(addr).await.unwrap();
        let mut second = TcpStream::connect(addr).await.unwrap();
        let refusal = read_frame(&mut second).await.expect("a SYSTEM_BUSY frame");
        assert_eq!(refusal.frame().status(), wire::Status::SYSTEM_BUSY);
        assert_eq!(refusal.frame().request_id(), 0);
        assert!(read_frame(&mut second).await.is_none(), "then closed");
    }

    #[tokio::test]
    async fn idle_connections_are_closed() {
        let (addr, _stop) = start(ServerConfig {
            idle_timeout: Duration::from_millis(100),
            ..ServerConfig::default()
        })
        .await;
        let mut idle = TcpStream::connect(addr).await.unwrap();
        assert!(read_frame(&mut idle).await.is_none());
    }

    #[tokio::test]
    async fn shutdown_closes_open_connections() {
        let (addr, stop) = start(ServerConfig::default()).await;
        let mut open = TcpStream::connect(addr).await.unwrap();
        // A handshake answered: the connection is being served when the stop comes.
        let handshake = FrameEncoder::new()
            .encode(|builder| {
                let request = wire::HandshakeRequest::create(
                    builder,
                    &wire::HandshakeRequestArgs {
                        protocol_version: shardmq_schema::PROTOCOL_VERSION,
                        ..Default::default()
                    },
                );
                shardmq_schema::build_frame(
                    builder,
                    &shardmq_schema::FrameHeader::request(1),
                    wire::Body::HandshakeRequest,
                    Some(request.as_union_value()),
                )
            })
            .unwrap();
        open.write_all(&handshake).await.unwrap();
        let answer = read_frame(&mut open).await.expect("handshake answered");
        assert_eq!(answer.frame().status(), wire::Status::OK);
        stop.send(()).unwrap();
        assert!(read_frame(&mut open).await.is_none());
    }
}
