//! Messages: what a producer sends ([`Message`]) and what a consumer receives
//! ([`MessageExt`]), and the checks a message passes before it leaves the client
//! ([`check_topic_name`], [`Message::validate`]). Its unique id is a [`MessageId`]
//! (`message_id.rs`).
//!
//! Owns the naming and size rules as RocketMQ states them (docs/protocol.md, "Requests and
//! responses"), which the broker checks again, and the stored properties' text form (the
//! separators [`MessageExt::properties`] splits on, which `record` checks and writes in its
//! tests). Never: encoding to the wire (see `api`) or decoding stored records (see `record`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::message_id::MessageId;

/// Longest topic name, in bytes (RocketMQ's limit).
pub const MAX_TOPIC_NAME_BYTES: usize = 127;

/// Longest group name, in bytes (RocketMQ's limit).
pub const MAX_GROUP_NAME_BYTES: usize = 255;

/// Largest message body the client sends, unless configured lower or the broker announces a
/// lower limit: 4 MiB (RocketMQ's `maxMessageSize`).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// Property names the broker writes itself (or RocketMQ reserves); user properties may not use
/// them.
pub const RESERVED_PROPERTY_NAMES: &[&str] = &[
    "TAGS",
    "KEYS",
    "UNIQ_KEY",
    "__CRC32#",
    "DELAY",
    "WAIT",
    "REAL_TOPIC",
    "REAL_QID",
    "RETRY_TOPIC",
    "ORIGIN_MESSAGE_ID",
    "RECONSUME_TIME",
    "MAX_RECONSUME_TIMES",
    "TIMER_DELIVER_MS",
    "TRAN_MSG",
    "PGROUP",
    "MIN_OFFSET",
    "MAX_OFFSET",
];

/// Property names the client reads, from the shared record codec (one place for the format's
/// constants): the tag, the keys (space separated), a retry or dead-letter copy's first topic,
/// first id and send-back count.
pub use shardmq_codec::{
    PROPERTY_KEYS, PROPERTY_ORIGIN_MESSAGE_ID, PROPERTY_RECONSUME_TIME, PROPERTY_RETRY_TOPIC,
    PROPERTY_TAGS,
};
/// Property holding the client-generated unique id.
pub const PROPERTY_UNIQUE_ID: &str = shardmq_codec::PROPERTY_UNIQUE_KEY;

/// Separates a property's name from its value.
pub(crate) const NAME_VALUE_SEPARATOR: char = shardmq_codec::NAME_VALUE_SEPARATOR as char;
/// Ends each property.
pub(crate) const PROPERTY_SEPARATOR: char = shardmq_codec::PROPERTY_SEPARATOR as char;

fn is_name_char(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'%' | b'|' | b'_' | b'-')
}

fn check_name(kind: &str, name: &str, max_bytes: usize) -> Result<()> {
    if name.is_empty() {
        return Err(Error::InvalidArgument(format!("{kind} name is empty")));
    }
    if name.len() > max_bytes {
        return Err(Error::InvalidArgument(format!(
            "{kind} name `{name}` is {} bytes, over the limit of {max_bytes}",
            name.len()
        )));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !c.is_ascii() || !is_name_char(*c as u8))
    {
        return Err(Error::InvalidArgument(format!(
            "{kind} name `{name}` contains `{bad}`; names match ^[%|a-zA-Z0-9_-]+$"
        )));
    }
    Ok(())
}

/// Checks a topic name: `^[%|a-zA-Z0-9_-]+$`, at most [`MAX_TOPIC_NAME_BYTES`].
pub fn check_topic_name(topic: &str) -> Result<()> {
    check_name("topic", topic, MAX_TOPIC_NAME_BYTES)
}

/// Checks a producer or consumer group name: `^[%|a-zA-Z0-9_-]+$`, at most
/// [`MAX_GROUP_NAME_BYTES`].
pub fn check_group_name(group: &str) -> Result<()> {
    check_name("group", group, MAX_GROUP_NAME_BYTES)
}

