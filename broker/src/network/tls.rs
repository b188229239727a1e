//! TLS on the broker's client and HA ports (docs/tls.md): tells a TLS connection from a plain
//! one by its first bytes, refuses plain ones when enforcing, and serves a TLS connection.
//!
//! A native connection in TLS is served straight from the rustls session: the connection code
//! (`connection::serve_native`) reads decrypted bytes into its reserved room, and its writer
//! hands a whole queue of frames to the session as one vectored write, which rustls seals into
//! full records. A RocketMQ remoting connection in TLS goes through a pump instead: a task that
//! decrypts the TLS stream into one end of a Unix socket pair and encrypts what comes back,
//! while the remoting code runs on the other end as if it were the client's socket (one more
//! copy each way; measured in docs/performance.md). Flow control carries through both: when the
//! connection code stops reading, the session (or the pair) fills, reading the client stops,
//! and TCP pushes back.
//!
//! Owns: the listeners' TLS configuration (loaded once, at start; the files are looked at
//! again on each accepted TLS connection), the sniffing, the split session, the pump. Never:
//! frames.

use std::cell::RefCell;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::os::unix::io::{FromRawFd, IntoRawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use glommio::net::{TcpStream, UnixStream};
use shardmq_tls::{ServerTls, TlsMode};
use tracing::{debug, warn};

use super::{connection, NetworkShard};
use crate::config::BrokerConfig;

/// Bytes the pump moves per read (a TLS record carries at most 16 KiB; a 1 MiB batch arrives
/// in a few reads rather than in dozens).
const PUMP_CHUNK_BYTES: usize = 256 << 10;

/// Send and receive buffer of each end of a pump's socket pair: room for a whole batch, so
/// the pump and the connection code trade large pieces.
const PAIR_BUFFER_BYTES: usize = 4 << 20;

struct ListenerTls {
    mode: TlsMode,
    server: Arc<ServerTls>,
}

static LISTENER_TLS: OnceLock<Option<ListenerTls>> = OnceLock::new();

/// Reads the TLS files (the listeners' certificate and key, the outbound CA): an error names
/// the file. Called once, before the broker starts serving.
pub fn init(config: &BrokerConfig) -> Result<(), String> {
    shardmq_services::tls_link::init(config)?;
    let listener = match config.tls.server_files()? {
        None => None,
        Some(files) => Some(ListenerTls {
            mode: config.tls.mode()?,
            server: Arc::new(ServerTls::load(files).map_err(|e| e.to_string())?),
        }),
    };
    let _ = LISTENER_TLS.set(listener);
    Ok(())
}

/// The mode the listeners run in.
pub fn mode() -> TlsMode {
    match LISTENER_TLS.get() {
        Some(Some(tls)) => tls.mode,
        _ => TlsMode::Disabled,
    }
}

/// Plain connections refused by an enforcing listener since start.
pub fn plain_refused_count() -> u64 {
    match LISTENER_TLS.get() {
        Some(Some(tls)) => tls.server.plain_refused_count(),
        _ => 0,
    }
}

/// Serves a connection just accepted: as it is when TLS is disabled; else by what its first
/// bytes are.
pub async fn serve(shard: Rc<NetworkShard>, stream: TcpStream) {
    let Some(Some(tls)) = LISTENER_TLS.get() else {
        return connection::serve(shard, stream).await;
    };
    let Ok(peer) = stream.peer_addr() else { return };
    let timeout = Duration::from_millis(shard.config.handshake_timeout_ms);
    match starts_tls(&stream, timeout).await {
        None => debug!(%peer, "connection closed before its first bytes arrived"),
        Some(true) => serve_tls(shard, stream, peer, tls, timeout).await,
        Some(false) if tls.mode.is_plain_accepted() => {
            connection::serve_from(shard, stream, peer).await
        }
        Some(false) => {
            if tls.server.plain_refused() {
                warn!(%peer, "refusing a plain connection: TLS mode is enforcing (further ones are logged at debug)");
            } else {
                debug!(%peer, "refusing a plain connection: TLS mode is enforcing");
            }
        }
    }
}

/// Whether the first bytes on `stream` start a TLS handshake, looked at without taking them;
/// `None` when the peer closed or sent nothing within `timeout`.
async fn starts_tls(stream: &TcpStream, timeout: Duration) -> Option<bool> {
    let mut first = [0u8; 2];
    let peeked = futures_lite::future::or(async { stream.peek(&mut first).await.ok() }, async {
        glommio::timer::sleep(timeout).await;
        None
    })
    .await?;
    shardmq_tls::starts_tls(&first[..peeked])
}

async fn serve_tls(
    shard: Rc<NetworkShard>,
    stream: TcpStream,
    peer: SocketAddr,
    tls: &ListenerTls,
    timeout: Duration,
) {
    let _ = stream.set_nodelay(true);
    let acceptor = futures_rustls::TlsAcceptor::from(tls.server.config());
    let accepted = futures_lite::future::or(async { Some(acceptor.accept(stream).await) }, async {
        glommio::timer::sleep(timeout).await;
        None
    })
    .await;
    let tls_stream = match accepted {
        Some(Ok(tls_stream)) => tls_stream,
        Some(Err(error)) => {
            debug!(%peer, %error, "TLS handshake failed");
            return;
        }
        None => {
            debug!(%peer, "no TLS handshake within {timeout:?}");
            return;
        }
    };
    let mut tls_stream = tls_stream;
    let Some((is_remoting, first_bytes)) =
        connection::tell_protocol(&mut tls_stream, timeout).await
    else {
        debug!(%peer, "TLS connection closed before its first bytes told its protocol");
        return;
    };
    if !is_remoting {
        let (reader, writer) = split(tls_stream);
        return connection::serve_native(shard, reader, writer, None, peer, first_bytes).await;
    }
    let (local, pump_end) = match socket_pair() {
        Ok(pair) => pair,
        Err(error) => {
            warn!(%peer, %error, "cannot make the socket pair of a TLS connection; closing it");
            return;
        }
    };
    let pump = glommio::spawn_local(pump(tls_stream, pump_end)).detach();
    super::remoting::serve(shard, local, peer, first_bytes).await;
    pump.await;
}

/// The two halves of a TLS session, for the connection's reader and its writer task (one
/// thread: each poll borrows the session only while it runs). Unlike `futures_lite`'s split,
/// the write half passes vectored writes through, so that a pull answer's many record slices
/// are encrypted into full records, not one record per slice.
fn split<S>(stream: S) -> (Half<S>, Half<S>) {
    let shared = Rc::new(RefCell::new(stream));
    (Half(shared.clone()), Half(shared))
}

struct Half<S>(Rc<RefCell<S>>);

impl<S: AsyncRead + Unpin> AsyncRead for Half<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffer: &mut [u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_read(context, buffer)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Half<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffer: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_write(context, buffer)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffers: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_write_vectored(context, buffers)
    }

    fn poll_flush(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_flush(context)
    }

    fn poll_close(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_close(context)
    }
}

