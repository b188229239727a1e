//! ShardMQ client (issue 4).
