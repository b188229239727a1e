//! A listener's TLS: its certificate, key and optional client CA, reloaded when they change.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
use tracing::{info, warn};

use crate::files::{self, Stamp};
use crate::TlsError;

/// Least time between two looks at the files: a burst of connections costs one `stat` of each
/// file, not one per connection.
pub const RELOAD_CHECK_INTERVAL: Duration = Duration::from_millis(500);

/// Whether clients must present a certificate signed by the client CA (mutual TLS).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ClientAuth {
    /// A client without a certificate is refused in the handshake.
    #[default]
    Required,
    /// A client may present none; one it presents must verify.
    Optional,
}

impl std::str::FromStr for ClientAuth {
    type Err = TlsError;

    fn from_str(text: &str) -> Result<Self, TlsError> {
        match text.trim().to_ascii_lowercase().as_str() {
            "required" => Ok(Self::Required),
            "optional" => Ok(Self::Optional),
            _ => Err(TlsError::Setting(format!(
                "client certificate policy `{text}` is not one of required, optional"
            ))),
        }
    }
}

/// The files a listener's TLS is made of.
#[derive(Clone, Debug)]
pub struct ServerTlsFiles {
    /// PEM: the server's certificate, then any intermediates.
    pub cert_chain: PathBuf,
    /// PEM: the certificate's private key.
    pub key: PathBuf,
    /// PEM: the CAs a client certificate must chain to; `None`: no client certificates asked.
    pub client_ca: Option<PathBuf>,
    pub client_auth: ClientAuth,
}

impl ServerTlsFiles {
    #[must_use]
    pub fn new(cert_chain: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        Self {
            cert_chain: cert_chain.into(),
            key: key.into(),
            client_ca: None,
            client_auth: ClientAuth::Required,
        }
    }

    /// Asks clients for certificates signed by a CA of `client_ca` (mutual TLS).
    #[must_use]
    pub fn with_client_ca(mut self, client_ca: impl Into<PathBuf>, auth: ClientAuth) -> Self {
        self.client_ca = Some(client_ca.into());
        self.client_auth = auth;
        self
    }

    fn paths(&self) -> Vec<&PathBuf> {
        let mut paths = vec![&self.cert_chain, &self.key];
        paths.extend(self.client_ca.as_ref());
        paths
    }

    /// Reads the files and builds the configuration.
    pub fn build(&self) -> Result<ServerConfig, TlsError> {
        let chain = files::certificates("certificate", &self.cert_chain)?;
        let key = files::private_key(&self.key)?;
        let provider = crate::provider();
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Setting(e.to_string()))?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(path) => {
                let roots = files::roots("client CA", path)?;
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
                let verifier = match self.client_auth {
                    ClientAuth::Required => verifier,
                    ClientAuth::Optional => verifier.allow_unauthenticated(),
                };
                let verifier = verifier.build().map_err(|e| TlsError::ClientVerifier {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder
            .with_single_cert(chain, key)
            .map_err(|source| TlsError::Pair {
                cert: self.cert_chain.clone(),
                key: self.key.clone(),
                source,
            })?;
        // Both protocols are framed binary streams; no ALPN is offered or needed.
        config.alpn_protocols.clear();
        // No session tickets: connections are long-lived, so resumption saves little, and a
        // ticket is bytes the server sends unasked after the handshake, which a peer that
        // checks its idle connection for unexpected bytes (the broker's registration link)
        // would take for a broken stream.
        config.send_tls13_tickets = 0;
        Ok(config)
    }
}

struct Current {
    stamp: Stamp,
    config: Arc<ServerConfig>,
    checked: Instant,
    /// The stamp of files that last failed to load, so a broken file is reported once.
    failed: Option<Stamp>,
}

/// A listener's TLS, shared by the threads that accept on it: [`config`](Self::config) gives
/// the configuration for a new connection, read again from the files when they changed (at
/// most every [`RELOAD_CHECK_INTERVAL`]). Connections already open keep the one they began with.
pub struct ServerTls {
    files: ServerTlsFiles,
    current: Mutex<Current>,
    plain_refused: AtomicU64,
    reloads: AtomicU64,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ServerTls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Loads the files; an error names the file at fault.
    pub fn load(files: ServerTlsFiles) -> Result<Self, TlsError> {
        let stamp = Stamp::of(&files.paths());
        let config = Arc::new(files.build()?);
        Ok(Self {
            files,
            current: Mutex::new(Current {
                stamp,
                config,
                checked: Instant::now(),
                failed: None,
            }),
            plain_refused: AtomicU64::new(0),
            reloads: AtomicU64::new(0),
        })
    }

    #[must_use]
    pub fn files(&self) -> &ServerTlsFiles {
        &self.files
    }

    /// The configuration for a connection accepted now. When the files changed since they
    /// were last read, they are read again; files that do not load (a certificate replaced
    /// before its key, say) leave the previous configuration in use, with one warning.
    #[must_use]
    pub fn config(&self) -> Arc<ServerConfig> {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if current.checked.elapsed() >= RELOAD_CHECK_INTERVAL {
            current.checked = Instant::now();
            self.reload_if_changed(&mut current);
        }
        current.config.clone()
    }

    fn reload_if_changed(&self, current: &mut Current) {
        let stamp = Stamp::of(&self.files.paths());
        if stamp == current.stamp || current.failed.as_ref() == Some(&stamp) {
            return;
        }
        match self.files.build() {
            Ok(config) => {
                info!(cert = %self.files.cert_chain.display(), "TLS certificate files changed: new connections use them");
                current.config = Arc::new(config);
                current.stamp = stamp;
                current.failed = None;
                self.reloads.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => {
                warn!(%error, "TLS certificate files changed but do not load; keeping the previous ones");
                current.failed = Some(stamp);
            }
        }
    }

    /// Counts a plain connection refused by an enforcing listener; true for the first one, so
    /// the caller can log it once at warn and the rest at debug.
    pub fn plain_refused(&self) -> bool {
        self.plain_refused.fetch_add(1, Ordering::Relaxed) == 0
    }

    /// Plain connections refused so far.
    #[must_use]
    pub fn plain_refused_count(&self) -> u64 {
        self.plain_refused.load(Ordering::Relaxed)
    }

    /// Times the files were read again after a change.
    #[must_use]
    pub fn reload_count(&self) -> u64 {
        self.reloads.load(Ordering::Relaxed)
    }
}
