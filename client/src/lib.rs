//! `shardmq-client`: what applications link to talk to ShardMQ — a [`Producer`], a
//! [`PushConsumer`] (background pulling, rebalancing, offset commits), a [`PullConsumer`]
//! (queues and offsets in the application's hands) and an [`Admin`] API — on tokio.
//!
//! Every client is made with a builder that needs at least the name server address; defaults
//! follow RocketMQ's (send timeout 3 s with 2 retries, 4 MiB bodies, rebalance every 20 s,
//! heartbeats every 30 s, offsets committed every 5 s, routes refreshed every 30 s), so
//! RocketMQ users find no surprises. Errors are one [`Error`] enum whose messages say what went
//! wrong and what to do.
//!
//! ```no_run
//! use shardmq_client::{ConsumeFrom, ConsumeResult, Message, Producer, PushConsumer};
//!
//! # async fn example() -> shardmq_client::Result<()> {
//! let producer = Producer::builder().namesrv("127.0.0.1:9876").build().await?;
//! let sent = producer.send(Message::new("orders", "hello").with_tags("created")).await?;
//! println!("{} → {} offset {}", sent.msg_id, sent.queue, sent.queue_offset);
//!
//! let consumer = PushConsumer::builder()
//!     .namesrv("127.0.0.1:9876")
//!     .group("order-service")
//!     .subscribe("orders", "*")
//!     .consume_from(ConsumeFrom::FirstOffset)
//!     .listen_concurrently(|messages| async move {
//!         println!("got {} message(s)", messages.len());
//!         ConsumeResult::Success
//!     })
//!     .start()
//!     .await?;
//! # consumer.shutdown().await;
//! # producer.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! **Producing fast.** A [`Producer`] encodes each batch itself as the broker's stored records
//! and sends it as one run (wire protocol 2; nothing allocated per message), and the broker's
//! answer has one size for any batch: [`SendResult`] and [`BatchSendResult`] keep the ids as
//! values ([`MessageId`], 16 bytes) and format them only when asked. Several sends may be in
//! flight at once: [`Producer::send_async`] and its siblings return as soon as a send is
//! admitted into the producer's window (bounded in sends and in body bytes,
//! [`ProducerBuilder::max_sends_in_flight`], [`ProducerBuilder::max_bytes_in_flight`]) with a
//! [`SendFuture`] of its result; ordered sends keep their order per queue while in flight.
//!
//! ```no_run
//! use shardmq_client::{Message, Producer};
//!
//! # async fn example() -> shardmq_client::Result<()> {
//! let producer = Producer::builder()
//!     .namesrv("127.0.0.1:9876")
//!     .max_sends_in_flight(4)
//!     .build()
//!     .await?;
//! let mut in_flight = Vec::new();
//! for batch in 0..16 {
//!     let messages = (0..1000).map(|i| Message::new("orders", format!("{batch}/{i}"))).collect();
//!     // Waits only while 4 batches are in flight.
//!     in_flight.push(producer.send_batch_async(messages).await?);
//! }
//! for sent in in_flight {
//!     let sent = sent.await?;
//!     println!("{} messages → {} from offset {}", sent.len(), sent.queue, sent.queue_offset(0));
//! }
//! # Ok(())
//! # }
//! ```
//!
//! **Processing once.** [`Idempotent`] wraps a push consumer's listener (concurrent or orderly)
//! so that a message is processed once per group across retries, resends and the group's
//! consumers: each message is claimed in a [`RedisStore`] (or, for one consumer, a
//! [`MemoryStore`]) before the listener sees it; see `docs/idempotent-consumption.md` and
//! `examples/idempotent_consumer.rs`.
//!
//! Inside: one connection per server address with pipelined requests (`connection.rs`,
//! `pool.rs`), typed requests (`api/`; a producer encodes its batches itself as runs of
//! stored records, `api/records.rs`), name servers and the route cache (`namesrv.rs`), the
//! stored-record decoder with CRC checks (`record.rs`), and the clients themselves. The wire
//! protocol is `docs/protocol.md`; the record layout `docs/storage-format.md`.
//!
//! The modules are layered: each imports (`crate::…`) only modules to its left, so
//! `error < host < message_id < route < subscription < message < compression < record <
//! connection < pool < api < namesrv < instance < partial < send_back < admin < broker_admin <
//! transaction < producer < pull_consumer < push < idempotent` (`tests/module_layers.rs` fails
//! on an import cycle). The
//! requests of `api/` are `ConnectionPool` methods, called without an import from the layers
//! above it.

