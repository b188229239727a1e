//! The stored record format, from the `shardmq-codec` crate (one codec for the broker, the
//! client, `verify` and the fuzz targets); re-exported here so the store's modules name it as
//! their own.

pub use shardmq_codec::*;
