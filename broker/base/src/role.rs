//! Process-wide role state, shared by the broker's network and storage executors: whether a
//! restart was asked for (a new role from the controller, a slave that must cut its log), the
//! master's HA address a slave learned from a name server, this broker's own client address,
//! and the SyncStateSet a sync master's sends wait for. Plain values behind locks; the code that
//! decides them lives in the control plane and replication.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tracing::info;

use crate::config::BrokerConfig;

/// Set when a shard asks the broker to stop and start again (a slave that must cut its
/// CommitLog, which the store does as it opens; a new role from the controller): `main`
/// re-executes the program in this process once the run has stopped.
static RESTART_REQUESTED: AtomicBool = AtomicBool::new(false);

/// Asks the broker to stop gracefully and start again (see [`take_restart_request`]).
pub fn request_restart() {
    RESTART_REQUESTED.store(true, Ordering::Relaxed);
}

/// Whether a restart is asked for (leaves the request in place).
pub fn is_restart_requested() -> bool {
    RESTART_REQUESTED.load(Ordering::Relaxed)
}

/// Whether a restart was asked for since the last call (clears the request).
pub fn take_restart_request() -> bool {
    RESTART_REQUESTED.swap(false, Ordering::Relaxed)
}

/// The master's HA address a slave learned from a name server (when `ha_master` is not set),
/// and this broker's own client address: shared by the network and storage executors.
static LEARNED_MASTER: Mutex<Option<SocketAddr>> = Mutex::new(None);
static OWN_ADDRESS: Mutex<Option<SocketAddr>> = Mutex::new(None);

/// Controller mode: the broker ids a sync master's sends wait for (its SyncStateSet, without
/// itself, plus slaves it is adding); `None` outside controller mode (then any one slave).
/// Shared, so that every waiting send reads it without copying the set.
static SYNC_WAIT_SET: Mutex<Option<Arc<BTreeSet<i64>>>> = Mutex::new(None);

pub fn set_sync_wait_set(set: Option<BTreeSet<i64>>) {
    *SYNC_WAIT_SET.lock().unwrap_or_else(|e| e.into_inner()) = set.map(Arc::new);
}

pub fn sync_wait_set() -> Option<Arc<BTreeSet<i64>>> {
    SYNC_WAIT_SET
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

/// Records the master HA address a name server named (slave registration).
pub fn learn_master(address: SocketAddr) {
    let mut learned = LEARNED_MASTER.lock().unwrap_or_else(|e| e.into_inner());
    if *learned != Some(address) {
        info!(%address, "the name server names the master's HA address");
        *learned = Some(address);
    }
}

/// Records the address this broker's clients connect to (for the master's status).
pub fn set_own_address(address: SocketAddr) {
    *OWN_ADDRESS.lock().unwrap_or_else(|e| e.into_inner()) = Some(address);
}

/// Where a slave replicates from: `ha_master`, else what a name server named.
pub fn master_address(config: &BrokerConfig) -> Option<SocketAddr> {
    if !config.ha_master.is_empty() {
        return config.ha_master.parse().ok();
    }
    *LEARNED_MASTER.lock().unwrap_or_else(|e| e.into_inner())
}

/// The address this broker's clients connect to, once network shard 0 has bound it.
pub fn own_address() -> Option<SocketAddr> {
    *OWN_ADDRESS.lock().unwrap_or_else(|e| e.into_inner())
}
