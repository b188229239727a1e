//! One TCP connection to one server (broker or name server), with pipelined requests.
//!
//! Owns: the socket, the version handshake that opens it, request ids, and two tasks: a
//! writer that drains a bounded queue of encoded frames into the socket (several frames per
//! vectored write when they queue up; a frame whose records the caller already holds, a
//! producer's run, goes out as a head and those bytes, never copied), and a reader that
//! decodes frames and hands each RESPONSE to the request waiting for its id. ONE_WAY frames from the server (membership notices) leave
//! through the [`Notice`] channel; REQUESTs from the server (transaction check-backs) go to the
//! connection's [`RequestHandler`], each on a task of its own, and those it does not serve are
//! answered `UNKNOWN_REQUEST` so the server never waits on us.
//!
//! Never: retries or reconnects. A connection that fails is closed for good and fails every
//! request in flight with [`Error::ConnectionClosed`]; the pool (`pool.rs`) makes a new one.
//!
//! Size: about 720 lines of code and 280 of unit tests (fake servers); kept whole
//! because the handle, the writer and the reader share the pending-request table and the close.

use std::collections::{HashMap, VecDeque};
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use flatbuffers::{FlatBufferBuilder, UnionWIPOffset, Vector, WIPOffset};
use shardmq_schema::{
    build_frame, grow_without_realloc, wire, FrameDecoder, FrameEncoder, FrameError, FrameHeader,
    FramePool, VerifiedFrame, DEFAULT_MAX_FRAME_BYTES, FRAME_LENGTH_PREFIX_BYTES,
    MIN_PROTOCOL_VERSION, PROTOCOL_VERSION,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::tls::{ReadHalf, WriteHalf};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::error::{Error, Result};

/// The target of the `trace` events that mark a request frame's write (`write_begins`,
/// `write_ends`) and its answer's arrival (`answer_read`): `RUST_LOG=shardmq::timeline=trace`
/// logs them, for `scripts/timeline.py` to put beside the broker's (docs/performance.md);
/// the producer's encoding marks `encode_begins` and `encode_ends`.
pub(crate) const TIMELINE: &str = "shardmq::timeline";

/// Largest frame the client accepts from a server: room for a pull response of the broker's
/// largest `max_pull_bytes` (8 MiB) or a query answer at the broker's 16 MiB frame limit.
pub const MAX_RESPONSE_FRAME_BYTES: usize = 2 * DEFAULT_MAX_FRAME_BYTES;

/// Encoded frames that may wait for the writer before senders wait (back-pressure).
const MAX_QUEUED_FRAMES: usize = 1024;

/// Most byte slices the writer hands the socket in one vectored write (frames that queued up
/// while the last write ran; Linux takes up to 1,024).
const MAX_WRITE_SLICES: usize = 64;

/// Bytes the reader asks the socket for at least, per read.
const READ_BUFFER_BYTES: usize = 64 * 1024;

/// Frames of this size or more (pull answers of a backlog, query answers) are read into a
/// buffer of [`RECEIVE_POOL`] instead of the connection's read buffer.
const POOLED_FRAME_BYTES: usize = 256 * 1024;

/// Buffers of large frames kept for reuse, shared by every connection of the process: at most
/// 32 MiB kept free (a consumer draining a queue holds a few answers of about 1 MiB).
static RECEIVE_POOL: FramePool = FramePool::new(32 << 20);

/// Software name and version sent in the handshake.
const CLIENT_VERSION: &str = concat!("shardmq-client ", env!("CARGO_PKG_VERSION"));

/// A frame's body as a request builder writes it.
pub(crate) type Body = (wire::Body, WIPOffset<UnionWIPOffset>);

/// One frame on its way to the socket: its head, and the bytes that end it when the caller
/// already holds them (`FrameEncoder::encode_head_with_trailing_bytes`; empty otherwise).
#[derive(Debug)]
struct OutFrame {
    head: Bytes,
    trailing: Bytes,
}

impl OutFrame {
    fn whole(frame: Bytes) -> Self {
        Self {
            head: frame,
            trailing: Bytes::new(),
        }
    }
}

/// The encoded RESPONSE frame to a server's request, once it is known (`None`: no answer).
pub(crate) type ServerAnswer =
    std::pin::Pin<Box<dyn std::future::Future<Output = Option<Bytes>> + Send>>;

/// Serves REQUEST frames a server sends (transaction check-backs): `None` when this client
/// does not serve the request's kind.
pub(crate) type RequestHandler = Arc<dyn Fn(VerifiedFrame) -> Option<ServerAnswer> + Send + Sync>;

/// Something the server told the client without being asked, or a connection event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Notice {
    /// The members of a consumer group changed (ConsumerIdsChangedNotice): rebalance now.
    ConsumerIdsChanged { group: String },
    /// A new connection to `address` completed its handshake (a reconnect, or the first
    /// connection): a consumer re-sends its heartbeat there, since the server forgets a
    /// client's groups when its connection closes.
    Connected { address: String },
}

