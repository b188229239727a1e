//! Broker configuration: a TOML file (`--config broker.toml`) whose every key may be overridden
//! by a command-line flag of the same name (`segment_bytes` ↔ `--segment-bytes`).
//!
//! Owns the defaults (RocketMQ's, see the reference) and the validation of the whole
//! configuration before anything starts. It never opens files other than the config file.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::store::{FlushMode, StoreConfig};

pub mod delay_levels;
pub mod tls;

/// Everything a broker can be told. Field names are the TOML keys.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BrokerConfig {
    pub cluster_name: String,
    pub broker_name: String,
    pub broker_id: i64,
    /// Address clients connect to (`host:port`; port 0 picks a free one).
    pub listen: String,
    /// Name servers to register with.
    pub namesrv: Vec<String>,
    pub data_dir: PathBuf,
    /// `sync` or `async`.
    pub flush: String,
    pub flush_interval_ms: u64,
    pub sync_flush_timeout_ms: u64,
    pub segment_bytes: u64,
    /// Pre-allocate CommitLog segment files this far ahead of the data (0: never).
    pub preallocate_ahead_bytes: u64,
    /// Size of each storage shard's append journal (`<shard>/journal`): under async flush a
    /// send is acknowledged once its bytes are in it (the kernel's page cache), not once its
    /// O_DIRECT write completes; 0 turns it off. A multiple of 4096.
    pub journal_bytes: u64,
    /// Bytes of CommitLog spans a storage shard reads ahead for consumers draining a backlog
    /// and keeps for their next pulls (0: no read-ahead); per storage shard.
    pub readahead_bytes: u64,
    pub consume_queue_entries_per_file: u64,
    pub file_reserved_hours: u64,
    /// How often retention runs (ms).
    pub retention_interval_ms: u64,
    pub disk_max_used_ratio: f64,
    pub disk_refuse_ratio: f64,
    /// Cores of the storage shards, one shard each.
    pub storage_cores: Vec<usize>,
    /// Cores of the network shards, one shard each.
    pub network_cores: Vec<usize>,
    /// Create unknown topics on first send (development only).
    pub auto_create_topics: bool,
    /// Serve pulls that filter by a SQL92 expression over message properties (RocketMQ's
    /// `enablePropertyFilter`; docs/sql-filter.md). Off: such pulls are refused.
    pub enable_property_filter: bool,
    /// Access control (docs/acl.md): the accounts file (`acl.toml`, or RocketMQ's
    /// `plain_acl.yml`), reloaded when it changes. Absent: off, every caller is served
    /// (RocketMQ's `aclEnable=false`).
    pub acl_file: Option<PathBuf>,
    /// The broker's own account, for the connections it opens (to name servers, its master and
    /// the controllers) when those enforce access control. Both or neither.
    pub access_key: Option<String>,
    pub secret_key: Option<String>,
    /// Read and write queues of an auto-created topic.
    pub default_topic_queues: u32,
    pub max_frame_bytes: usize,
    pub max_message_bytes: usize,
    pub max_batch_messages: usize,
    pub max_inflight_per_connection: usize,
    /// Bytes of received request frames a network shard holds at once (each frame charged when
    /// its length prefix arrives, until handled); reading waits beyond it. At least
    /// `max_frame_bytes`.
    pub max_request_bytes_per_shard: usize,
    /// A frame that has started arriving must be complete within this time, or the connection
    /// is closed (a slow sender cannot hold its frame's share of the budget for long).
    pub frame_read_timeout_ms: u64,
    pub max_connections: usize,
    /// Time a new connection has to complete its handshake before it is closed.
    pub handshake_timeout_ms: u64,
    /// How long an executor with nothing to do keeps polling before it sleeps: a request that
    /// arrives within that time is picked up without a wake-up (lower latency, more CPU while
    /// nearly idle). 0 sleeps at once. 100 µs by default: on a VM a sleeping executor's
    /// wake-up (and glommio's `membarrier` before each sleep) costs more than the polling, so a
    /// lone send is answered in a third of the time, for less CPU per message. Above 0, sync
    /// flush also polls while a durable write is in flight (`StoreConfig::poll_durable_writes`).
    pub spin_before_park_us: u64,
    pub max_parked_pulls: usize,
    /// Longest a pull may be held, whatever the client asks.
    pub max_suspend_timeout_ms: u64,
    /// Most messages and bytes one pull returns.
    pub max_pull_messages: u32,
    pub max_pull_bytes: u64,
    /// Requests a storage shard may have queued from one network shard before SYSTEM_BUSY.
    pub storage_queue_depth: usize,
    pub register_interval_ms: u64,
    pub client_timeout_ms: u64,
    pub offsets_persist_interval_ms: u64,
    /// Delay levels 1..=N as durations, space separated (units `ms`, `s`, `m`, `h`, `d`);
    /// RocketMQ's 18 levels by default. Level n waits the n-th duration.
    pub delay_levels: String,
    /// Longest a timer message (`deliver_at_ms` or `delay_ms`) may wait (3 days).
    pub timer_max_delay_ms: u64,
    /// Most timer messages one storage shard keeps indexed in memory; later ones are indexed
    /// as earlier ones are delivered.
    pub timer_max_pending: usize,
    /// How often delay and timer delivery progress is persisted (the duplicate window after a
    /// crash).
    pub schedule_persist_interval_ms: u64,
    /// Age at which an unresolved transaction half message is first checked back with its
    /// producer group (RocketMQ's `transactionTimeOut`, the check immunity).
    pub transaction_timeout_ms: u64,
    /// How often unresolved half messages are checked back (`transactionCheckInterval`).
    pub transaction_check_interval_ms: u64,
    /// Check-backs before an unresolved half message is discarded (`transactionCheckMax`).
    pub transaction_check_max: u32,
    /// How long an orderly consumer's queue lock lasts without renewal.
    pub queue_lock_expiry_ms: u64,
    /// `text` or `json`.
    pub log_format: String,
    /// Where `/metrics` is served (Prometheus text format); empty: not served.
    pub metrics_listen: String,
    /// `async-master` (default), `sync-master` or `slave` (docs/replication.md).
    pub broker_role: String,
    /// A master's address for its slaves (`host:port`); empty: the listen port + 1.
    pub ha_listen: String,
    /// The HA address this broker gives the controllers and the name servers, where its
    /// slaves connect when it is master (RocketMQ's `brokerIP2` with `haListenPort`): for a
    /// listener reached through a proxy or a NAT. Empty: the HA listen address.
    pub ha_advertise: String,
    /// A slave's master HA address (`host:port`); empty: learned from the name servers.
    pub ha_master: String,
    /// How often a slave copies its master's consumer offsets and delivery progress, ms.
    pub replica_metadata_interval_ms: u64,
    /// RocketMQ's slaveReadEnable: hint consumers far behind to pull from a slave.
    pub slave_read_enable: bool,
    /// How far behind the log's end a pull is "far behind" for `slave_read_enable`.
    pub slave_read_lag_bytes: u64,
    /// Controller addresses (`broker_role = "auto"`, docs/replication.md "Automatic
    /// failover"): the controller decides whether this broker is master or slave.
    pub controller: Vec<String>,
    /// How often a broker in controller mode heartbeats the controller, ms.
    pub controller_heartbeat_ms: u64,
    /// A master in controller mode keeps a slave in the SyncStateSet while its lag stays under
    /// this many bytes (per storage shard); a slave joins the set once it has everything.
    pub in_sync_max_lag_bytes: u64,
    /// Controller mode: the operator's preference when the controller elects a master among
    /// members of equal progress (same newest term, same log end): lower is preferred
    /// (RocketMQ's `brokerElectionPriority`).
    pub election_priority: u32,
    /// A master in controller mode acknowledges a send `SEND_OK` only while its SyncStateSet
    /// (itself included) has at least this many members; below, sends are stored and answered
    /// SLAVE_NOT_AVAILABLE (RocketMQ's minInSyncReplicas).
    pub min_in_sync_replicas: u32,
    /// A sync master that restarts after a slave acknowledged bytes of its last term refuses
    /// local appends (SERVICE_NOT_AVAILABLE) up to this long, until a slave of that term joins:
    /// a slave holding acknowledged bytes the master's log lost returns them first
    /// (docs/replication.md, "A master that lost its tail"). 0: appends go ahead at once.
    pub lost_tail_wait_ms: u64,
    /// Set by the broker itself in controller mode (not a setting): the epoch the controller
    /// gave this run, and this broker's own id (its `broker_id` setting; a master registers
    /// with the name servers as 0).
    #[serde(skip)]
    pub controller_epoch: u64,
    #[serde(skip)]
    pub controller_self_id: i64,
    /// TLS on the listeners and the outbound connections (`[tls]`, docs/tls.md).
    pub tls: tls::TlsSettings,
}

