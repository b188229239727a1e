//! TLS for ShardMQ's listeners and connections (docs/tls.md): the server and client
//! configurations built from PEM files, RocketMQ's three server modes, and the reload of
//! certificate and key files when they change.
//!
//! Owns: reading and checking the files (every error names the file), building `rustls`
//! configurations on the `ring` provider, telling a TLS ClientHello from a plain frame by its
//! first bytes, and counting plain connections an enforcing listener refused. Never: sockets.
//! Each component wraps its own streams (`futures-rustls` on glommio, `tokio-rustls` on tokio)
//! with the configuration it gets here, so this crate knows no runtime.

mod client;
mod error;
mod files;
mod mode;
mod server;

pub use client::{ClientTls, ClientTlsFiles};
pub use error::TlsError;
pub use mode::TlsMode;
pub use rustls;
pub use server::{ClientAuth, ServerTls, ServerTlsFiles, RELOAD_CHECK_INTERVAL};

/// What the first bytes of a connection say about TLS: `None` while there are none, else
/// whether they start a TLS record of the handshake type (0x16) of a TLS 1.x version (0x03).
///
/// Both of ShardMQ's protocols (native and RocketMQ remoting) start with a big-endian 4-byte
/// frame length, and a length whose first byte is 0x16 (369 MB or more) is over every frame
/// limit, so the first byte alone tells them apart; the second is checked when it has arrived.
#[must_use]
pub fn starts_tls(first_bytes: &[u8]) -> Option<bool> {
    match first_bytes {
        [] => None,
        [0x16] => Some(true),
        [0x16, 0x03, ..] => Some(true),
        _ => Some(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_hello_is_told_from_frames() {
        assert_eq!(starts_tls(&[]), None);
        assert_eq!(starts_tls(&[0x16]), Some(true));
        assert_eq!(starts_tls(&[0x16, 0x03, 0x01, 0x02, 0x00]), Some(true));
        // A native or remoting frame of a few hundred bytes.
        assert_eq!(starts_tls(&[0x00, 0x00, 0x01, 0x2c]), Some(false));
        assert_eq!(starts_tls(&[0x16, 0x00]), Some(false));
    }
}

#[cfg(test)]
mod tests_with_files;

/// The crypto provider every configuration here uses: `ring`, which builds without a C
/// toolchain beyond the one Rust needs (aws-lc needs cmake and more). rustls 0.23.48 marks
/// ring's provider deprecated because it lacks the post-quantum key exchange aws-lc has; the
/// classical groups (X25519, P-256, P-384) it offers are what this crate relies on.
#[allow(deprecated)]
pub(crate) fn provider() -> std::sync::Arc<rustls::crypto::CryptoProvider> {
    std::sync::Arc::new(rustls::crypto::ring::default_provider())
}