/// What the server said about itself in the handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    /// `shardmq-broker` or `shardmq-namesrv`.
    pub name: String,
    pub version: String,
    pub cluster_name: String,
    pub broker_name: String,
    /// 0 for a master, > 0 for a slave, -1 for a name server.
    pub broker_id: i64,
    pub protocol_version: u32,
    /// Largest frame the server accepts (0: not stated).
    pub max_frame_bytes: usize,
    /// Largest message body the server accepts (0: not stated).
    pub max_message_bytes: usize,
    /// Whether the account this connection authenticated as may make admin calls (the
    /// server's `AuthResponse`); `None` when it did not authenticate (the server enforces no
    /// access control, or the client has no credentials).
    pub account_is_admin: Option<bool>,
}

/// State shared by the connection's handle and its tasks.
struct Shared {
    address: String,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    pending: HashMap<u64, oneshot::Sender<Result<VerifiedFrame>>>,
    /// Why the connection closed, once it has.
    closed: Option<String>,
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Closes the connection (once) and fails every request in flight.
    fn close(&self, reason: String) {
        let pending = {
            let mut state = self.state();
            if state.closed.is_some() {
                return;
            }
            debug!(address = %self.address, %reason, "connection closed");
            state.closed = Some(reason.clone());
            std::mem::take(&mut state.pending)
        };
        for (_, waiter) in pending {
            let _ = waiter.send(Err(Error::ConnectionClosed {
                address: self.address.clone(),
                reason: reason.clone(),
            }));
        }
    }

    fn closed_error(&self, reason: &str) -> Error {
        Error::ConnectionClosed {
            address: self.address.clone(),
            reason: reason.to_owned(),
        }
    }
}

/// Removes a request's waiter when the request is abandoned (timeout, cancellation).
struct PendingGuard<'a> {
    shared: &'a Shared,
    request_id: u64,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.shared.state().pending.remove(&self.request_id);
    }
}

/// A handshaken connection. Cheap to share (`Arc`); requests from many tasks are pipelined.
pub(crate) struct Connection {
    shared: Arc<Shared>,
    /// The server's address, as connected to.
    peer: SocketAddr,
    /// This end's address on the connection.
    local: SocketAddr,
    outgoing: mpsc::Sender<OutFrame>,
    encoder: Mutex<FrameEncoder>,
    next_request_id: AtomicU64,
    server: OnceLock<ServerInfo>,
    reader: JoinHandle<()>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        // The writer ends by itself once `outgoing` (its only sender left) is gone, after
        // writing what is queued.
        self.reader.abort();
        self.shared
            .close("the client dropped the connection".to_owned());
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Connection")
            .field("address", &self.shared.address)
            .field("server", &self.server.get())
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// Connects to `address` (`host:port`), shakes hands as `client_id` and returns the
    /// connection. Notices from the server go to `notices` (dropped when it is full: the
    /// consumer's timers cover a lost notice).
    #[cfg(test)]
    pub(crate) async fn connect(
        address: &str,
        client_id: &str,
        connect_timeout: Duration,
        notices: Option<mpsc::Sender<Notice>>,
    ) -> Result<Arc<Connection>> {
        Self::connect_serving(
            address,
            client_id,
            connect_timeout,
            notices,
            None,
            None,
            None,
        )
        .await
    }

    /// Like [`connect`](Self::connect), in TLS when `tls` is given; the server's requests go
    /// to `requests`.
    pub(crate) async fn connect_serving(
        address: &str,
        client_id: &str,
        connect_timeout: Duration,
        notices: Option<mpsc::Sender<Notice>>,
        requests: Option<RequestHandler>,
        tls: Option<&shardmq_tls::ClientTls>,
        credentials: Option<&shardmq_acl::Credentials>,
    ) -> Result<Arc<Connection>> {
        let stream = match tokio::time::timeout(connect_timeout, TcpStream::connect(address)).await
        {
            Ok(Ok(stream)) => stream,
            Ok(Err(source)) => {
                return Err(Error::Connect {
                    address: address.to_owned(),
                    timeout_ms: connect_timeout.as_millis() as u64,
                    source,
                })
            }
            Err(_) => {
                return Err(Error::Connect {
                    address: address.to_owned(),
                    timeout_ms: connect_timeout.as_millis() as u64,
                    source: std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"),
                })
            }
        };
        let _ = stream.set_nodelay(true);
        let (peer, local) = match (stream.peer_addr(), stream.local_addr()) {
            (Ok(peer), Ok(local)) => (peer, local),
            (Err(source), _) | (_, Err(source)) => {
                return Err(Error::Io {
                    address: address.to_owned(),
                    source,
                })
            }
        };
        let (read_half, write_half) =
            crate::tls::split(stream, address, tls, connect_timeout).await?;
        let shared = Arc::new(Shared {
            address: address.to_owned(),
            state: Mutex::new(State::default()),
        });
        let (outgoing, queued) = mpsc::channel(MAX_QUEUED_FRAMES);
        tokio::spawn(write_frames(Arc::clone(&shared), write_half, queued));
        let reader = tokio::spawn(read_frames(
            Arc::clone(&shared),
            read_half,
            outgoing.clone(),
            notices,
            requests,
        ));
        let connection = Arc::new(Connection {
            shared,
            peer,
            local,
            outgoing,
            encoder: Mutex::new(FrameEncoder::new()),
            next_request_id: AtomicU64::new(1),
            server: OnceLock::new(),
            reader,
        });
        connection
            .handshake(client_id, credentials, connect_timeout)
            .await?;
        Ok(connection)
    }