mod account;
mod admin;
mod api;
mod broker_admin;
mod compression;
mod connection;
mod error;
mod host;
mod idempotent;
mod instance;
mod message;
mod message_id;
mod namesrv;
mod partial;
mod pool;
mod producer;
mod pull_consumer;
mod push;
mod record;
mod route;
mod send_back;
mod subscription;
mod tls;
mod transaction;

pub use account::set_default_credentials;
pub use admin::{Admin, AdminBuilder, QueueProgress};
pub use api::{
    BatchSendResult, BatchSendResults, PullResult, PullStatus, QueueStats, SendResult, SendStatus,
    TopicConfig, DEFAULT_TOPIC_QUEUES, MAX_TOPIC_QUEUES,
};
pub use broker_admin::{
    BrokerStatus, ConsumerMember, ControllerGroup, ControllerStatus, GroupSummary, MemberChange,
    OffsetReset, ReplicationShardStatus, ResetTarget,
};
pub use compression::{DEFAULT_COMPRESS_OVER_BYTES, MAX_INFLATED_BODY_BYTES};
pub use connection::{ServerInfo, MAX_RESPONSE_FRAME_BYTES};
pub use error::{Error, Result};
pub use idempotent::{
    ClaimOutcome, ClaimStore, DedupKey, Idempotent, IdempotentBuilder, IdempotentStats,
    MemoryStore, StoreError, StoreErrorPolicy, StoreFuture, DEFAULT_DONE_TTL,
    DEFAULT_MEMORY_STORE_MAX_KEYS, DEFAULT_PROCESSING_TTL, MAX_DEDUP_KEY_BYTES, MIN_PROCESSING_TTL,
};
#[cfg(feature = "redis")]
pub use idempotent::{RedisStore, DEFAULT_REDIS_OPERATION_TIMEOUT};
pub use instance::{ClientOptions, DEFAULT_CONNECT_TIMEOUT, DEFAULT_REQUEST_TIMEOUT};
pub use message::{
    check_group_name, check_topic_name, now_ms, Delay, Message, MessageExt,
    DEFAULT_MAX_MESSAGE_BYTES, MAX_GROUP_NAME_BYTES, MAX_TOPIC_NAME_BYTES,
    PROPERTY_ORIGIN_MESSAGE_ID, PROPERTY_RECONSUME_TIME, PROPERTY_RETRY_TOPIC,
    RESERVED_PROPERTY_NAMES,
};
pub use message_id::{MessageId, MESSAGE_ID_HEX_LEN};
pub use namesrv::ROUTE_REFRESH_INTERVAL;
pub use partial::{BrokerFailure, Partial};
pub use producer::{
    java_string_hash, queue_index_for_key, Producer, ProducerBuilder, SendFuture,
    DEFAULT_MAX_BYTES_IN_FLIGHT, DEFAULT_MAX_SENDS_IN_FLIGHT, DEFAULT_PRODUCER_GROUP,
    DEFAULT_SEND_RETRIES, DEFAULT_SEND_TIMEOUT, MAX_BATCH_MESSAGES,
};
pub use pull_consumer::{
    PullConsumer, PullConsumerBuilder, PullOptions, DEFAULT_PULL_BATCH, MAX_PULL_WAIT,
};
pub use push::{
    allocate_averagely, ConsumeFrom, ConsumeResult, FlowLimits, ListenerFuture, MessageModel,
    PushConsumer, PushConsumerBuilder, DEFAULT_CONSUME_THREADS, DEFAULT_CONSUME_TIMEOUT,
    DEFAULT_MAX_RECONSUME_TIMES, DEFAULT_ORDERLY_LOCK_INTERVAL, DEFAULT_ORDERLY_LOCK_TTL,
    DEFAULT_ORDERLY_SUSPEND, DEFAULT_PUSH_PULL_BATCH, DEFAULT_PUSH_PULL_MAX_BYTES,
    HEARTBEAT_INTERVAL, PERSIST_OFFSETS_INTERVAL, PULL_WAIT, REBALANCE_INTERVAL,
};
pub use record::{decode_records, RecordError, MESSAGE_MAGIC_CODE};
pub use route::{BrokerData, ClusterInfo, MessageQueue, QueueData, TopicRoute};
/// An account's keys, for brokers and name servers that enforce access control (docs/acl.md).
pub use shardmq_acl::{Credentials, CredentialsError, ACCESS_KEY_ENV, SECRET_KEY_ENV};
pub use subscription::TagExpression;
pub use tls::{set_default_tls, tls_from_env, TlsFiles};
pub use transaction::{TransactionFuture, TransactionSendResult, TransactionState};

/// The wire types, for callers that match on [`Error::status`].
pub use shardmq_schema::system_topics;
pub use shardmq_schema::wire;