/// What a broker is in its master/slave group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerRole {
    AsyncMaster,
    SyncMaster,
    Slave,
}

impl std::str::FromStr for BrokerRole {
    type Err = String;

    fn from_str(text: &str) -> Result<BrokerRole, String> {
        match text {
            "async-master" | "ASYNC_MASTER" => Ok(BrokerRole::AsyncMaster),
            "sync-master" | "SYNC_MASTER" => Ok(BrokerRole::SyncMaster),
            "slave" | "SLAVE" => Ok(BrokerRole::Slave),
            other => Err(format!(
                "broker_role `{other}` is not async-master, sync-master, slave or auto"
            )),
        }
    }
}

impl BrokerRole {
    pub fn name(self) -> &'static str {
        match self {
            BrokerRole::AsyncMaster => "async-master",
            BrokerRole::SyncMaster => "sync-master",
            BrokerRole::Slave => "slave",
        }
    }
}

impl Default for BrokerConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let (storage_cores, network_cores) = if cores >= 2 {
            (vec![0], vec![1])
        } else {
            (vec![0], vec![0])
        };
        BrokerConfig {
            cluster_name: "DefaultCluster".into(),
            broker_name: "broker-a".into(),
            broker_id: 0,
            listen: "127.0.0.1:10911".into(),
            namesrv: Vec::new(),
            data_dir: PathBuf::from("data/broker"),
            flush: "async".into(),
            flush_interval_ms: 500,
            sync_flush_timeout_ms: 5_000,
            segment_bytes: 1 << 30,
            preallocate_ahead_bytes: 64 << 20,
            journal_bytes: 64 << 20,
            readahead_bytes: 32 << 20,
            consume_queue_entries_per_file: 300_000,
            file_reserved_hours: 72,
            retention_interval_ms: 10_000,
            disk_max_used_ratio: 0.75,
            disk_refuse_ratio: 0.95,
            storage_cores,
            network_cores,
            auto_create_topics: false,
            enable_property_filter: false,
            acl_file: None,
            access_key: None,
            secret_key: None,
            default_topic_queues: 8,
            max_frame_bytes: 16 << 20,
            max_message_bytes: 4 << 20,
            max_batch_messages: 1024,
            max_inflight_per_connection: 256,
            max_request_bytes_per_shard: 256 << 20,
            frame_read_timeout_ms: 60_000,
            max_connections: 10_000,
            handshake_timeout_ms: 10_000,
            spin_before_park_us: 100,
            max_parked_pulls: 10_000,
            max_suspend_timeout_ms: 30_000,
            max_pull_messages: 1024,
            max_pull_bytes: 8 << 20,
            storage_queue_depth: 4096,
            register_interval_ms: 30_000,
            client_timeout_ms: 120_000,
            offsets_persist_interval_ms: 5_000,
            delay_levels: delay_levels::DEFAULT_DELAY_LEVELS.into(),
            timer_max_delay_ms: 3 * 24 * 3600 * 1000,
            timer_max_pending: 1_000_000,
            schedule_persist_interval_ms: 1_000,
            transaction_timeout_ms: 6_000,
            transaction_check_interval_ms: 60_000,
            transaction_check_max: 15,
            queue_lock_expiry_ms: 60_000,
            log_format: "text".into(),
            metrics_listen: String::new(),
            broker_role: "async-master".to_owned(),
            ha_listen: String::new(),
            ha_advertise: String::new(),
            ha_master: String::new(),
            replica_metadata_interval_ms: 10_000,
            slave_read_enable: false,
            slave_read_lag_bytes: 64 << 20,
            controller: Vec::new(),
            controller_heartbeat_ms: 500,
            in_sync_max_lag_bytes: 4 << 20,
            election_priority: u32::MAX,
            min_in_sync_replicas: 1,
            lost_tail_wait_ms: 10_000,
            controller_epoch: 0,
            controller_self_id: 0,
            tls: tls::TlsSettings::default(),
        }
    }
}

