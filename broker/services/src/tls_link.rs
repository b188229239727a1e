//! The broker's outbound connections on glommio (to name servers, to its master), in TLS
//! when the broker has a CA to trust (`[tls] ca`, docs/tls.md), plain otherwise.
//!
//! Owns the client configuration, loaded once per process from the broker's settings, and
//! [`LinkStream`], the stream those connections read and write. Never: framing; the callers
//! speak the frame protocol over it as they would over a `TcpStream`.

use std::io;
use std::net::SocketAddr;
use std::os::unix::io::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_lite::{AsyncRead, AsyncWrite};
use glommio::net::TcpStream;
use shardmq_tls::ClientTls;

use crate::config::BrokerConfig;

static CLIENT_TLS: OnceLock<Result<Option<ClientTls>, String>> = OnceLock::new();

/// Reads the broker's outbound TLS files (none: its connections stay plain); an error names
/// the file. Called once when the broker starts, before it connects anywhere.
pub fn init(config: &BrokerConfig) -> Result<(), String> {
    CLIENT_TLS
        .get_or_init(|| match config.tls.client_files()? {
            Some(files) => files.load().map(Some).map_err(|e| e.to_string()),
            None => Ok(None),
        })
        .clone()
        .map(|_| ())
}

/// The outbound TLS read by [`init`]; `None`: plain.
pub fn client_tls() -> Option<ClientTls> {
    CLIENT_TLS
        .get()
        .and_then(|loaded| loaded.clone().ok())
        .flatten()
}

/// A connection to another server, in TLS or not.
pub enum LinkStream {
    Plain(TcpStream),
    Tls(Box<futures_rustls::client::TlsStream<TcpStream>>),
}

impl LinkStream {
    /// Connects to `address` within `timeout` (TCP and, when configured, the TLS handshake);
    /// a TLS failure says so, with rustls' reason (an unknown issuer, an expired certificate).
    pub async fn connect(address: SocketAddr, timeout: Duration) -> io::Result<LinkStream> {
        let tls = client_tls();
        let stream = TcpStream::connect_timeout(address, timeout)
            .await
            .map_err(io::Error::from)?;
        let _ = stream.set_nodelay(true);
        let Some(tls) = tls else {
            return Ok(LinkStream::Plain(stream));
        };
        let name = tls
            .server_name_for(&address.to_string())
            .map_err(io::Error::other)?;
        let connector = futures_rustls::TlsConnector::from(tls.config());
        let handshake = async {
            connector.connect(name, stream).await.map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("TLS handshake with {address} failed: {e}"),
                )
            })
        };
        let connected = futures_lite::future::or(async { Some(handshake.await) }, async {
            glommio::timer::sleep(timeout).await;
            None
        })
        .await;
        match connected {
            Some(stream) => Ok(LinkStream::Tls(Box::new(stream?))),
            None => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("TLS handshake with {address} timed out"),
            )),
        }
    }
}

impl AsRawFd for LinkStream {
    /// The TCP socket (under TLS, its bytes are records, not frames).
    fn as_raw_fd(&self) -> RawFd {
        match self {
            LinkStream::Plain(stream) => stream.as_raw_fd(),
            LinkStream::Tls(stream) => stream.get_ref().0.as_raw_fd(),
        }
    }
}

impl AsyncRead for LinkStream {
    fn poll_read(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffer: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            LinkStream::Plain(stream) => Pin::new(stream).poll_read(context, buffer),
            LinkStream::Tls(stream) => Pin::new(stream.as_mut()).poll_read(context, buffer),
        }
    }
}

impl AsyncWrite for LinkStream {
    fn poll_write(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffer: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            LinkStream::Plain(stream) => Pin::new(stream).poll_write(context, buffer),
            LinkStream::Tls(stream) => Pin::new(stream.as_mut()).poll_write(context, buffer),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            LinkStream::Plain(stream) => Pin::new(stream).poll_flush(context),
            LinkStream::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(context),
        }
    }

    fn poll_close(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            LinkStream::Plain(stream) => Pin::new(stream).poll_close(context),
            LinkStream::Tls(stream) => Pin::new(stream.as_mut()).poll_close(context),
        }
    }
}