/// A consumer group's name: a valid group name that is not a retry or dead-letter topic's
/// (`%RETRY%g` and `%DLQ%g` are the broker's topics for group `g`, not groups).
pub(crate) fn check_consumer_group_name(group: &str) -> Result<()> {
    check_group_name(group)?;
    for prefix in ["%RETRY%", "%DLQ%"] {
        if group.starts_with(prefix) {
            return Err(Error::InvalidArgument(format!(
                "consumer group `{group}` starts with {prefix}, which names the broker's retry and dead-letter topics, not a group"
            )));
        }
    }
    Ok(())
}

fn check_property_text(what: &str, text: &str) -> Result<()> {
    if text.contains(['\u{1}', '\u{2}']) {
        return Err(Error::InvalidArgument(format!(
            "{what} `{}` contains the separator U+0001 or U+0002 that stored properties use",
            text.escape_debug()
        )));
    }
    Ok(())
}

/// A message to send: topic, body, an optional tag, keys for query, user properties and a
/// unique id generated when the message is made (RocketMQ's `UNIQ_KEY`, the id users see; a
/// retried send keeps it).
///
/// ```
/// # use shardmq_client::Message;
/// let message = Message::new("orders", "order 42 created")
///     .with_tags("created")
///     .with_keys(["order-42"])
///     .with_property("region", "eu");
/// assert_eq!(message.unique_id().to_string().len(), 32);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    topic: String,
    body: Bytes,
    tags: Option<String>,
    keys: Vec<String>,
    properties: Vec<(String, String)>,
    flag: i32,
    unique_id: MessageId,
    delay: Delay,
    /// The body is zlib-compressed (done by the producer above its threshold; the stored
    /// record's sys flag says so and consumers inflate it).
    is_body_compressed: bool,
}

/// When a sent message becomes visible to consumers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Delay {
    /// At once.
    #[default]
    None,
    /// After the broker's delay level `n` (1-based; RocketMQ's levels `1s 5s 10s 30s 1m … 2h`
    /// unless the broker is configured otherwise).
    Level(u32),
    /// At this time, ms since the Unix epoch (a timer message; up to the broker's horizon, 3
    /// days by default).
    At(i64),
    /// This long after the broker stores it (a timer message, timed on the broker's clock).
    After(std::time::Duration),
}

impl Message {
    /// A message for `topic` with `body` and a fresh unique id. Its born timestamp is set when
    /// it is sent (as RocketMQ does).
    #[must_use]
    pub fn new(topic: impl Into<String>, body: impl Into<Bytes>) -> Self {
        Self {
            topic: topic.into(),
            body: body.into(),
            tags: None,
            keys: Vec::new(),
            properties: Vec::new(),
            flag: 0,
            unique_id: MessageId::generate(),
            delay: Delay::None,
            is_body_compressed: false,
        }
    }

    /// Whether the body is zlib-compressed for sending.
    pub(crate) fn is_body_compressed(&self) -> bool {
        self.is_body_compressed
    }

    /// This message with `body` (the zlib form of its body) in place of its body.
    pub(crate) fn with_compressed_body(mut self, body: Bytes) -> Self {
        self.body = body;
        self.is_body_compressed = true;
        self
    }

    /// Delivers the message after delay level `level` (1-based): stored at the broker at once,
    /// visible to consumers only once the level's delay has passed.
    #[must_use]
    pub fn with_delay_level(mut self, level: u32) -> Self {
        self.delay = Delay::Level(level);
        self
    }

    /// Delivers the message at `deliver_at_ms` (ms since the Unix epoch); a time already past
    /// delivers at once.
    #[must_use]
    pub fn with_deliver_at_ms(mut self, deliver_at_ms: i64) -> Self {
        self.delay = Delay::At(deliver_at_ms);
        self
    }

    /// Delivers the message `delay` after the broker stores it (millisecond precision).
    #[must_use]
    pub fn with_delay(mut self, delay: std::time::Duration) -> Self {
        self.delay = Delay::After(delay);
        self
    }

    /// When the message becomes visible.
    #[must_use]
    pub fn delay(&self) -> Delay {
        self.delay
    }

    /// Sets the message's tag (one tag per message; consumers filter on it).
    #[must_use]
    pub fn with_tags(mut self, tags: impl Into<String>) -> Self {
        let tags = tags.into();
        self.tags = (!tags.is_empty()).then_some(tags);
        self
    }