impl BrokerConfig {
    /// Reads a TOML file; unknown keys are errors (a typo must not be silently ignored).
    pub fn from_file(path: &Path) -> Result<BrokerConfig, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn flush_mode(&self) -> FlushMode {
        self.flush.parse().unwrap_or(FlushMode::Async)
    }

    /// `broker_role = "auto"`: the controller decides the role at each start.
    pub fn is_auto(&self) -> bool {
        self.broker_role == "auto"
    }

    /// The broker's role (validated by [`validate`](Self::validate)).
    pub fn role(&self) -> BrokerRole {
        self.broker_role.parse().unwrap_or(BrokerRole::AsyncMaster)
    }

    /// A master's HA address: `ha_listen`, else the listen address with the port + 1 (`None`
    /// for a slave, or a listen port of 0 without `ha_listen`: then port 0 too).
    pub fn ha_listen_addr(&self) -> Result<Option<SocketAddr>, String> {
        if self.role() == BrokerRole::Slave {
            return Ok(None);
        }
        if !self.ha_listen.is_empty() {
            return self.ha_listen.parse().map(Some).map_err(|e| {
                format!(
                    "ha_listen address `{}` is not host:port: {e}",
                    self.ha_listen
                )
            });
        }
        let listen: SocketAddr = self
            .listen
            .parse()
            .map_err(|e| format!("listen address `{}` is not host:port: {e}", self.listen))?;
        let port = if listen.port() == 0 {
            0
        } else {
            listen.port().wrapping_add(1)
        };
        Ok(Some(SocketAddr::new(listen.ip(), port)))
    }

