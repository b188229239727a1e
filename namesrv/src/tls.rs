//! TLS on the name server's listener (docs/tls.md): RocketMQ's three modes, a TLS connection
//! told from a plain one by its first bytes (both protocols, native and remoting, are served
//! over either), and the handshake.
//!
//! Owns: the listener's TLS and the choice per connection. Never: framing; the connection code
//! serves the decrypted stream as it serves a socket.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use shardmq_tls::{ServerTls, TlsMode};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::timeout;
use tracing::{debug, warn};

use crate::server::Closed;

static LINK_TLS: std::sync::OnceLock<shardmq_tls::ClientTls> = std::sync::OnceLock::new();

/// Makes the controller's links to other controllers use TLS (`--tls-ca`); set once, before the
/// controller starts.
pub fn set_link_tls(tls: shardmq_tls::ClientTls) {
    let _ = LINK_TLS.set(tls);
}

/// A connection to another controller: in TLS when [`set_link_tls`] was called.
pub(crate) type LinkStream = Either<TcpStream, tokio_rustls::client::TlsStream<TcpStream>>;

/// Connects to `address`, and shakes hands in TLS when the links use it.
pub(crate) async fn connect_link(address: &str) -> io::Result<LinkStream> {
    let stream = TcpStream::connect(address).await?;
    let _ = stream.set_nodelay(true);
    let Some(tls) = LINK_TLS.get() else {
        return Ok(Either::Plain(stream));
    };
    let name = tls.server_name_for(address).map_err(io::Error::other)?;
    let connector = tokio_rustls::TlsConnector::from(tls.config());
    let stream = connector.connect(name, stream).await.map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("TLS handshake with {address} failed: {e}"),
        )
    })?;
    Ok(Either::Tls(stream))
}

/// The listener's mode and its certificate (looked at again on each TLS connection, and read
/// again when the files changed).
#[derive(Clone, Debug)]
pub struct ListenerTls {
    pub mode: TlsMode,
    pub server: Arc<ServerTls>,
}

/// Serves `stream`: in TLS when its first bytes start a handshake, in plain when they do not
/// and the mode permits it; `serve` serves the stream either way.
pub(crate) async fn serve<Fut>(
    stream: TcpStream,
    peer: SocketAddr,
    tls: &ListenerTls,
    handshake_timeout: Duration,
    serve: impl FnOnce(Either<TcpStream, tokio_rustls::server::TlsStream<TcpStream>>) -> Fut,
) -> Closed
where
    Fut: Future<Output = Closed>,
{
    let mut first = [0u8; 2];
    let peeked = match timeout(handshake_timeout, stream.peek(&mut first)).await {
        Ok(Ok(0)) => return Closed::ByPeer,
        Ok(Ok(peeked)) => peeked,
        Ok(Err(error)) => return Closed::Io(error),
        Err(_) => return Closed::Idle,
    };
    match shardmq_tls::starts_tls(&first[..peeked]) {
        Some(true) => {}
        _ if tls.mode.is_plain_accepted() => return serve(Either::Plain(stream)).await,
        _ => {
            if tls.server.plain_refused() {
                warn!(%peer, "refusing a plain connection: TLS mode is enforcing (further ones are logged at debug)");
            }
            return Closed::Refused("a plain connection; TLS mode is enforcing".to_owned());
        }
    }
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.server.config());
    match timeout(handshake_timeout, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => serve(Either::Tls(stream)).await,
        Ok(Err(error)) => {
            debug!(%peer, %error, "TLS handshake failed");
            Closed::Refused(format!("TLS handshake failed: {error}"))
        }
        Err(_) => Closed::Idle,
    }
}

/// A connection's stream on a listener with TLS: the socket, or the TLS session over it.
pub(crate) enum Either<P, T> {
    Plain(P),
    Tls(T),
}

impl<P: AsyncRead + Unpin, T: AsyncRead + Unpin> AsyncRead for Either<P, T> {
    fn poll_read(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffer: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Either::Plain(stream) => Pin::new(stream).poll_read(context, buffer),
            Either::Tls(stream) => Pin::new(stream).poll_read(context, buffer),
        }
    }
}