    /// Sets the message's keys (indexed by the broker for query by key). Each key must be
    /// non-empty and without spaces; a string with spaces can be split with
    /// [`with_keys_text`](Self::with_keys_text).
    #[must_use]
    pub fn with_keys<I, K>(mut self, keys: I) -> Self
    where
        I: IntoIterator<Item = K>,
        K: Into<String>,
    {
        self.keys = keys.into_iter().map(Into::into).collect();
        self
    }

    /// Sets the keys from a space-separated list (RocketMQ's `KEYS` form).
    #[must_use]
    pub fn with_keys_text(self, keys: &str) -> Self {
        self.with_keys(keys.split(' ').filter(|key| !key.is_empty()))
    }

    /// Adds a user property (replacing an earlier one of the same name).
    #[must_use]
    pub fn with_property(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        let name = name.into();
        let value = value.into();
        match self.properties.iter_mut().find(|(key, _)| *key == name) {
            Some(entry) => entry.1 = value,
            None => self.properties.push((name, value)),
        }
        self
    }

    /// Sets the application flag, stored as is.
    #[must_use]
    pub fn with_flag(mut self, flag: i32) -> Self {
        self.flag = flag;
        self
    }

    /// Replaces the generated unique id (to resend a message under its original id; text is
    /// taken as it is, see [`MessageId`]).
    #[must_use]
    pub fn with_unique_id(mut self, unique_id: impl Into<MessageId>) -> Self {
        self.unique_id = unique_id.into();
        self
    }

    #[must_use]
    pub fn topic(&self) -> &str {
        &self.topic
    }

    #[must_use]
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    #[must_use]
    pub fn tags(&self) -> Option<&str> {
        self.tags.as_deref()
    }

    #[must_use]
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// User properties, in the order they were added.
    #[must_use]
    pub fn properties(&self) -> &[(String, String)] {
        &self.properties
    }

    #[must_use]
    pub fn flag(&self) -> i32 {
        self.flag
    }

    /// The unique id (made with the message, 32 hex characters when shown; see [`MessageId`]).
    #[must_use]
    pub fn unique_id(&self) -> &MessageId {
        &self.unique_id
    }

    /// Whether the message is sent with a delay level, delivery time or delay.
    pub(crate) fn is_delayed(&self) -> bool {
        self.delay != Delay::None
    }

    /// Checks everything the broker would refuse, so the error comes early and names the
    /// field: topic name, body size (`1..=max_body_bytes`), tag, keys and properties.
    pub fn validate(&self, max_body_bytes: usize) -> Result<()> {
        check_topic_name(&self.topic)?;
        self.validate_content(max_body_bytes)
    }

    /// [`validate`](Self::validate) but for the topic name (a batch checks its topic once).
    pub(crate) fn validate_content(&self, max_body_bytes: usize) -> Result<()> {
        if self.body.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "message to topic {}: the body is empty",
                self.topic
            )));
        }
        if self.body.len() > max_body_bytes {
            return Err(Error::InvalidArgument(format!(
                "message body is {} bytes, over max_message_bytes ({max_body_bytes})",
                self.body.len()
            )));
        }
        if let Some(tags) = &self.tags {
            check_property_text("tag", tags)?;
            if tags.contains("||") {
                return Err(Error::InvalidArgument(format!(
                    "tag `{tags}` contains `||`, which tag expressions use to separate tags"
                )));
            }
        }
        for key in &self.keys {
            if key.is_empty() || key.contains(' ') {
                return Err(Error::InvalidArgument(format!(
                    "key `{key}` is empty or contains a space; give each key separately"
                )));
            }
            check_property_text("key", key)?;
        }
        for (name, value) in &self.properties {
            if name.is_empty() || RESERVED_PROPERTY_NAMES.contains(&name.as_str()) {
                return Err(Error::InvalidArgument(format!(
                    "property name `{name}` is empty or reserved (reserved: {RESERVED_PROPERTY_NAMES:?})"
                )));
            }
            check_property_text("property name", name)?;
            check_property_text("property value", value)?;
        }
        if let Some(text) = self.unique_id.as_text() {
            check_property_text("unique id", text)?;
        }
        match self.delay {
            Delay::Level(0) => Err(Error::InvalidArgument(
                "delay level 0 is not a level; levels start at 1".to_owned(),
            )),
            Delay::At(ms) if ms <= 0 => Err(Error::InvalidArgument(format!(
                "delivery time {ms} is not a time after the Unix epoch"
            ))),
            Delay::After(delay) if delay.is_zero() || delay.as_millis() > i64::MAX as u128 => Err(
                Error::InvalidArgument(format!("delay {delay:?} must be at least 1 ms")),
            ),
            _ => Ok(()),
        }
    }
}