    /// The HA address slaves are told to connect to: `ha_advertise`, else `listening` (the
    /// address the HA listener got).
    pub fn ha_advertised_addr(&self, listening: SocketAddr) -> Result<SocketAddr, String> {
        if self.ha_advertise.is_empty() {
            return Ok(listening);
        }
        self.ha_advertise.parse().map_err(|e| {
            format!(
                "ha_advertise address `{}` is not host:port: {e}",
                self.ha_advertise
            )
        })
    }

    /// The metrics endpoint's address, if one is configured.
    pub fn metrics_listen_addr(&self) -> Result<Option<SocketAddr>, String> {
        if self.metrics_listen.is_empty() {
            return Ok(None);
        }
        self.metrics_listen.parse().map(Some).map_err(|e| {
            format!(
                "metrics_listen address `{}` is not host:port: {e}",
                self.metrics_listen
            )
        })
    }

    /// Validates the keys the schedule and timer services read.
    fn check_schedule(&self) -> Result<(), String> {
        delay_levels::parse_delay_levels(&self.delay_levels)?;
        if self.timer_max_delay_ms == 0 || self.timer_max_delay_ms > 365 * 86_400_000 {
            return Err(format!(
                "timer_max_delay_ms ({}) must be 1 ms ..= 365 days",
                self.timer_max_delay_ms
            ));
        }
        if self.timer_max_pending == 0 {
            return Err("timer_max_pending must be positive".into());
        }
        if self.schedule_persist_interval_ms == 0 {
            return Err("schedule_persist_interval_ms must be positive".into());
        }
        Ok(())
    }

    pub fn listen_addr(&self) -> Result<SocketAddr, String> {
        self.listen
            .parse()
            .map_err(|e| format!("listen address `{}` is not host:port: {e}", self.listen))
    }