/// A Unix stream socket pair: the end the connection code serves (as a `TcpStream`: glommio's
/// stream works on any stream socket, and the connection code needs nothing TCP-only from it
/// but the address, which it is given), and the pump's end.
fn socket_pair() -> std::io::Result<(TcpStream, UnixStream)> {
    let (local, pump_end) = std::os::unix::net::UnixStream::pair()?;
    for end in [&local, &pump_end] {
        end.set_nonblocking(true)?;
        let socket = socket2::SockRef::from(end);
        let _ = socket.set_send_buffer_size(PAIR_BUFFER_BYTES);
        let _ = socket.set_recv_buffer_size(PAIR_BUFFER_BYTES);
    }
    // SAFETY: each descriptor was just released by its owner and is owned by one stream only.
    unsafe {
        Ok((
            TcpStream::from_raw_fd(local.into_raw_fd()),
            UnixStream::from_raw_fd(pump_end.into_raw_fd()),
        ))
    }
}

/// Moves bytes between the client's TLS stream and the connection code's end of the pair
/// until the connection code closes its end (after the client closed, or on its own: a
/// refused handshake, a stop).
async fn pump(tls: futures_rustls::server::TlsStream<TcpStream>, plain: UnixStream) {
    let (mut tls_read, mut tls_write) = futures_lite::io::split(tls);
    let (mut plain_read, mut plain_write) = futures_lite::io::split(plain);
    let inbound = async {
        let _ = copy(&mut tls_read, &mut plain_write).await;
        // The client is done sending: the connection code reads its end of stream, answers
        // what it holds and closes, which ends `outbound`.
        let _ = plain_write.close().await;
        futures_lite::future::pending::<()>().await;
    };
    let outbound = async {
        let _ = copy(&mut plain_read, &mut tls_write).await;
        // Sends close_notify, then closes the socket's write side.
        let _ = tls_write.close().await;
    };
    futures_lite::future::or(inbound, outbound).await;
}

async fn copy(
    from: &mut (impl futures_lite::AsyncRead + Unpin),
    to: &mut (impl futures_lite::AsyncWrite + Unpin),
) -> std::io::Result<()> {
    let mut buffer = vec![0u8; PUMP_CHUNK_BYTES];
    loop {
        let read = from.read(&mut buffer).await?;
        if read == 0 {
            return Ok(());
        }
        to.write_all(&buffer[..read]).await?;
        to.flush().await?;
    }
}
