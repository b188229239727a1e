//! `shardmq-namesrv`: the name server, ShardMQ's counterpart of RocketMQ's NameServer. Brokers
//! register with it every 30 s with their topic configs; clients ask it where a topic lives.
//! It is stateless: after a restart the route table fills again from the next registrations.
//!
//! Modules, in the direction data flows:
//! - [`server`]: sockets. Accepts connections (at most `max_connections`), splits each byte
//!   stream into frames, writes the answers, closes idle or broken connections, and runs the
//!   scan that drops silent brokers. Knows nothing of what a request means.
//! - [`handler`]: one verified frame in, the response frame out. Enforces the handshake,
//!   turns wire tables into registry calls and registry answers into wire tables. No I/O.
//! - [`registry`]: the route table itself, pure data and rules, tested without sockets or
//!   clocks.
//! - [`remoting`]: RocketMQ's remoting protocol on the same port (told apart by a connection's
//!   first bytes): route, cluster and topic-list queries for RocketMQ clients and tools.
//! - [`access`]: access control (docs/acl.md): the accounts file, the handshake's challenge,
//!   and what each request of the three ports needs.
//!
//! The wire format is `docs/protocol.md` ("Name server"); the schema is `schema/fbs/namesrv.fbs`.

pub mod access;
pub mod controller;
pub mod handler;
pub mod metrics;
pub mod registry;
pub mod remoting;
pub mod server;
pub mod tls;

pub use handler::RequestHandler;
pub use registry::{RegistryError, RegistryLimits, RouteTable};
pub use server::{NamesrvServer, ServerConfig, ServerError};
