//! RocketMQ's "remoting" wire protocol, as a codec and nothing more.
//!
//! ShardMQ's name server and broker answer RocketMQ clients (Java 4.9/5.x and
//! `rocketmq-client-rust` 1.0.0) on the same ports as ShardMQ's native clients. This crate owns
//! the bytes of that protocol: the frame, the command header in its two serialize types (JSON and
//! ROCKETMQ binary), the request and response codes, the JSON bodies the name server and broker
//! read and write (route, heartbeat, queue locks) and the message encodings a SEND carries
//! (properties, batch bodies, offset message ids).
//!
//! It never touches sockets, files, the store or any ShardMQ type: bytes come in as
//! `bytes::BytesMut`/`Bytes`/`&[u8]` and leave as typed values (and the other way round).
//! Wiring it into the listeners, and deciding what each request means, belongs to the name
//! server and the broker.
//!
//! Every size read from the wire is checked against a named limit or against the bytes that
//! remain before it is used; every error names the thing and the limit. The formats are
//! described in the remoting section of `docs/protocol.md`; the facts behind them are collected
//! in the project's RocketMQ remoting reference note.
//!
//! Modules:
//! - [`frame`]: the length-prefixed frame, the incremental decoder and the protocol sniffer.
//! - [`command`]: `RemotingCommand`, its header formats and typed access to ext fields.
//! - [`codes`]: request and response codes, permission and sys-flag bits.
//! - [`route`], [`heartbeat`], [`lock`]: the JSON bodies of GET_ROUTEINFO_BY_TOPIC,
//!   HEART_BEAT and LOCK/UNLOCK_BATCH_MQ.
//! - [`admin`]: the JSON bodies of the admin calls (runtime info, topic and consume stats,
//!   consumer connections, groups of a topic), with fastjson's object-keyed offset tables.
//! - [`message`]: message properties, offset message ids and SEND_BATCH_MESSAGE bodies.

pub mod admin;
pub mod codes;
pub mod command;
pub mod frame;
pub mod heartbeat;
mod json_body;
pub mod lock;
pub mod message;
pub mod route;

pub use command::{
    EncodeError, ExtFieldError, HeaderError, HeaderLimits, LanguageCode, RemotingCommand,
    SerializeType, DEFAULT_MAX_EXT_FIELDS, DEFAULT_MAX_EXT_KEY_BYTES, DEFAULT_MAX_HEADER_BYTES,
    FLAG_ONEWAY, FLAG_RESPONSE, SERVER_VERSION,
};
pub use frame::{
    encode_frame, encode_frame_head, encode_frame_head_with_body_bytes, sniff, FrameDecoder,
    FrameError, FrameLimits, Sniffed, DEFAULT_MAX_FRAME_BYTES, SNIFF_BYTES,
};
pub use heartbeat::{
    decode_heartbeat_body, encode_heartbeat_body, ConsumerData, HeartbeatData, ProducerData,
    SubscriptionData,
};
pub use json_body::{BodyError, MAX_JSON_BODY_BYTES};
pub use lock::{
    decode_lock_batch_request, decode_lock_batch_response, encode_lock_batch_request,
    encode_lock_batch_response, LockBatchRequestBody, LockBatchResponseBody, MessageQueue,
};
pub use message::{
    encode_batch_record, encode_properties, parse_properties, BatchError, BatchMessage,
    BatchMessages, OffsetMessageId, OffsetMessageIdError, Properties, PropertiesError,
    MAX_PROPERTIES_BYTES,
};
pub use route::{decode_route_body, encode_route_body, BrokerData, QueueData, TopicRouteData};
