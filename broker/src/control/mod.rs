//! The broker's control plane: tasks that run beside the data plane on network shard 0 and never
//! sit in a per-message path.

pub mod metrics_http;
