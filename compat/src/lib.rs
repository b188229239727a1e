//! Support for the RocketMQ compatibility tests (the tests themselves are in `tests/`): they run
//! ShardMQ's real binaries and talk to them with the real RocketMQ Rust client from crates.io,
//! `rocketmq-client-rust` 1.0.0, over RocketMQ's remoting protocol.
//!
//! Owns: the server processes ([`servers`]: locating the main workspace's built binaries,
//! starting a name server and a broker on loopback with temp data dirs, creating topics and
//! inspecting groups with the `shardmq` CLI, waiting on conditions with deadlines) and the
//! RocketMQ client side ([`client`]: the runtime the 1.0.0 client needs, the serialize-type
//! switch, calls with a deadline, the admin client; [`producer`]: plain and transactional
//! producers; [`consumer`]: push consumers and what their listeners received; the admin client,
//! the plain producer and push consumers can sign their requests with an account's
//! `SessionCredentials`, RocketMQ's ACL 1.0). Never: building
//! the binaries (run `cargo build --workspace --bins` at the repo root first, or
//! `scripts/compat.sh`), or ShardMQ's own protocol: what the servers are asked goes through the
//! RocketMQ client or the CLI.
//!
//! Data enters as the servers' `listening on` lines and the client's results; it leaves as
//! addresses, routes, send results, deliveries, and the servers' logs (printed when a test
//! fails).

// The 1.0.0 client's futures nest deeper than the compiler's default limit (128) allows when
// their layout is computed here (`cargo clippy` fails without it); the client's own crate and
// its examples and tests raise it the same way.
#![recursion_limit = "256"]

pub mod client;
pub mod consumer;
pub mod producer;
pub mod servers;