    /// Checks every value and their combinations; the message names the key and the limit.
    pub fn validate(&self) -> Result<(), String> {
        self.flush.parse::<FlushMode>()?;
        if !self.journal_bytes.is_multiple_of(4096) {
            return Err(format!(
                "journal_bytes ({}) must be a multiple of 4096 (0 turns the journal off)",
                self.journal_bytes
            ));
        }
        self.listen_addr()?;
        self.metrics_listen_addr()?;
        self.tls.validate()?;
        if self.access_key.is_some() != self.secret_key.is_some() {
            return Err(
                "access_key and secret_key go together: give both (the broker's own account) or neither"
                    .into(),
            );
        }
        if self.is_auto() {
            if self.controller.is_empty() {
                return Err("broker_role auto needs controller addresses (--controller)".into());
            }
            if self.broker_id <= 0 {
                return Err(format!(
                    "broker_role auto needs this broker's own broker_id, above 0 (not {})",
                    self.broker_id
                ));
            }
            for addr in &self.controller {
                addr.parse::<SocketAddr>()
                    .map_err(|e| format!("controller address `{addr}` is not host:port: {e}"))?;
            }
        }
        let role: BrokerRole = if self.is_auto() {
            BrokerRole::AsyncMaster
        } else {
            self.broker_role.parse()?
        };
        if let Some(listening) = self.ha_listen_addr()? {
            self.ha_advertised_addr(listening)?;
        }
        match role {
            _ if self.is_auto() => {}
            BrokerRole::Slave => {
                if self.broker_id <= 0 {
                    return Err(format!(
                        "a slave needs a broker_id above 0 (0 is the master's), not {}",
                        self.broker_id
                    ));
                }
                if self.ha_master.is_empty() {
                    if self.namesrv.is_empty() {
                        return Err("a slave needs ha_master (its master's HA address host:port) or name servers to learn it from".into());
                    }
                } else {
                    self.ha_master.parse::<SocketAddr>().map_err(|e| {
                        format!(
                            "ha_master must be the master's HA address host:port (`{}`: {e})",
                            self.ha_master
                        )
                    })?;
                }
            }
            BrokerRole::AsyncMaster | BrokerRole::SyncMaster => {
                if self.broker_id != 0 {
                    return Err(format!(
                        "a master has broker_id 0, not {} (slaves use --broker-role slave)",
                        self.broker_id
                    ));
                }
            }
        }
        for addr in &self.namesrv {
            addr.parse::<SocketAddr>()
                .map_err(|e| format!("namesrv address `{addr}` is not host:port: {e}"))?;
        }
        if self.storage_cores.is_empty() || self.network_cores.is_empty() {
            return Err("storage_cores and network_cores must each name at least one core".into());
        }
        if self.storage_cores.len() > 64 || self.network_cores.len() > 64 {
            return Err("at most 64 storage and 64 network shards".into());
        }
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        if let Some(core) = self
            .storage_cores
            .iter()
            .chain(&self.network_cores)
            .find(|&&c| c >= cores)
        {
            return Err(format!(
                "core {core} does not exist (this machine has {cores})"
            ));
        }
        if !crate::naming::is_valid_name(&self.broker_name, 127)
            || !crate::naming::is_valid_name(&self.cluster_name, 127)
        {
            return Err("broker_name and cluster_name must match ^[%|a-zA-Z0-9_-]+$".into());
        }
        if self.max_message_bytes == 0 || self.max_message_bytes + (64 << 10) > self.max_frame_bytes
        {
            return Err(format!(
                "max_message_bytes ({}) must be positive and at least 64 KiB under max_frame_bytes ({})",
                self.max_message_bytes, self.max_frame_bytes
            ));
        }
        if (self.max_message_bytes as u64) + (64 << 10) > self.segment_bytes {
            return Err(format!(
                "segment_bytes ({}) must exceed max_message_bytes ({}) by at least 64 KiB",
                self.segment_bytes, self.max_message_bytes
            ));
        }
        if self.handshake_timeout_ms == 0 || self.frame_read_timeout_ms == 0 {
            return Err("handshake_timeout_ms and frame_read_timeout_ms must be positive".into());
        }
        if self.max_request_bytes_per_shard < self.max_frame_bytes {
            return Err(format!(
                "max_request_bytes_per_shard ({}) must be at least max_frame_bytes ({})",
                self.max_request_bytes_per_shard, self.max_frame_bytes
            ));
        }
        if self.transaction_check_interval_ms == 0 || self.queue_lock_expiry_ms == 0 {
            return Err(
                "transaction_check_interval_ms and queue_lock_expiry_ms must be positive".into(),
            );
        }
        self.check_schedule()?;
        if self.default_topic_queues == 0 || self.default_topic_queues > 1024 {
            return Err("default_topic_queues must be 1..=1024".into());
        }
        if self.log_format != "text" && self.log_format != "json" {
            return Err(format!(
                "log_format must be `text` or `json`, not `{}`",
                self.log_format
            ));
        }
        self.store_config(0).validate().map_err(|e| e.to_string())
    }

