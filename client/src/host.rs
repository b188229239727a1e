//! The local host as other hosts see it: its IPv4 address, which starts both the client id
//! (`ip@instance`, see `instance.rs`) and every unique message id (see `message.rs`).
//!
//! Owns: finding that address once per process. Never: connections (see `connection.rs`).

use std::net::{Ipv4Addr, UdpSocket};
use std::sync::OnceLock;

/// The local IPv4 address other hosts would see (the source address of a route to a public
/// address; nothing is sent), or loopback when there is none.
pub(crate) fn local_ipv4() -> Ipv4Addr {
    static ADDRESS: OnceLock<Ipv4Addr> = OnceLock::new();
    *ADDRESS.get_or_init(|| {
        UdpSocket::bind("0.0.0.0:0")
            .and_then(|socket| {
                socket.connect("192.0.2.1:9")?;
                socket.local_addr()
            })
            .ok()
            .and_then(|address| match address.ip() {
                std::net::IpAddr::V4(ip) if !ip.is_unspecified() => Some(ip),
                _ => None,
            })
            .unwrap_or(Ipv4Addr::LOCALHOST)
    })
}
