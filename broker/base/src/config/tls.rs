//! The broker's TLS settings (docs/tls.md): the `[tls]` table of the config file and the
//! `--tls-*` flags. Only paths and names: the files are read by `shardmq-tls` when the broker
//! starts (and again when they change).

use std::path::PathBuf;

use serde::Deserialize;
use shardmq_tls::{ClientAuth, ClientTlsFiles, ServerTlsFiles, TlsMode};

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsSettings {
    /// RocketMQ's `tls.server.mode` for the client port and the HA port: `disabled`,
    /// `permissive` (TLS and plain on one port) or `enforcing` (TLS only).
    pub mode: String,
    /// PEM: this broker's certificate chain (needed unless the mode is disabled).
    pub cert: Option<PathBuf>,
    /// PEM: the private key of `cert`.
    pub key: Option<PathBuf>,
    /// PEM: CAs that client certificates must chain to; set: clients must present one.
    pub client_ca: Option<PathBuf>,
    /// With `client_ca`: `required` (default) or `optional`.
    pub client_auth: String,
    /// PEM: CAs this broker trusts when it connects out (to name servers, its master, the
    /// controllers); set: those connections use TLS.
    pub ca: Option<PathBuf>,
    /// PEM: the certificate this broker presents when it connects out to a server that asks
    /// for one (mutual TLS), with `client_key`.
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
    /// The name the servers' certificates must carry; empty: the host of each address.
    pub server_name: String,
}

impl TlsSettings {
    pub fn mode(&self) -> Result<TlsMode, String> {
        if self.mode.is_empty() {
            return Ok(TlsMode::Disabled);
        }
        self.mode
            .parse()
            .map_err(|e: shardmq_tls::TlsError| e.to_string())
    }

    /// The listeners' files; `None` when the mode is disabled.
    pub fn server_files(&self) -> Result<Option<ServerTlsFiles>, String> {
        let mode = self.mode()?;
        if !mode.is_tls_accepted() {
            return Ok(None);
        }
        let (Some(cert), Some(key)) = (&self.cert, &self.key) else {
            return Err(format!(
                "tls mode {mode} needs a certificate and its key (--tls-cert, --tls-key)"
            ));
        };
        let mut files = ServerTlsFiles::new(cert, key);
        if let Some(client_ca) = &self.client_ca {
            let auth: ClientAuth = if self.client_auth.is_empty() {
                ClientAuth::Required
            } else {
                self.client_auth
                    .parse()
                    .map_err(|e: shardmq_tls::TlsError| e.to_string())?
            };
            files = files.with_client_ca(client_ca, auth);
        }
        Ok(Some(files))
    }

    /// The outbound connections' files; `None` without a CA (plain connections).
    pub fn client_files(&self) -> Result<Option<ClientTlsFiles>, String> {
        let Some(ca) = &self.ca else {
            if self.client_cert.is_some() || self.client_key.is_some() {
                return Err("tls client_cert/client_key need tls ca (--tls-ca)".into());
            }
            return Ok(None);
        };
        let mut files = ClientTlsFiles::new(ca);
        files.cert_chain = self.client_cert.clone();
        files.key = self.client_key.clone();
        if !self.server_name.is_empty() {
            files.server_name = Some(self.server_name.clone());
        }
        Ok(Some(files))
    }

    /// Checks the settings' shape (the files are read at start).
    pub fn validate(&self) -> Result<(), String> {
        self.server_files()?;
        self.client_files()?;
        if self.mode()? == TlsMode::Disabled
            && (self.cert.is_some() || self.key.is_some() || self.client_ca.is_some())
        {
            return Err(
                "tls cert/key/client_ca are set but tls mode is disabled; set --tls-mode permissive or enforcing".into(),
            );
        }
        Ok(())
    }
}