    async fn handshake(
        &self,
        client_id: &str,
        credentials: Option<&shardmq_acl::Credentials>,
        timeout: Duration,
    ) -> Result<()> {
        let frame = self
            .request("handshake", timeout, |builder| {
                let client_id = builder.create_string(client_id);
                let client_version = builder.create_string(CLIENT_VERSION);
                let request = wire::HandshakeRequest::create(
                    builder,
                    &wire::HandshakeRequestArgs {
                        protocol_version: PROTOCOL_VERSION,
                        min_protocol_version: MIN_PROTOCOL_VERSION,
                        client_id: Some(client_id),
                        client_version: Some(client_version),
                    },
                );
                (wire::Body::HandshakeRequest, request.as_union_value())
            })
            .await?;
        let header = frame.frame();
        let response = header.body_as_handshake_response();
        if header.status() != wire::Status::OK {
            let range = response
                .map(|r| {
                    format!(
                        "; the server speaks protocol versions {}..={}, this client {MIN_PROTOCOL_VERSION}..={PROTOCOL_VERSION}",
                        r.min_protocol_version(),
                        r.max_protocol_version()
                    )
                })
                .unwrap_or_default();
            return Err(Error::Handshake {
                address: self.address().to_owned(),
                reason: format!(
                    "{:?}: {}{range}",
                    header.status(),
                    header.message().unwrap_or_default()
                ),
            });
        }
        let response = response.ok_or_else(|| Error::UnexpectedResponse {
            address: self.address().to_owned(),
            detail: "handshake answered without a HandshakeResponse".to_owned(),
        })?;
        let server = response.server();
        let mut info = ServerInfo {
            name: server.and_then(|s| s.name()).unwrap_or_default().to_owned(),
            version: server
                .and_then(|s| s.version())
                .unwrap_or_default()
                .to_owned(),
            cluster_name: server
                .and_then(|s| s.cluster_name())
                .unwrap_or_default()
                .to_owned(),
            broker_name: server
                .and_then(|s| s.broker_name())
                .unwrap_or_default()
                .to_owned(),
            broker_id: server.map_or(-1, |s| s.broker_id()),
            protocol_version: response.protocol_version(),
            max_frame_bytes: response.max_frame_bytes() as usize,
            max_message_bytes: response.max_message_bytes() as usize,
            account_is_admin: None,
        };
        if info.max_frame_bytes > 0 {
            *self.lock_encoder() = FrameEncoder::with_max_frame_bytes(info.max_frame_bytes);
        }
        let auth_nonce = response.auth_nonce().map(|nonce| nonce.bytes().to_vec());
        match (auth_nonce, credentials) {
            (Some(nonce), Some(credentials)) => {
                info.account_is_admin =
                    Some(self.authenticate(&nonce, credentials, timeout).await?);
            }
            (Some(_), None) => debug!(
                address = %self.address(),
                "the server enforces access control and this client has no credentials: anonymous"
            ),
            _ => {}
        }
        debug!(address = %self.address(), server = ?info, "handshake done");
        let _ = self.server.set(info);
        Ok(())
    }

    /// Answers the server's challenge (docs/acl.md, "The native handshake"): the connection
    /// speaks as the account from now on (whether it is an admin account comes back), or fails
    /// with the server's reason.
    async fn authenticate(
        &self,
        nonce: &[u8],
        credentials: &shardmq_acl::Credentials,
        timeout: Duration,
    ) -> Result<bool> {
        let (client_nonce, proof) =
            credentials
                .answer(nonce)
                .map_err(|error| Error::UnexpectedResponse {
                    address: self.address().to_owned(),
                    detail: error.to_string(),
                })?;
        let frame = self
            .request("authenticate", timeout, |builder| {
                let access_key = builder.create_string(credentials.access_key());
                let client_nonce = builder.create_vector(&client_nonce[..]);
                let proof = builder.create_vector(&proof[..]);
                let request = wire::AuthRequest::create(
                    builder,
                    &wire::AuthRequestArgs {
                        access_key: Some(access_key),
                        client_nonce: Some(client_nonce),
                        proof: Some(proof),
                    },
                );
                (wire::Body::AuthRequest, request.as_union_value())
            })
            .await?;
        let header = frame.frame();
        if header.status() != wire::Status::OK {
            return Err(Error::Handshake {
                address: self.address().to_owned(),
                reason: format!(
                    "authentication as {:?} refused ({:?}): {}",
                    credentials.access_key(),
                    header.status(),
                    header.message().unwrap_or_default()
                ),
            });
        }
        let is_admin = header
            .body_as_auth_response()
            .is_some_and(|response| response.admin());
        debug!(address = %self.address(), access_key = credentials.access_key(), is_admin, "authenticated");
        Ok(is_admin)
    }

    /// The `host:port` this connection was made to.
    pub(crate) fn address(&self) -> &str {
        &self.shared.address
    }

    /// What the server announced in the handshake.
    pub(crate) fn server(&self) -> Option<&ServerInfo> {
        self.server.get()
    }

    /// The protocol version the handshake settled on.
    pub(crate) fn protocol_version(&self) -> u32 {
        self.server
            .get()
            .map_or(0, |server| server.protocol_version)
    }

    /// The server's socket address (a broker's store host, as its records name it).
    pub(crate) fn peer_address(&self) -> SocketAddr {
        self.peer
    }

