//! What only storage shard 0 owns (`ShardZero`): the topic table (persisted and broadcast to
//! every network shard after each change), client and group membership (heartbeats, expiry,
//! the push that makes a group rebalance), ordered-queue locks and unresolved transactions,
//! with the loops that expire clients and check transactions back. Its request arms are no-ops
//! elsewhere: the network shards send these requests to shard 0.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use tracing::{error, info};

use crate::config::BrokerConfig;
use crate::groups::{ClientRegistry, ConnectionKey, ConsumerMembership};
use crate::mesh::{NetworkEvent, Reply};
use crate::store::atomic_file::write_atomically_async;
use crate::store::MessageStore;
use crate::topics::{TopicConfig, TopicTable, UpsertError, TOPICS_FILE};

use super::shard::{now_ms, StorageShard};

/// State only storage shard 0 has.
pub(super) struct ShardZero {
    pub(super) data_dir: PathBuf,
    pub(super) topics: RefCell<TopicTable>,
    pub(super) clients: RefCell<ClientRegistry>,
    /// Queue locks of orderly consumer groups (in memory only).
    pub(super) locks: RefCell<crate::queue_locks::QueueLocks>,
    /// Unresolved transaction half messages (their queues live on this shard).
    pub(super) transactions: crate::transaction::Transactions,
}

impl ShardZero {
    /// Loads the topic table (with the transaction topics) and recovers the unresolved
    /// transactions from `store` (storage shard 0's).
    pub(super) async fn open(
        config: &BrokerConfig,
        store: &MessageStore,
    ) -> Result<ShardZero, String> {
        let mut topics = TopicTable::load(&config.data_dir)?;
        let storage_shards = config.storage_cores.len();
        crate::transaction::ensure_topics(&mut topics, storage_shards);
        let transactions = crate::transaction::Transactions::new(
            storage_shards,
            crate::transaction::CheckSettings::from_config(config),
        );
        let summary = transactions
            .recover(store)
            .await
            .map_err(|e| format!("storage shard 0: cannot read the transaction queues: {e}"))?;
        info!(
            half_messages = summary.half_messages,
            op_records = summary.op_records,
            unresolved = summary.unresolved,
            "transactions recovered"
        );
        Ok(ShardZero {
            data_dir: config.data_dir.clone(),
            topics: RefCell::new(topics),
            clients: RefCell::new(ClientRegistry::default()),
            locks: RefCell::new(crate::queue_locks::QueueLocks::new(
                config.queue_lock_expiry_ms,
            )),
            transactions,
        })
    }
}

impl StorageShard {
    pub(super) async fn upsert_topic(
        &self,
        config: TopicConfig,
        is_create_only: bool,
        reply: Reply<Result<(), UpsertError>>,
    ) {
        let result = match &self.shard_zero {
            Some(zero) => {
                let result = zero.topics.borrow_mut().upsert(config, is_create_only);
                if result.is_ok() {
                    self.persist_topics().await;
                    self.broadcast_topics();
                }
                result
            }
            None => Err(crate::topics::UpsertError::Invalid(
                "topic requests go to storage shard 0".into(),
            )),
        };
        let _ = reply.send(result);
    }

    pub(super) async fn delete_topic(&self, topic: String, reply: Reply<bool>) {
        let removed = self
            .shard_zero
            .as_ref()
            .is_some_and(|zero| zero.topics.borrow_mut().delete(&topic));
        if removed {
            self.persist_topics().await;
            self.broadcast_topics();
        }
        let _ = reply.send(removed);
    }

    pub(super) async fn heartbeat(
        &self,
        client_id: String,
        connection: ConnectionKey,
        producer_groups: Vec<String>,
        consumer_groups: BTreeMap<String, ConsumerMembership>,
        reply: Reply<()>,
    ) {
        if let Some(zero) = &self.shard_zero {
            let needs_topics = self.ensure_retry_topics(zero, consumer_groups.keys());
            let changed = zero.clients.borrow_mut().heartbeat(
                &client_id,
                connection,
                now_ms(),
                producer_groups,
                consumer_groups,
            );
            if needs_topics {
                self.persist_topics().await;
                self.broadcast_topics();
            }
            self.announce_changes(changed);
        }
        let _ = reply.send(());
    }

    pub(super) fn unregister_client(
        &self,
        client_id: String,
        producer_group: Option<String>,
        consumer_group: Option<String>,
        reply: Reply<()>,
    ) {
        if let Some(zero) = &self.shard_zero {
            let changed = zero.clients.borrow_mut().unregister(
                &client_id,
                producer_group.as_deref(),
                consumer_group.as_deref(),
            );
            self.announce_changes(changed);
        }
        let _ = reply.send(());
    }

    pub(super) fn clients_alive(&self, clients: Vec<(String, ConnectionKey)>) {
        if let Some(zero) = &self.shard_zero {
            let now = now_ms();
            let mut table = zero.clients.borrow_mut();
            for (client_id, connection) in clients {
                table.touch(&client_id, connection, now);
            }
        }
    }