/// A message as a consumer receives it: the stored record decoded, with where it was stored.
///
/// Decoding allocates nothing per message: the body, the topic and the properties are slices
/// of the pull answer's bytes, read when asked, and the broker name is shared by every message
/// of a pull. Cloning one is a few reference counts.
#[derive(Clone, PartialEq, Eq)]
pub struct MessageExt {
    /// The topic, UTF-8 (checked when decoded; read it with [`topic`](Self::topic)).
    pub(crate) topic: Bytes,
    /// The broker name it was pulled from (empty when not known, as in a query result).
    pub(crate) broker_name: Arc<str>,
    pub queue_id: u32,
    /// Index of the message in its queue.
    pub queue_offset: i64,
    /// Physical offset of the record in its CommitLog (per storage shard).
    pub commit_log_offset: i64,
    /// The application flag.
    pub flag: i32,
    /// Stored sys flag (bit 0x1: body compressed, as the producer said).
    pub sys_flag: u32,
    pub born_timestamp_ms: i64,
    pub born_host: SocketAddr,
    pub store_timestamp_ms: i64,
    pub store_host: SocketAddr,
    /// How often this message has been redelivered: stored by the broker, plus local
    /// redeliveries after `ReconsumeLater`.
    pub reconsume_times: i32,
    /// The stored properties as stored: `name 0x01 value 0x02` pairs, UTF-8, each with its
    /// separator (checked when decoded; read them with [`properties`](Self::properties)).
    pub(crate) properties: Bytes,
    pub body: Bytes,
}

impl std::fmt::Debug for MessageExt {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("MessageExt")
            .field("topic", &self.topic())
            .field("broker_name", &self.broker_name())
            .field("queue_id", &self.queue_id)
            .field("queue_offset", &self.queue_offset)
            .field("commit_log_offset", &self.commit_log_offset)
            .field("flag", &self.flag)
            .field("sys_flag", &self.sys_flag)
            .field("born_timestamp_ms", &self.born_timestamp_ms)
            .field("born_host", &self.born_host)
            .field("store_timestamp_ms", &self.store_timestamp_ms)
            .field("store_host", &self.store_host)
            .field("reconsume_times", &self.reconsume_times)
            .field("properties", &self.properties().collect::<Vec<_>>())
            .field("body", &self.body)
            .finish()
    }
}

impl MessageExt {
    /// The topic the message was stored in.
    #[must_use]
    pub fn topic(&self) -> &str {
        std::str::from_utf8(&self.topic).unwrap_or_default()
    }

    /// Shows the message under another topic (a redelivery from the retry topic shows the
    /// topic it was first sent to).
    pub(crate) fn set_topic(&mut self, topic: &str) {
        self.topic = Bytes::copy_from_slice(topic.as_bytes());
    }

    /// The broker name it was pulled from (empty when not known, as in a query result).
    #[must_use]
    pub fn broker_name(&self) -> &str {
        &self.broker_name
    }

    /// Names the broker the message was read from (a query answer learns it afterwards).
    pub(crate) fn set_broker_name(&mut self, broker_name: &str) {
        if &*self.broker_name != broker_name {
            self.broker_name = Arc::from(broker_name);
        }
    }

    /// Every stored property (`TAGS`, `KEYS`, `UNIQ_KEY`, user properties, the CRC), in stored
    /// order.
    pub fn properties(&self) -> impl Iterator<Item = (&str, &str)> {
        std::str::from_utf8(&self.properties)
            .unwrap_or_default()
            .split(PROPERTY_SEPARATOR)
            .filter_map(|pair| pair.split_once(NAME_VALUE_SEPARATOR))
    }

