//! TLS for the client's connections (docs/tls.md): which files a client uses, and the
//! handshake on a new connection.
//!
//! A client uses, in order: the files given to its builder (`.tls(..)`), the process default
//! set with [`set_default_tls`] (the `shardmq` CLI sets it from `--tls-ca` and friends), or the
//! environment — `SHARDMQ_TLS_CA`, `SHARDMQ_TLS_CERT`, `SHARDMQ_TLS_KEY`,
//! `SHARDMQ_TLS_SERVER_NAME`, as RocketMQ's clients read `tls.client.*` from the environment —
//! and connects in plain when none of them names a CA.
//!
//! Owns: that choice and the handshake. Never: framing (`connection`), which reads and writes
//! the stream this hands back.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use shardmq_tls::{ClientTls, ClientTlsFiles};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::error::{Error, Result};

pub use shardmq_tls::ClientTlsFiles as TlsFiles;

static DEFAULT_TLS: Mutex<Option<ClientTlsFiles>> = Mutex::new(None);

/// Sets the TLS files of every client of this process whose builder was given none (the CLI's
/// global `--tls-*` options). Clients started before keep what they had.
pub fn set_default_tls(files: Option<ClientTlsFiles>) {
    *DEFAULT_TLS.lock().unwrap_or_else(PoisonError::into_inner) = files;
}

/// The TLS files named by `SHARDMQ_TLS_*` environment variables, when `SHARDMQ_TLS_CA` is set.
#[must_use]
pub fn tls_from_env() -> Option<ClientTlsFiles> {
    let variable = |name: &str| std::env::var_os(name).filter(|value| !value.is_empty());
    let mut files = ClientTlsFiles::new(variable("SHARDMQ_TLS_CA")?);
    files.cert_chain = variable("SHARDMQ_TLS_CERT").map(Into::into);
    files.key = variable("SHARDMQ_TLS_KEY").map(Into::into);
    files.server_name = variable("SHARDMQ_TLS_SERVER_NAME").and_then(|n| n.into_string().ok());
    Some(files)
}

/// The TLS a new client uses (`explicit`: its builder's), loaded; an unreadable file is a
/// configuration error naming it.
pub(crate) fn resolve(explicit: Option<&ClientTlsFiles>) -> Result<Option<ClientTls>> {
    let files = match explicit {
        Some(files) => Some(files.clone()),
        None => DEFAULT_TLS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .or_else(tls_from_env),
    };
    files
        .map(|files| files.load().map_err(|e| Error::Config(e.to_string())))
        .transpose()
}

/// A connection's stream, read and written by separate tasks.
pub(crate) type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;
pub(crate) type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

/// Splits `stream` into halves, after a TLS handshake with `address` when `tls` is given
/// (within `timeout`).
pub(crate) async fn split(
    stream: TcpStream,
    address: &str,
    tls: Option<&ClientTls>,
    timeout: Duration,
) -> Result<(ReadHalf, WriteHalf)> {
    let Some(tls) = tls else {
        let (read_half, write_half) = stream.into_split();
        return Ok((Box::new(read_half), Box::new(write_half)));
    };
    let failed = |reason: String| Error::Tls {
        address: address.to_owned(),
        reason,
    };
    let name = tls
        .server_name_for(address)
        .map_err(|e| failed(e.to_string()))?;
    let connector = tokio_rustls::TlsConnector::from(tls.config());
    let stream = match tokio::time::timeout(timeout, connector.connect(name, stream)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(error)) => return Err(failed(error.to_string())),
        Err(_) => {
            return Err(failed(format!(
                "no handshake within {} ms",
                timeout.as_millis()
            )))
        }
    };
    let (read_half, write_half) = tokio::io::split(stream);
    Ok((Box::new(read_half), Box::new(write_half)))
}