impl<P: AsyncWrite + Unpin, T: AsyncWrite + Unpin> AsyncWrite for Either<P, T> {
    fn poll_write(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffer: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Either::Plain(stream) => Pin::new(stream).poll_write(context, buffer),
            Either::Tls(stream) => Pin::new(stream).poll_write(context, buffer),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Either::Plain(stream) => Pin::new(stream).poll_flush(context),
            Either::Tls(stream) => Pin::new(stream).poll_flush(context),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Either::Plain(stream) => Pin::new(stream).poll_shutdown(context),
            Either::Tls(stream) => Pin::new(stream).poll_shutdown(context),
        }
    }
}

/// The name server's `--tls-*` flags.
#[derive(clap::Args, Debug, Default)]
pub struct TlsArgs {
    /// TLS on the listener: `disabled`, `permissive` (TLS and plain on one port) or
    /// `enforcing` (TLS only).
    #[arg(long, value_name = "MODE", default_value = "disabled")]
    pub tls_mode: String,
    /// PEM certificate chain the listener presents (with --tls-key).
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<std::path::PathBuf>,
    /// PEM CAs client certificates must chain to: mutual TLS.
    #[arg(long, value_name = "FILE")]
    pub tls_client_ca: Option<std::path::PathBuf>,
    /// With --tls-client-ca: `required` or `optional`.
    #[arg(long, value_name = "POLICY", default_value = "required")]
    pub tls_client_auth: String,
    /// PEM CAs a controller trusts when it connects to the other controllers; given: those
    /// links use TLS.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// PEM certificate a controller presents on those links (for peers with --tls-client-ca).
    #[arg(long, value_name = "FILE", requires = "tls_client_key")]
    pub tls_client_cert: Option<std::path::PathBuf>,
    /// PEM private key of --tls-client-cert.
    #[arg(long, value_name = "FILE", requires = "tls_client_cert")]
    pub tls_client_key: Option<std::path::PathBuf>,
}

impl TlsArgs {
    /// The controller links' TLS, its files read; `None` without --tls-ca.
    pub fn load_link(&self) -> Result<Option<shardmq_tls::ClientTls>, String> {
        let Some(ca) = &self.tls_ca else {
            if self.tls_client_cert.is_some() {
                return Err("--tls-client-cert needs --tls-ca".into());
            }
            return Ok(None);
        };
        let mut files = shardmq_tls::ClientTlsFiles::new(ca);
        files.cert_chain = self.tls_client_cert.clone();
        files.key = self.tls_client_key.clone();
        files.load().map(Some).map_err(|e| e.to_string())
    }

    /// The listener's TLS, its files read; `None` when disabled. Errors name the flag or file.
    pub fn load(&self) -> Result<Option<ListenerTls>, String> {
        let mode: TlsMode = self
            .tls_mode
            .parse()
            .map_err(|e: shardmq_tls::TlsError| e.to_string())?;
        if !mode.is_tls_accepted() {
            if self.tls_cert.is_some() || self.tls_key.is_some() || self.tls_client_ca.is_some() {
                return Err("--tls-cert/--tls-key/--tls-client-ca given but --tls-mode is disabled; set --tls-mode permissive or enforcing".into());
            }
            return Ok(None);
        }
        let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) else {
            return Err(format!("--tls-mode {mode} needs --tls-cert and --tls-key"));
        };
        let mut files = shardmq_tls::ServerTlsFiles::new(cert, key);
        if let Some(client_ca) = &self.tls_client_ca {
            let auth = self
                .tls_client_auth
                .parse()
                .map_err(|e: shardmq_tls::TlsError| e.to_string())?;
            files = files.with_client_ca(client_ca, auth);
        }
        let server = ServerTls::load(files).map_err(|e| e.to_string())?;
        Ok(Some(ListenerTls {
            mode,
            server: Arc::new(server),
        }))
    }
}