    /// The message id users see: the client-generated unique id (`UNIQ_KEY`), or the store
    /// position (`host:port` + commit log offset in hex) when the producer set none.
    #[must_use]
    pub fn msg_id(&self) -> String {
        match self.property(PROPERTY_UNIQUE_ID) {
            Some(id) => id.to_owned(),
            None => format!("{}@{:016X}", self.store_host, self.commit_log_offset),
        }
    }

    /// The property `name`, if stored.
    #[must_use]
    pub fn property(&self, name: &str) -> Option<&str> {
        self.properties()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| value)
    }

    /// The message's tag, if any.
    #[must_use]
    pub fn tags(&self) -> Option<&str> {
        self.property(PROPERTY_TAGS).filter(|tag| !tag.is_empty())
    }

    /// The message's keys.
    #[must_use]
    pub fn keys(&self) -> Vec<&str> {
        self.property(PROPERTY_KEYS)
            .map(|keys| keys.split(' ').filter(|key| !key.is_empty()).collect())
            .unwrap_or_default()
    }

    /// User properties: every stored property but the ones the broker and client manage.
    pub fn user_properties(&self) -> impl Iterator<Item = (&str, &str)> {
        self.properties()
            .filter(|(key, _)| !RESERVED_PROPERTY_NAMES.contains(key))
    }

    /// For a retry or dead-letter copy: the topic the message was first sent to.
    #[must_use]
    pub fn retry_topic(&self) -> Option<&str> {
        self.property(PROPERTY_RETRY_TOPIC)
    }

    /// For a retry or dead-letter copy: the id of the message it copies (its first id).
    #[must_use]
    pub fn origin_message_id(&self) -> Option<&str> {
        self.property(PROPERTY_ORIGIN_MESSAGE_ID)
    }

    /// Whether the body is compressed (sys flag bit 0x1); the client does not decompress.
    #[must_use]
    pub fn is_compressed(&self) -> bool {
        self.sys_flag & 0x1 != 0
    }
}

/// Milliseconds since the Unix epoch (0 if the clock is before it): the clock born and store
/// timestamps use.
#[must_use]
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_rocketmq_rules() {
        assert!(check_topic_name("Topic_1-%|").is_ok());
        assert!(check_topic_name("").is_err());
        assert!(check_topic_name("a b").is_err());
        assert!(check_topic_name("é").is_err());
        assert!(check_topic_name(&"t".repeat(127)).is_ok());
        let too_long = check_topic_name(&"t".repeat(128)).unwrap_err().to_string();
        assert!(
            too_long.contains("128 bytes, over the limit of 127"),
            "{too_long}"
        );
        assert!(check_group_name(&"g".repeat(255)).is_ok());
        assert!(check_group_name(&"g".repeat(256)).is_err());
        assert!(check_consumer_group_name("orders-consumers").is_ok());
        assert!(check_consumer_group_name("%RETRY%orders").is_err());
        assert!(check_consumer_group_name("%DLQ%orders").is_err());
    }

    #[test]
    fn validation_names_the_limit() {
        let big = Message::new("t", vec![0u8; 11]);
        let error = big.validate(10).unwrap_err().to_string();
        assert!(
            error.contains("11 bytes, over max_message_bytes (10)"),
            "{error}"
        );
        assert!(Message::new("t", "x").validate(10).is_ok());
        assert!(Message::new("t", "").validate(10).is_err());
        assert!(Message::new("t", "x")
            .with_keys(["a b"])
            .validate(10)
            .is_err());
        assert!(Message::new("t", "x")
            .with_property("TAGS", "x")
            .validate(10)
            .is_err());
        assert!(Message::new("t", "x")
            .with_property("k", "v\u{1}")
            .validate(10)
            .is_err());
        assert!(Message::new("t", "x")
            .with_tags("A||B")
            .validate(10)
            .is_err());
    }

    #[test]
    fn keys_text_is_split_on_spaces() {
        let message = Message::new("t", "x").with_keys_text(" a  b ");
        assert_eq!(message.keys(), ["a", "b"]);
    }
}