    /// The storage engine configuration of storage shard `shard`.
    pub fn store_config(&self, shard: usize) -> StoreConfig {
        let mut config = StoreConfig::new(self.data_dir.join(format!("shard-{shard}")));
        config.flush_mode = self.flush_mode();
        config.flush_interval_ms = self.flush_interval_ms;
        config.sync_flush_timeout_ms = self.sync_flush_timeout_ms;
        config.segment_bytes = self.segment_bytes;
        config.preallocate_ahead_bytes = self.preallocate_ahead_bytes;
        config.journal_bytes = self.journal_bytes;
        config.readahead_bytes = self.readahead_bytes;
        config.poll_durable_writes = self.spin_before_park_us > 0;
        config.consume_queue_entries_per_file = self.consume_queue_entries_per_file;
        config.file_reserved_hours = self.file_reserved_hours;
        config.retention_interval_ms = self.retention_interval_ms.max(1);
        config.disk_max_used_ratio = self.disk_max_used_ratio;
        config.disk_refuse_ratio = self.disk_refuse_ratio;
        config.max_record_bytes = shardmq_codec::max_record_bytes(self.max_message_bytes) as u64;
        // A store whose dispatch follows a confirmed offset (docs/replication.md) holds what
        // recovery finds past its checkpoint until it is confirmed again.
        config.hold_unconfirmed_tail = self.role() == BrokerRole::SyncMaster
            || (self.role() == BrokerRole::Slave && self.controller_self_id > 0);
        config
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_keys_are_read_and_unknown_keys_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broker.toml");
        std::fs::write(
            &path,
            "broker_name = \"broker-x\"\nflush = \"sync\"\nsegment_bytes = 67108864\nstorage_cores = [0]\nnetwork_cores = [0]\n",
        )
        .unwrap();
        let config = BrokerConfig::from_file(&path).unwrap();
        assert_eq!(config.broker_name, "broker-x");
        assert_eq!(config.flush_mode(), FlushMode::Sync);
        assert_eq!(config.segment_bytes, 64 << 20);
        assert_eq!(
            config.max_message_bytes,
            4 << 20,
            "unset keys keep their defaults"
        );
        config.validate().unwrap();

        std::fs::write(&path, "segmnet_bytes = 1\n").unwrap();
        let err = BrokerConfig::from_file(&path).unwrap_err();
        assert!(err.contains("segmnet_bytes"), "a typo is named: {err}");
    }

    #[test]
    fn validation_names_the_key_and_limit() {
        let mut config = BrokerConfig {
            storage_cores: vec![0],
            network_cores: vec![0],
            ..BrokerConfig::default()
        };
        config.flush = "sometimes".into();
        assert!(config.validate().unwrap_err().contains("sync"));
        config.flush = "async".into();
        config.segment_bytes = 1 << 20;
        assert!(config.validate().unwrap_err().contains("segment_bytes"));
        config.segment_bytes = 1 << 30;
        config.storage_cores = vec![4096];
        assert!(config.validate().unwrap_err().contains("core 4096"));
        config.storage_cores = vec![0];
        config.readahead_bytes = 4096;
        assert!(config.validate().unwrap_err().contains("readahead_bytes"));
        config.readahead_bytes = 0;
        config.validate().unwrap();
    }

    #[test]
    fn slaves_are_told_the_advertised_ha_address_when_one_is_set() {
        let mut config = BrokerConfig {
            storage_cores: vec![0],
            network_cores: vec![0],
            listen: "127.0.0.1:10911".into(),
            ..BrokerConfig::default()
        };
        let listening: SocketAddr = "127.0.0.1:10912".parse().unwrap();
        assert_eq!(config.ha_advertised_addr(listening).unwrap(), listening);
        config.ha_advertise = "10.0.0.7:20912".into();
        assert_eq!(
            config.ha_advertised_addr(listening).unwrap(),
            "10.0.0.7:20912".parse::<SocketAddr>().unwrap()
        );
        config.validate().unwrap();
        config.ha_advertise = "proxy-without-port".into();
        assert!(config.validate().unwrap_err().contains("ha_advertise"));
    }
}
