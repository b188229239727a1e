//! Why a TLS configuration could not be made; every variant names the file or setting.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read TLS {what} file {path}: {source}")]
    Read {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("TLS {what} file {path} is not PEM as expected: {reason}")]
    Pem {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("TLS {what} file {path} holds no {expected}")]
    Empty {
        what: &'static str,
        path: PathBuf,
        expected: &'static str,
    },
    #[error("TLS CA file {path}: certificate {index} is not a usable trust anchor: {source}")]
    BadAnchor {
        path: PathBuf,
        index: usize,
        source: rustls::Error,
    },
    #[error("TLS certificate {cert} and key {key} do not make a usable pair: {source}")]
    Pair {
        cert: PathBuf,
        key: PathBuf,
        source: rustls::Error,
    },
    #[error("TLS client CA file {path} cannot verify clients: {reason}")]
    ClientVerifier { path: PathBuf, reason: String },
    #[error("TLS setting: {0}")]
    Setting(String),
}