    /// This end's socket address (its port is the born host's port in a producer's records).
    pub(crate) fn local_address(&self) -> SocketAddr {
        self.local
    }

    /// Whether the connection has failed or been closed (a new one is needed).
    pub(crate) fn is_closed(&self) -> bool {
        self.shared.state().closed.is_some()
    }

    fn lock_encoder(&self) -> std::sync::MutexGuard<'_, FrameEncoder> {
        self.encoder
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn encode<F>(&self, header: &FrameHeader<'_>, build: F) -> Result<OutFrame>
    where
        F: FnOnce(&mut FlatBufferBuilder<'static>) -> Body,
    {
        self.lock_encoder()
            .encode(|builder| {
                let (body_type, body) = build(builder);
                build_frame(builder, header, body_type, Some(body))
            })
            .map(OutFrame::whole)
            .map_err(|source| self.frame_error(source))
    }

    /// A frame whose body `build` writes, ending with `trailing` as the `[ubyte]` vector
    /// `build` is given: the head is encoded, `trailing` is sent as it is, never copied.
    fn encode_with_trailing<F>(
        &self,
        header: &FrameHeader<'_>,
        trailing: Bytes,
        build: F,
    ) -> Result<OutFrame>
    where
        F: FnOnce(&mut FlatBufferBuilder<'static>, WIPOffset<Vector<'static, u8>>) -> Body,
    {
        let mut head = BytesMut::new();
        self.lock_encoder()
            .encode_head_with_trailing_bytes(&mut head, trailing.len(), |builder, vector| {
                let (body_type, body) = build(builder, vector);
                build_frame(builder, header, body_type, Some(body))
            })
            .map_err(|source| self.frame_error(source))?;
        Ok(OutFrame {
            head: head.freeze(),
            trailing,
        })
    }

    fn frame_error(&self, source: FrameError) -> Error {
        Error::Frame {
            address: self.address().to_owned(),
            source,
        }
    }

    /// Sends a request whose body `build` writes and waits up to `timeout` for its response,
    /// whatever its status. `operation` names the request in a timeout error.
    pub(crate) async fn request<F>(
        &self,
        operation: &'static str,
        timeout: Duration,
        build: F,
    ) -> Result<VerifiedFrame>
    where
        F: FnOnce(&mut FlatBufferBuilder<'static>) -> Body,
    {
        let deadline = Instant::now() + timeout;
        let request_id = self.next_request_id.fetch_add(1, Ordering::Relaxed);
        let frame = self.encode(&FrameHeader::request(request_id), build)?;
        self.exchange(operation, timeout, deadline, request_id, frame)
            .await
    }

    /// Like [`request`](Self::request) for a body whose last field is the `[ubyte]` vector
    /// `trailing` (a producer's run of records): `build` receives that vector's offset, and the
    /// bytes go to the socket as they are.
    pub(crate) async fn request_with_trailing<F>(
        &self,
        operation: &'static str,
        timeout: Duration,
        trailing: Bytes,
        build: F,
    ) -> Result<VerifiedFrame>
    where
        F: FnOnce(&mut FlatBufferBuilder<'static>, WIPOffset<Vector<'static, u8>>) -> Body,
    {
        let deadline = Instant::now() + timeout;
        let request_id = self.next_request_id.fetch_add(1, Ordering::Relaxed);
        let frame =
            self.encode_with_trailing(&FrameHeader::request(request_id), trailing, build)?;
        self.exchange(operation, timeout, deadline, request_id, frame)
            .await
    }

    /// Queues `frame` (request `request_id`) for the socket and waits until `deadline` for
    /// its response.
    async fn exchange(
        &self,
        operation: &'static str,
        timeout: Duration,
        deadline: Instant,
        request_id: u64,
        frame: OutFrame,
    ) -> Result<VerifiedFrame> {
        let (waiter, answer) = oneshot::channel();
        {
            let mut state = self.shared.state();
            if let Some(reason) = &state.closed {
                return Err(self.shared.closed_error(reason));
            }
            state.pending.insert(request_id, waiter);
        }
        let _guard = PendingGuard {
            shared: &self.shared,
            request_id,
        };
        let timeout_error = || Error::Timeout {
            operation,
            address: self.address().to_owned(),
            timeout,
        };
        match tokio::time::timeout_at(deadline, self.outgoing.send(frame)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(self.shared.closed_error("the writer stopped")),
            Err(_) => return Err(timeout_error()),
        }
        match tokio::time::timeout_at(deadline, answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(self.shared.closed_error("the reader stopped")),
            Err(_) => Err(timeout_error()),
        }
    }

    /// Sends a ONE_WAY frame (no response); returns once it is queued for the socket.
    pub(crate) async fn one_way<F>(&self, timeout: Duration, build: F) -> Result<()>
    where
        F: FnOnce(&mut FlatBufferBuilder<'static>) -> Body,
    {
        if let Some(reason) = &self.shared.state().closed {
            return Err(self.shared.closed_error(reason));
        }
        let frame = self.encode(&FrameHeader::one_way(), build)?;
        self.queue_one_way(timeout, frame).await
    }

    /// [`one_way`](Self::one_way) with trailing bytes, as
    /// [`request_with_trailing`](Self::request_with_trailing).
    pub(crate) async fn one_way_with_trailing<F>(
        &self,
        timeout: Duration,
        trailing: Bytes,
        build: F,
    ) -> Result<()>
    where
        F: FnOnce(&mut FlatBufferBuilder<'static>, WIPOffset<Vector<'static, u8>>) -> Body,
    {
        if let Some(reason) = &self.shared.state().closed {
            return Err(self.shared.closed_error(reason));
        }
        let frame = self.encode_with_trailing(&FrameHeader::one_way(), trailing, build)?;
        self.queue_one_way(timeout, frame).await
    }

    async fn queue_one_way(&self, timeout: Duration, frame: OutFrame) -> Result<()> {
        match tokio::time::timeout(timeout, self.outgoing.send(frame)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(self.shared.closed_error("the writer stopped")),
            Err(_) => Err(Error::Timeout {
                operation: "one-way send",
                address: self.address().to_owned(),
                timeout,
            }),
        }
    }
}

/// The writer task: frames from `queued` into the socket, as many as have queued up (up to
/// [`MAX_WRITE_SLICES`] slices) in each vectored write.
async fn write_frames(
    shared: Arc<Shared>,
    mut write_half: WriteHalf,
    mut queued: mpsc::Receiver<OutFrame>,
) {
    let mut pieces: VecDeque<Bytes> = VecDeque::new();
    while let Some(frame) = queued.recv().await {
        push_frame(&mut pieces, frame);
        while pieces.len() < MAX_WRITE_SLICES {
            match queued.try_recv() {
                Ok(more) => push_frame(&mut pieces, more),
                Err(_) => break,
            }
        }
        if let Err(error) = write_pieces(&mut write_half, &mut pieces).await {
            shared.close(format!("write failed: {error}"));
            return;
        }
    }
    let _ = write_half.shutdown().await;
}

fn push_frame(pieces: &mut VecDeque<Bytes>, frame: OutFrame) {
    pieces.push_back(frame.head);
    if !frame.trailing.is_empty() {
        pieces.push_back(frame.trailing);
    }
}

/// Writes every byte of `pieces`, in order, with vectored writes; each piece is dropped (its
/// buffer released) as soon as it has been written.
async fn write_pieces(
    write_half: &mut WriteHalf,
    pieces: &mut VecDeque<Bytes>,
) -> std::io::Result<()> {
    tracing::trace!(
        target: TIMELINE,
        stage = "write_begins",
        bytes = pieces.iter().map(|piece| piece.len()).sum::<usize>()
    );
    while !pieces.is_empty() {
        let mut slices = [IoSlice::new(&[]); MAX_WRITE_SLICES];
        let mut count = 0;
        for (slice, piece) in slices.iter_mut().zip(pieces.iter()) {
            *slice = IoSlice::new(piece);
            count += 1;
        }
        let mut written = write_half.write_vectored(&slices[..count]).await?;
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while written > 0 {
            let Some(front) = pieces.front_mut() else {
                break;
            };
            if written >= front.len() {
                written -= front.len();
                pieces.pop_front();
            } else {
                bytes::Buf::advance(front, written);
                written = 0;
            }
        }
    }
    tracing::trace!(target: TIMELINE, stage = "write_ends");
    Ok(())
}

/// The reader task: frames from the socket to the requests waiting for them.
async fn read_frames(
    shared: Arc<Shared>,
    mut read_half: ReadHalf,
    outgoing: mpsc::Sender<OutFrame>,
    notices: Option<mpsc::Sender<Notice>>,
    requests: Option<RequestHandler>,
) {
    // Room for a frame is made below once its length is known, not by the decoder.
    let decoder =
        FrameDecoder::with_max_frame_bytes(MAX_RESPONSE_FRAME_BYTES).without_reserve_ahead();
    let mut encoder = FrameEncoder::new();
    let mut buffer = BytesMut::with_capacity(READ_BUFFER_BYTES);
    loop {
        // Dispatches a decoded frame or skips a malformed one; false once the stream is broken
        // (the connection is closed then).
        let mut take = |decoded: std::result::Result<VerifiedFrame, FrameError>| match decoded {
            Ok(frame) => {
                dispatch(
                    &shared,
                    frame,
                    &outgoing,
                    &notices,
                    requests.as_ref(),
                    &mut encoder,
                );
                true
            }
            Err(error @ FrameError::Malformed(_)) => {
                warn!(address = %shared.address, %error, "the server sent a malformed frame; skipped");
                true
            }
            Err(error) => {
                shared.close(format!("the server's byte stream is broken: {error}"));
                false
            }
        };
        while let Some(decoded) = decoder.decode(&mut buffer).transpose() {
            if !take(decoded) {
                return;
            }
        }
        // A large frame (a pull answer is about 1 MiB) is read whole into a pooled buffer
        // whose memory was read into before: no page faults, no copy while it arrives, and
        // the memory returns to the pool when the last message sliced out of it is dropped.
        // Smaller ones get room for the whole frame and a read buffer more, made without a
        // `realloc` (which copies the whole old block: `grow_without_realloc`).
        match decoder.pending_frame_bytes(&buffer) {
            Some(frame_bytes)
                if frame_bytes > buffer.len() && frame_bytes >= POOLED_FRAME_BYTES =>
            {
                let frame = match read_pooled_frame(&mut read_half, &mut buffer, frame_bytes).await
                {
                    Ok(frame) => frame,
                    Err(why) => {
                        shared.close(why);
                        return;
                    }
                };
                if !take(decoder.verify(frame.slice(FRAME_LENGTH_PREFIX_BYTES..))) {
                    return;
                }
                continue;
            }
            Some(frame_bytes) if frame_bytes > buffer.len() => {
                grow_without_realloc(&mut buffer, frame_bytes + READ_BUFFER_BYTES);
            }
            _ => {
                if buffer.capacity() - buffer.len() < READ_BUFFER_BYTES / 4 {
                    buffer.reserve(READ_BUFFER_BYTES);
                }
            }
        }
        if let Some(why) = stream_end(read_half.read_buf(&mut buffer).await) {
            shared.close(why);
            return;
        }
    }
}

/// Why the server's stream ended, when a read says it did (closed, or failed).
fn stream_end(read: std::io::Result<usize>) -> Option<String> {
    match read {
        Ok(0) => Some("closed by the server".to_owned()),
        Ok(_) => None,
        Err(error) => Some(format!("read failed: {error}")),
    }
}

/// Reads the rest of a frame of `frame_bytes` (length prefix included) whose first bytes are
/// all of `buffer` into a buffer of [`RECEIVE_POOL`], and leaves `buffer` empty. Reads stop at
/// the frame's end, so nothing of the next frame is taken. `Err` says why the stream ended.
async fn read_pooled_frame(
    read_half: &mut ReadHalf,
    buffer: &mut BytesMut,
    frame_bytes: usize,
) -> std::result::Result<Bytes, String> {
    debug_assert!(buffer.len() < frame_bytes);
    let mut pooled = RECEIVE_POOL.take(frame_bytes);
    pooled.vec_mut().extend_from_slice(buffer);
    buffer.clear();
    while pooled.len() < frame_bytes {
        let rest = frame_bytes - pooled.len();
        let mut room = bytes::BufMut::limit(pooled.vec_mut(), rest);
        if let Some(why) = stream_end(read_half.read_buf(&mut room).await) {
            return Err(why);
        }
    }
    Ok(pooled.into_bytes())
}

fn dispatch(
    shared: &Shared,
    frame: VerifiedFrame,
    outgoing: &mpsc::Sender<OutFrame>,
    notices: &Option<mpsc::Sender<Notice>>,
    requests: Option<&RequestHandler>,
    encoder: &mut FrameEncoder,
) {
    let header = frame.frame();
    let kind = header.kind();
    if kind == wire::FrameKind::RESPONSE {
        let request_id = header.request_id();
        tracing::trace!(target: TIMELINE, stage = "answer_read", request_id);
        let waiter = shared.state().pending.remove(&request_id);
        match waiter {
            Some(waiter) => {
                let _ = waiter.send(Ok(frame));
            }
            None if request_id == 0 => warn!(
                address = %shared.address,
                status = ?header.status(),
                message = header.message().unwrap_or_default(),
                "the server refused a frame of ours it could not read"
            ),
            // An answer after its request timed out or was abandoned.
            None => debug!(address = %shared.address, request_id, "late response dropped"),
        }
    } else if kind == wire::FrameKind::ONE_WAY {
        if let Some(notice) = header.body_as_consumer_ids_changed_notice() {
            let group = notice.consumer_group().unwrap_or_default().to_owned();
            if let Some(notices) = notices {
                let _ = notices.try_send(Notice::ConsumerIdsChanged { group });
            }
        }
    } else if kind == wire::FrameKind::REQUEST {
        let (request_id, body_type) = (header.request_id(), header.body_type());
        if let Some(answer) = requests.and_then(|serve| serve(frame)) {
            let outgoing = outgoing.clone();
            tokio::spawn(async move {
                if let Some(frame) = answer.await {
                    let _ = outgoing.send(OutFrame::whole(frame)).await;
                }
            });
            return;
        }
        let message = format!("this client serves no {body_type:?} requests");
        if let Ok(answer) =
            encoder.encode_error_response(request_id, wire::Status::UNKNOWN_REQUEST, &message)
        {
            let _ = outgoing.try_send(OutFrame::whole(answer));
        }
    }
}

/// Pieces of a fake server for the client's unit tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// An OK `HandshakeResponse` to request `id`, announcing 1 MiB frames and 1 KiB bodies.
    pub(crate) fn handshake_response(encoder: &mut FrameEncoder, id: u64) -> Bytes {
        encoder
            .encode(|b| {
                let name = b.create_string("fake-broker");
                let server = wire::ServerInfo::create(
                    b,
                    &wire::ServerInfoArgs {
                        name: Some(name),
                        broker_name: Some(name),
                        broker_id: 0,
                        ..Default::default()
                    },
                );
                let body = wire::HandshakeResponse::create(
                    b,
                    &wire::HandshakeResponseArgs {
                        protocol_version: 1,
                        min_protocol_version: 1,
                        max_protocol_version: 1,
                        server: Some(server),
                        max_frame_bytes: 1 << 20,
                        max_message_bytes: 1 << 10,
                        auth_nonce: None,
                    },
                );
                build_frame(
                    b,
                    &FrameHeader::response(id, wire::Status::OK),
                    wire::Body::HandshakeResponse,
                    Some(body.as_union_value()),
                )
            })
            .unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A fake server: answers the handshake, then hands every other frame to `answer`, which
    /// returns the bytes to write back (possibly none), written in pieces of `piece` bytes.
    async fn scripted_server<F>(piece: usize, mut answer: F) -> (String, JoinHandle<()>)
    where
        F: FnMut(wire::Frame<'_>, &mut FrameEncoder) -> Vec<u8> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let task = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let decoder = FrameDecoder::new();
            let mut encoder = FrameEncoder::new();
            let mut buffer = BytesMut::new();
            loop {
                while let Ok(Some(frame)) = decoder.decode(&mut buffer) {
                    let header = frame.frame();
                    let out = if header.body_as_handshake_request().is_some() {
                        testing::handshake_response(&mut encoder, header.request_id()).to_vec()
                    } else {
                        answer(header, &mut encoder)
                    };
                    for part in out.chunks(piece) {
                        socket.write_all(part).await.unwrap();
                        tokio::task::yield_now().await;
                    }
                }
                if socket.read_buf(&mut buffer).await.unwrap_or(0) == 0 {
                    return;
                }
            }
        });
        (address, task)
    }

    /// A fake server that answers every request with `status`, in reverse order of arrival
    /// for each pair (to check pipelining).
    async fn fake_server(status: wire::Status) -> (String, JoinHandle<()>) {
        let mut held: Vec<u64> = Vec::new();
        scripted_server(usize::MAX, move |header, encoder| {
            held.push(header.request_id());
            let mut out = Vec::new();
            if held.len() == 2 {
                for id in held.drain(..).rev() {
                    out.extend_from_slice(&encoder.encode_error_response(id, status, "x").unwrap());
                }
            }
            out
        })
        .await
    }

    fn route_request(builder: &mut FlatBufferBuilder<'static>) -> Body {
        let topic = builder.create_string("t");
        let request = wire::GetRouteRequest::create(
            builder,
            &wire::GetRouteRequestArgs { topic: Some(topic) },
        );
        (wire::Body::GetRouteRequest, request.as_union_value())
    }

    #[tokio::test]
    async fn pipelined_responses_find_their_requests() {
        let (address, server) = fake_server(wire::Status::SYSTEM_BUSY).await;
        let connection = Connection::connect(&address, "c", Duration::from_secs(5), None)
            .await
            .unwrap();
        assert_eq!(connection.server().unwrap().max_message_bytes, 1024);
        let timeout = Duration::from_secs(5);
        let (first, second) = tokio::join!(
            connection.request("first", timeout, route_request),
            connection.request("second", timeout, route_request)
        );
        let first = first.unwrap();
        let second = second.unwrap();
        assert_ne!(first.frame().request_id(), second.frame().request_id());
        assert_eq!(first.frame().status(), wire::Status::SYSTEM_BUSY);
        drop(connection);
        server.await.unwrap();
    }

    /// A fake server that answers each request with `len:crc` of its records vector (empty
    /// for requests without one) as the status message.
    async fn echoing_server() -> (String, JoinHandle<()>) {
        scripted_server(usize::MAX, |header, encoder| {
            let records = header
                .body_as_send_records_request()
                .and_then(|r| r.records())
                .map(|v| v.bytes())
                .unwrap_or_default();
            let echo = format!("{}:{}", records.len(), crc32fast::hash(records));
            encoder
                .encode_error_response(header.request_id(), wire::Status::SYSTEM_BUSY, &echo)
                .unwrap()
                .to_vec()
        })
        .await
    }

    #[tokio::test]
    async fn frames_ending_in_the_callers_bytes_arrive_whole_among_others() {
        let (address, server) = echoing_server().await;
        let connection = Connection::connect(&address, "c", Duration::from_secs(5), None)
            .await
            .unwrap();
        assert_eq!(connection.peer_address().to_string(), address);
        assert_eq!(
            connection.local_address().ip(),
            connection.peer_address().ip()
        );
        let timeout = Duration::from_secs(10);
        let runs: Vec<Bytes> = [900_000usize, 1, 65_537, 300_001]
            .iter()
            .map(|&len| {
                (0..len)
                    .map(|i| (i * 7 % 251) as u8)
                    .collect::<Vec<u8>>()
                    .into()
            })
            .collect();
        let with_runs = runs.iter().map(|run| {
            let connection = &connection;
            async move {
                let answer = connection
                    .request_with_trailing("run", timeout, run.clone(), |b, records| {
                        let topic = b.create_string("t");
                        let request = wire::SendRecordsRequest::create(
                            b,
                            &wire::SendRecordsRequestArgs {
                                topic: Some(topic),
                                records: Some(records),
                                count: 1,
                                ..Default::default()
                            },
                        );
                        (wire::Body::SendRecordsRequest, request.as_union_value())
                    })
                    .await
                    .unwrap();
                let expected = format!("{}:{}", run.len(), crc32fast::hash(run));
                assert_eq!(answer.frame().message(), Some(expected.as_str()));
            }
        });
        let plain = (0..4).map(|_| async {
            let answer = connection
                .request("plain", timeout, route_request)
                .await
                .unwrap();
            assert_eq!(answer.frame().message(), Some("0:0"));
        });
        // All in flight at once: the writer interleaves whole frames only.
        tokio::join!(
            futures_join(with_runs.collect()),
            futures_join(plain.collect())
        );
        drop(connection);
        server.await.unwrap();
    }

    /// Awaits every future of `futures` concurrently.
    async fn futures_join<F: std::future::Future<Output = ()>>(futures: Vec<F>) {
        let mut handles: Vec<std::pin::Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
        std::future::poll_fn(|context| {
            handles.retain_mut(|future| future.as_mut().poll(context).is_pending());
            if handles.is_empty() {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
        .await;
    }

    #[tokio::test]
    async fn a_closed_server_fails_requests_in_flight() {
        let (address, server) = fake_server(wire::Status::OK).await;
        let connection = Connection::connect(&address, "c", Duration::from_secs(5), None)
            .await
            .unwrap();
        // The fake server holds a single request until a second comes; kill it instead.
        let request = connection.request("held", Duration::from_secs(5), route_request);
        let abort = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            server.abort();
        };
        let (result, ()) = tokio::join!(request, abort);
        assert!(
            matches!(result, Err(Error::ConnectionClosed { .. })),
            "{result:?}"
        );
        assert!(connection.is_closed());
    }

    #[tokio::test]
    async fn garbage_from_the_server_closes_the_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buffer = BytesMut::new();
            let decoder = FrameDecoder::new();
            let mut encoder = FrameEncoder::new();
            loop {
                if let Ok(Some(frame)) = decoder.decode(&mut buffer) {
                    let answer =
                        testing::handshake_response(&mut encoder, frame.frame().request_id());
                    socket.write_all(&answer).await.unwrap();
                    break;
                }
                socket.read_buf(&mut buffer).await.unwrap();
            }
            // A length prefix of zero: the stream cannot be read any further.
            socket.write_all(&[0, 0, 0, 0]).await.unwrap();
            tokio::time::sleep(Duration::from_secs(5)).await;
        });
        let connection = Connection::connect(&address, "c", Duration::from_secs(5), None)
            .await
            .unwrap();
        let result = connection
            .request("after garbage", Duration::from_secs(5), route_request)
            .await;
        match result {
            Err(Error::ConnectionClosed { reason, .. }) => {
                assert!(reason.contains("broken"), "{reason}");
            }
            other => panic!("expected a closed connection, got {other:?}"),
        }
        assert!(connection.is_closed());
        server.abort();
    }

    /// The records a large-answer test asks for: `len` bytes of a pattern.
    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 13 % 241) as u8).collect()
    }

    #[tokio::test]
    async fn large_answers_arrive_whole_in_pieces_and_a_malformed_one_is_skipped() {
        // Answers sized around the pooled-frame threshold, written in pieces of 7,001 bytes;
        // before the first, a malformed frame larger than the threshold.
        let sizes = [
            POOLED_FRAME_BYTES - 200,
            POOLED_FRAME_BYTES,
            1_500_000,
            10,
            300_001,
        ];
        let mut is_first = true;
        let (address, server) = scripted_server(7_001, move |header, encoder| {
            let len: usize = header
                .body_as_get_route_request()
                .and_then(|r| r.topic())
                .and_then(|t| t.parse().ok())
                .unwrap();
            let mut out = Vec::new();
            if is_first {
                is_first = false;
                let garbage = 400_000u32;
                out.extend_from_slice(&garbage.to_be_bytes());
                out.extend(std::iter::repeat_n(0x5a, garbage as usize));
            }
            let records = pattern(len);
            let answer = encoder
                .encode(|b| {
                    let topic = b.create_string("t");
                    let records = b.create_vector(&records);
                    let body = wire::SendRecordsRequest::create(
                        b,
                        &wire::SendRecordsRequestArgs {
                            topic: Some(topic),
                            records: Some(records),
                            count: 1,
                            ..Default::default()
                        },
                    );
                    build_frame(
                        b,
                        &FrameHeader::response(header.request_id(), wire::Status::OK),
                        wire::Body::SendRecordsRequest,
                        Some(body.as_union_value()),
                    )
                })
                .unwrap();
            out.extend_from_slice(&answer);
            out
        })
        .await;
        let connection = Connection::connect(&address, "c", Duration::from_secs(5), None)
            .await
            .unwrap();
        for len in sizes {
            let answer = connection
                .request("large", Duration::from_secs(10), |b| {
                    let topic = b.create_string(&len.to_string());
                    let request = wire::GetRouteRequest::create(
                        b,
                        &wire::GetRouteRequestArgs { topic: Some(topic) },
                    );
                    (wire::Body::GetRouteRequest, request.as_union_value())
                })
                .await
                .unwrap();
            let records = answer
                .frame()
                .body_as_send_records_request()
                .and_then(|r| r.records())
                .map(|v| v.bytes().to_vec())
                .unwrap();
            assert_eq!(records.len(), len);
            assert!(records == pattern(len), "answer of {len} bytes damaged");
        }
        assert!(!connection.is_closed());
        drop(connection);
        server.await.unwrap();
    }

    #[tokio::test]
    async fn refused_connection_says_where() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        drop(listener);
        let error = Connection::connect(&address, "c", Duration::from_secs(1), None)
            .await
            .unwrap_err();
        assert!(error.to_string().contains(&address), "{error}");
        assert!(error.is_retriable());
    }
}