    pub(super) fn client_gone(&self, client_id: String, connection: ConnectionKey) {
        if let Some(zero) = &self.shard_zero {
            let changed = zero
                .clients
                .borrow_mut()
                .connection_closed(&client_id, connection);
            self.announce_changes(changed);
        }
    }

    pub(super) async fn ensure_system_topic(&self, name: String, queues: u32, reply: Reply<()>) {
        if let Some(zero) = &self.shard_zero {
            if zero.topics.borrow_mut().ensure_system_topic(&name, queues) {
                self.persist_topics().await;
                self.broadcast_topics();
            }
        }
        let _ = reply.send(());
    }

    pub(super) fn consumer_list(&self, group: String, reply: Reply<Vec<String>>) {
        let members = self
            .shard_zero
            .as_ref()
            .map(|c| c.clients.borrow().consumers_of(&group))
            .unwrap_or_default();
        let _ = reply.send(members);
    }

    pub(super) fn consumer_group_members(
        &self,
        group: String,
        reply: Reply<Vec<(String, ConsumerMembership)>>,
    ) {
        let members = self
            .shard_zero
            .as_ref()
            .map(|c| c.clients.borrow().members_of(&group))
            .unwrap_or_default();
        let _ = reply.send(members);
    }

    pub(super) async fn transaction(&self, request: crate::transaction::TransactionRequest) {
        let Some(zero) = &self.shard_zero else {
            return;
        };
        match request {
            // A half message is a send like any other: a sync master answers it once its
            // replicas hold it (FLUSH_SLAVE_TIMEOUT / SLAVE_NOT_AVAILABLE otherwise), so a
            // half message answered SEND_OK survives the master's death.
            crate::transaction::TransactionRequest::AppendHalf {
                batch,
                producer_group,
                reply,
            } => {
                let mut result = zero
                    .transactions
                    .append_half(&self.store, batch, producer_group)
                    .await;
                if let Ok(outcome) = &mut result {
                    self.refresh_confirmed();
                    self.wait_replicated_outcome(outcome).await;
                }
                let _ = reply.send(result);
            }
            request => zero.transactions.serve(&self.store, request).await,
        }
    }

    pub(super) fn queue_lock(&self, request: crate::queue_locks::LockRequest) {
        if let Some(zero) = &self.shard_zero {
            zero.locks.borrow_mut().serve(request, now_ms());
        }
    }

    pub(super) fn broadcast_topics(&self) {
        if let Some(zero) = &self.shard_zero {
            let snapshot = Arc::new(zero.topics.borrow().clone());
            self.broadcast(|| NetworkEvent::Topics(snapshot.clone()));
        }
    }

    /// Every consumer group gets its retry topic (`%RETRY%<group>`, one queue), as in RocketMQ.
    fn ensure_retry_topics<'a>(
        &self,
        zero: &ShardZero,
        groups: impl Iterator<Item = &'a String>,
    ) -> bool {
        let mut topics = zero.topics.borrow_mut();
        let mut changed = false;
        for group in groups {
            changed |= topics
                .ensure_system_topic(&format!("{}{group}", crate::naming::RETRY_TOPIC_PREFIX), 1);
        }
        changed
    }

    fn announce_changes(&self, groups: Vec<String>) {
        for group in groups {
            self.broadcast(|| NetworkEvent::ConsumerIdsChanged {
                group: group.clone(),
            });
        }
    }

    async fn persist_topics(&self) {
        let Some(zero) = &self.shard_zero else { return };
        let bytes = zero.topics.borrow().to_json();
        if let Err(e) = write_atomically_async(zero.data_dir.join(TOPICS_FILE), bytes).await {
            error!(error = %e, "cannot persist the topic table");
        }
    }
}

pub(super) async fn expire_clients_loop(shard: Rc<StorageShard>) {
    let timeout = shard.config.client_timeout_ms as i64;
    let interval = Duration::from_millis((shard.config.client_timeout_ms / 4).clamp(50, 10_000));
    loop {
        glommio::timer::sleep(interval).await;
        let Some(zero) = &shard.shard_zero else {
            return;
        };
        let changed = zero.clients.borrow_mut().expire(now_ms(), timeout);
        shard.announce_changes(changed);
    }
}

/// Checks back unresolved transactions every `transaction_check_interval_ms` (shard 0).
pub(super) async fn transaction_check_loop(shard: Rc<StorageShard>) {
    let interval = Duration::from_millis(shard.config.transaction_check_interval_ms.max(10));
    loop {
        glommio::timer::sleep(interval).await;
        let Some(zero) = &shard.shard_zero else {
            return;
        };
        if *shard.stopping.borrow() {
            return;
        }
        zero.transactions
            .check_round(&shard.store, &zero.clients, |check| {
                shard
                    .events
                    .get(check.connection.network_shard)
                    .is_some_and(|sender| {
                        sender
                            .try_send(NetworkEvent::TransactionCheck(check))
                            .is_ok()
                    })
            })
            .await;
    }
}
