//! The broker's `--tls-*` flags (docs/tls.md); each overrides the config file's key of the same
//! name in its `[tls]` table.

use std::path::PathBuf;

use clap::Args;
use shardmq_broker::config::tls::TlsSettings;

#[derive(Args, Debug, Default)]
pub struct TlsArgs {
    /// TLS on the client and HA ports: `disabled`, `permissive` (TLS and plain on one port)
    /// or `enforcing` (TLS only). [default: disabled]
    #[arg(long)]
    tls_mode: Option<String>,
    /// PEM certificate chain the broker's ports present (with --tls-key).
    #[arg(long)]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long)]
    tls_key: Option<PathBuf>,
    /// PEM CAs client certificates must chain to: mutual TLS.
    #[arg(long)]
    tls_client_ca: Option<PathBuf>,
    /// With --tls-client-ca: `required` or `optional`. [default: required]
    #[arg(long)]
    tls_client_auth: Option<String>,
    /// PEM CAs trusted when this broker connects to name servers, its master and the
    /// controllers; given: those connections use TLS.
    #[arg(long)]
    tls_ca: Option<PathBuf>,
    /// PEM certificate presented on those connections, for servers asking for one.
    #[arg(long)]
    tls_client_cert: Option<PathBuf>,
    /// PEM private key of --tls-client-cert.
    #[arg(long)]
    tls_client_key: Option<PathBuf>,
    /// Name the servers' certificates must carry. [default: the host of each address]
    #[arg(long)]
    tls_server_name: Option<String>,
}

impl TlsArgs {
    pub fn apply(self, settings: &mut TlsSettings) {
        if let Some(mode) = self.tls_mode {
            settings.mode = mode;
        }
        if let Some(auth) = self.tls_client_auth {
            settings.client_auth = auth;
        }
        if let Some(name) = self.tls_server_name {
            settings.server_name = name;
        }
        let paths = [
            (self.tls_cert, &mut settings.cert),
            (self.tls_key, &mut settings.key),
            (self.tls_client_ca, &mut settings.client_ca),
            (self.tls_ca, &mut settings.ca),
            (self.tls_client_cert, &mut settings.client_cert),
            (self.tls_client_key, &mut settings.client_key),
        ];
        for (flag, setting) in paths {
            if flag.is_some() {
                *setting = flag;
            }
        }
    }
}
