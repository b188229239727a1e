//! The broker's control plane: the tasks that keep its place in the cluster, one home, run
//! beside the data plane on network shard 0 and never in a per-message path (DESIGN.md,
//! "Layering"):
//!
//! - `registration`: announcing the broker to its name servers;
//! - `controller`: the broker's side of the Raft controller (role at start, heartbeats, the
//!   in-sync set a master reports, restart on a new role);
//! - `metadata_copy`: a slave's copy of its master's topics and offsets, a master's restore of
//!   topics its store holds;
//! - `metrics_http`: the `/metrics` endpoint.
//!
//! The runtime starts it once network shard 0 serves ([`start`]) and stops it after the shard
//! has drained ([`ControlPlane::stop`]). It reaches storage only through the network shard's
//! `ask`, as any request does.

pub mod controller;
pub mod metadata_copy;
pub mod metrics_http;
pub mod registration;

use std::rc::Rc;

use glommio::task::JoinHandle;

use crate::config::BrokerRole;
use crate::network::NetworkShard;

/// The control tasks running beside network shard 0.
pub struct ControlPlane {
    registration: Option<JoinHandle<()>>,
    metrics_endpoint: Option<JoinHandle<()>>,
    metadata_copy: Option<JoinHandle<()>>,
    controller: Option<JoinHandle<()>>,
}

/// Starts the control plane beside network shard `shard` (shard 0). A master first restores
/// the configs of topics its store holds messages of.
pub async fn start(shard: &Rc<NetworkShard>) -> Result<ControlPlane, String> {
    let config = shard.config.clone();
    let metrics_addr = config.metrics_listen_addr()?;
    let is_slave = config.role() == BrokerRole::Slave;
    if !is_slave {
        metadata_copy::restore_topics_from_store(shard).await;
    }
    let controller = (config.controller_self_id > 0)
        .then(|| glommio::spawn_local(controller::run(shard.clone())).detach());
    let metadata_copy =
        is_slave.then(|| glommio::spawn_local(metadata_copy::run(shard.clone())).detach());
    let registration = (!config.namesrv.is_empty())
        .then(|| glommio::spawn_local(registration::run(shard.clone())).detach());
    let metrics_endpoint = metrics_addr
        .map(|addr| glommio::spawn_local(metrics_http::serve(shard.clone(), addr)).detach());
    Ok(ControlPlane {
        registration,
        metrics_endpoint,
        metadata_copy,
        controller,
    })
}

impl ControlPlane {
    /// Stops every control task; the registration task first unregisters from the name
    /// servers (it sees the broker's stop flag).
    pub async fn stop(self) {
        if let Some(task) = self.registration {
            task.await;
        }
        for task in [self.metrics_endpoint, self.metadata_copy, self.controller]
            .into_iter()
            .flatten()
        {
            task.cancel();
        }
    }
}
