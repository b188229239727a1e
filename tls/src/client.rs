//! The connecting side's TLS: which CAs to trust, an optional client certificate, and the
//! name the server's certificate must carry.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::pki_types::ServerName;
use rustls::ClientConfig;

use crate::files;
use crate::TlsError;

/// The files and name a connecting side's TLS is made of.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientTlsFiles {
    /// PEM: the CAs a server certificate must chain to.
    pub ca: PathBuf,
    /// PEM: the client's certificate chain, for mutual TLS (with `key`).
    pub cert_chain: Option<PathBuf>,
    /// PEM: the client certificate's private key.
    pub key: Option<PathBuf>,
    /// The name the server certificate must be valid for; `None`: the host of the address
    /// connected to (an IP address or a DNS name).
    pub server_name: Option<String>,
}

impl ClientTlsFiles {
    #[must_use]
    pub fn new(ca: impl Into<PathBuf>) -> Self {
        Self {
            ca: ca.into(),
            ..Self::default()
        }
    }

    /// Presents this certificate to servers that ask for one (mutual TLS).
    #[must_use]
    pub fn with_client_cert(
        mut self,
        cert_chain: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
    ) -> Self {
        self.cert_chain = Some(cert_chain.into());
        self.key = Some(key.into());
        self
    }

    #[must_use]
    pub fn with_server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }

    /// Reads the files and builds the configuration.
    pub fn load(&self) -> Result<ClientTls, TlsError> {
        let roots = files::roots("CA", &self.ca)?;
        let builder = ClientConfig::builder_with_provider(crate::provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Setting(e.to_string()))?
            .with_root_certificates(roots);
        let config = match (&self.cert_chain, &self.key) {
            (None, None) => builder.with_no_client_auth(),
            (Some(cert), Some(key)) => {
                let chain = files::certificates("client certificate", cert)?;
                let private_key = files::private_key(key)?;
                builder
                    .with_client_auth_cert(chain, private_key)
                    .map_err(|source| TlsError::Pair {
                        cert: cert.clone(),
                        key: key.clone(),
                        source,
                    })?
            }
            (Some(cert), None) => {
                return Err(TlsError::Setting(format!(
                    "client certificate {} given without its key",
                    cert.display()
                )))
            }
            (None, Some(key)) => {
                return Err(TlsError::Setting(format!(
                    "client key {} given without its certificate",
                    key.display()
                )))
            }
        };
        let server_name = match &self.server_name {
            Some(name) => Some(parse_server_name(name)?),
            None => None,
        };
        Ok(ClientTls {
            config: Arc::new(config),
            server_name,
        })
    }
}

/// A loaded client configuration, cheap to clone and share between connections.
#[derive(Clone)]
pub struct ClientTls {
    config: Arc<ClientConfig>,
    server_name: Option<ServerName<'static>>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ClientTls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    #[must_use]
    pub fn config(&self) -> Arc<ClientConfig> {
        self.config.clone()
    }

    /// The name to verify the server at `address` (`host:port`) by: the configured one, or
    /// the address's host.
    pub fn server_name_for(&self, address: &str) -> Result<ServerName<'static>, TlsError> {
        if let Some(name) = &self.server_name {
            return Ok(name.clone());
        }
        let host = match address.rsplit_once(':') {
            Some((host, _port)) => host,
            None => address,
        };
        parse_server_name(host.trim_start_matches('[').trim_end_matches(']'))
    }
}

fn parse_server_name(name: &str) -> Result<ServerName<'static>, TlsError> {
    ServerName::try_from(name.to_owned())
        .map_err(|_| TlsError::Setting(format!("`{name}` is not a DNS name or an IP address")))
}
