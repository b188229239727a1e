//! The JSON bodies of the admin calls `mqadmin` and `DefaultMQAdminExt` make of a broker:
//! GET_BROKER_RUNTIME_INFO (28, a `KVTable`), GET_TOPIC_STATS_INFO (202, a `TopicStatsTable`),
//! GET_CONSUME_STATS (208, a `ConsumeStats`), GET_CONSUMER_CONNECTION_LIST (203, a
//! `ConsumerConnection`) and QUERY_TOPIC_CONSUME_BY_WHO (300, a `GroupList`).
//!
//! Owns how these bodies are written; never where their figures come from (the broker's
//! handlers). Only written, never read: a broker answers them and asks no one for them.
//!
//! **Object keys.** RocketMQ's fastjson writes the `offsetTable` of a topic stats table and of
//! consume stats with each queue as an *object* key, which is not standard JSON:
//! `{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"t"}:{"maxOffset":3,…}},…}`. Java's
//! clients read only that form back; `rocketmq-client-rust` 1.0.0 reads it too (its
//! `TopicStatsTable::decode` and `ConsumeStats::decode` first try standard JSON with the queue as
//! a string key, then rewrite object keys into string keys and try again). So the maps are
//! written as fastjson writes them, keys in fastjson's alphabetical order, and every other part
//! of the body as standard JSON. Every field the Rust client requires (it has no serde defaults
//! on these types) is always present.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use bytes::Bytes;
use serde::Serialize;

use crate::heartbeat::SubscriptionData;
use crate::json_body::{self, BodyError};
use crate::lock::MessageQueue;

const RUNTIME_INFO_BODY: &str = "GET_BROKER_RUNTIME_INFO body";
const TOPIC_STATS_BODY: &str = "GET_TOPIC_STATS_INFO body";
const CONSUME_STATS_BODY: &str = "GET_CONSUME_STATS body";
const CONSUMER_CONNECTION_BODY: &str = "GET_CONSUMER_CONNECTION_LIST body";
const GROUP_LIST_BODY: &str = "QUERY_TOPIC_CONSUME_BY_WHO body";

/// GET_BROKER_RUNTIME_INFO's answer: `{"table":{"name":"value",…}}`, every value a string.
pub fn encode_kv_table(table: &BTreeMap<String, String>) -> Result<Bytes, BodyError> {
    #[derive(Serialize)]
    struct KvTable<'a> {
        table: &'a BTreeMap<String, String>,
    }
    json_body::encode(RUNTIME_INFO_BODY, &KvTable { table })
}

/// QUERY_TOPIC_CONSUME_BY_WHO's answer: `{"groupList":[…]}`.
pub fn encode_group_list(groups: &[String]) -> Result<Bytes, BodyError> {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct GroupList<'a> {
        group_list: &'a [String],
    }
    json_body::encode(GROUP_LIST_BODY, &GroupList { group_list: groups })
}

/// One queue's offsets in a topic stats table (RocketMQ's `TopicOffset`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TopicOffset {
    pub last_update_timestamp: i64,
    pub max_offset: i64,
    pub min_offset: i64,
}

/// GET_TOPIC_STATS_INFO's answer: `{"offsetTable":{queue:TopicOffset,…},"topicPutTps":0.0}`.
pub fn encode_topic_stats_table(
    offsets: &[(MessageQueue, TopicOffset)],
    topic_put_tps: f64,
) -> Result<Bytes, BodyError> {
    let mut body = String::from("{");
    write_offset_table(TOPIC_STATS_BODY, &mut body, offsets)?;
    body.push_str(",\"topicPutTps\":");
    write_value(TOPIC_STATS_BODY, &mut body, &topic_put_tps)?;
    body.push('}');
    Ok(Bytes::from(body))
}

/// One queue's progress in consume stats (RocketMQ's `OffsetWrapper`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OffsetWrapper {
    /// The queue's next offset to write.
    pub broker_offset: i64,
    /// The group's committed offset (0 when it has none).
    pub consumer_offset: i64,
    /// Store time of the last consumed message, ms; 0 when unknown.
    pub last_timestamp: i64,
    /// The furthest offset pulled (RocketMQ 5.x); never below `consumer_offset`.
    pub pull_offset: i64,
}

/// GET_CONSUME_STATS's answer: `{"consumeTps":0.0,"offsetTable":{queue:OffsetWrapper,…}}`.
pub fn encode_consume_stats(
    offsets: &[(MessageQueue, OffsetWrapper)],
    consume_tps: f64,
) -> Result<Bytes, BodyError> {
    let mut body = String::from("{\"consumeTps\":");
    write_value(CONSUME_STATS_BODY, &mut body, &consume_tps)?;
    body.push(',');
    write_offset_table(CONSUME_STATS_BODY, &mut body, offsets)?;
    body.push('}');
    Ok(Bytes::from(body))
}

/// One client connection of a consumer group (RocketMQ's `Connection`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConsumerConnectionEntry {
    pub client_id: String,
    /// `ip:port`; empty when the broker does not know it.
    pub client_addr: String,
    /// A `LanguageCode` name (`JAVA`, `RUST`, …, `OTHER`).
    pub language: String,
    /// The client's MQVersion ordinal; 0 when unknown.
    pub version: i32,
}

/// GET_CONSUMER_CONNECTION_LIST's answer (RocketMQ's `ConsumerConnection`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConsumerConnection {
    pub connection_set: Vec<ConsumerConnectionEntry>,
    /// By topic.
    pub subscription_table: BTreeMap<String, SubscriptionData>,
    /// `CONSUME_ACTIVELY`, `CONSUME_PASSIVELY` or `CONSUME_POP`; left out when not known
    /// (RocketMQ's Rust client reads it as optional).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consume_type: Option<String>,
    /// `CLUSTERING` or `BROADCASTING`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_model: Option<String>,
}

pub fn encode_consumer_connection(connection: &ConsumerConnection) -> Result<Bytes, BodyError> {
    json_body::encode(CONSUMER_CONNECTION_BODY, connection)
}

/// A subscription as RocketMQ's brokers report it: the expression, its tags split out, each
/// tag's Java `String.hashCode`, expression type TAG.
pub fn tag_subscription(topic: &str, expression: &str) -> SubscriptionData {
    let expression = expression.trim();
    let tags_set: Vec<String> = if expression.is_empty() || expression == "*" {
        Vec::new()
    } else {
        let mut tags: Vec<String> = expression
            .split("||")
            .map(str::trim)
            .filter(|tag| !tag.is_empty())
            .map(str::to_owned)
            .collect();
        tags.sort();
        tags.dedup();
        tags
    };
    SubscriptionData {
        class_filter_mode: false,
        topic: topic.to_owned(),
        sub_string: if expression.is_empty() {
            "*"
        } else {
            expression
        }
        .to_owned(),
        code_set: tags_set.iter().map(|tag| java_string_hash(tag)).collect(),
        tags_set,
        sub_version: 0,
        expression_type: "TAG".to_owned(),
    }
}

/// A SQL92 subscription as RocketMQ describes it: the expression, no tags.
pub fn sql_subscription(topic: &str, expression: &str) -> SubscriptionData {
    SubscriptionData {
        class_filter_mode: false,
        topic: topic.to_owned(),
        sub_string: expression.to_owned(),
        code_set: Vec::new(),
        tags_set: Vec::new(),
        sub_version: 0,
        expression_type: "SQL92".to_owned(),
    }
}

/// Java's `String.hashCode` over UTF-16 code units.
fn java_string_hash(text: &str) -> i32 {
    text.encode_utf16().fold(0i32, |hash, unit| {
        hash.wrapping_mul(31).wrapping_add(i32::from(unit))
    })
}

/// `"offsetTable":{…}` with each queue as a fastjson object key.
fn write_offset_table<V: Serialize>(
    body_name: &'static str,
    body: &mut String,
    offsets: &[(MessageQueue, V)],
) -> Result<(), BodyError> {
    body.push_str("\"offsetTable\":{");
    for (index, (queue, value)) in offsets.iter().enumerate() {
        if index > 0 {
            body.push(',');
        }
        body.push_str("{\"brokerName\":");
        write_value(body_name, body, &queue.broker_name)?;
        let _ = write!(body, ",\"queueId\":{},\"topic\":", queue.queue_id);
        write_value(body_name, body, &queue.topic)?;
        body.push_str("}:");
        write_value(body_name, body, value)?;
    }
    body.push('}');
    Ok(())
}

fn write_value<V: Serialize + ?Sized>(
    body_name: &'static str,
    body: &mut String,
    value: &V,
) -> Result<(), BodyError> {
    let text = serde_json::to_string(value).map_err(|source| BodyError::Encode {
        body: body_name,
        source,
    })?;
    body.push_str(&text);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(topic: &str, queue_id: i32) -> MessageQueue {
        MessageQueue {
            topic: topic.to_owned(),
            broker_name: "broker-a".to_owned(),
            queue_id,
        }
    }

    fn text(body: &Bytes) -> &str {
        std::str::from_utf8(body).expect("utf-8")
    }

    #[test]
    fn kv_table_and_group_list_are_standard_json() {
        let table = BTreeMap::from([
            ("brokerVersionDesc".to_owned(), "V5_3_3".to_owned()),
            ("uptimeMs".to_owned(), "12".to_owned()),
        ]);
        let body = encode_kv_table(&table).expect("encodes");
        assert_eq!(
            text(&body),
            r#"{"table":{"brokerVersionDesc":"V5_3_3","uptimeMs":"12"}}"#
        );
        let body = encode_group_list(&["g1".to_owned(), "g\"2".to_owned()]).expect("encodes");
        assert_eq!(text(&body), r#"{"groupList":["g1","g\"2"]}"#);
        assert_eq!(
            text(&encode_group_list(&[]).expect("encodes")),
            r#"{"groupList":[]}"#
        );
    }

    #[test]
    fn topic_stats_table_keys_queues_as_fastjson_objects() {
        let offsets = [
            (
                queue("t", 0),
                TopicOffset {
                    min_offset: 0,
                    max_offset: 3,
                    last_update_timestamp: 1_700_000_000_000,
                },
            ),
            (queue("t", 1), TopicOffset::default()),
        ];
        let body = encode_topic_stats_table(&offsets, 0.0).expect("encodes");
        assert_eq!(
            text(&body),
            concat!(
                r#"{"offsetTable":{"#,
                r#"{"brokerName":"broker-a","queueId":0,"topic":"t"}:{"lastUpdateTimestamp":1700000000000,"maxOffset":3,"minOffset":0},"#,
                r#"{"brokerName":"broker-a","queueId":1,"topic":"t"}:{"lastUpdateTimestamp":0,"maxOffset":0,"minOffset":0}"#,
                r#"},"topicPutTps":0.0}"#
            )
        );
        let empty = encode_topic_stats_table(&[], 0.0).expect("encodes");
        assert_eq!(text(&empty), r#"{"offsetTable":{},"topicPutTps":0.0}"#);
    }

    #[test]
    fn consume_stats_keys_queues_as_fastjson_objects_and_escapes_names() {
        let offsets = [(
            queue("a\"b", 2),
            OffsetWrapper {
                broker_offset: 10,
                consumer_offset: 7,
                last_timestamp: 0,
                pull_offset: 7,
            },
        )];
        let body = encode_consume_stats(&offsets, 1.5).expect("encodes");
        assert_eq!(
            text(&body),
            concat!(
                r#"{"consumeTps":1.5,"offsetTable":{"#,
                r#"{"brokerName":"broker-a","queueId":2,"topic":"a\"b"}:"#,
                r#"{"brokerOffset":10,"consumerOffset":7,"lastTimestamp":0,"pullOffset":7}}}"#
            )
        );
    }

    #[test]
    fn offset_tables_become_standard_json_when_their_object_keys_are_quoted() {
        // What RocketMQ's Rust client does with a fastjson body before reading it: each object
        // key turned into a string. The result must be JSON whose keys read back as queues.
        let offsets = [(queue("t", 0), OffsetWrapper::default())];
        let body = encode_consume_stats(&offsets, 0.0).expect("encodes");
        let key = r#"{"brokerName":"broker-a","queueId":0,"topic":"t"}"#;
        let quoted = text(&body).replace(key, &serde_json::to_string(key).expect("quotes"));
        let value: serde_json::Value = serde_json::from_str(&quoted).expect("standard JSON");
        let table = value["offsetTable"].as_object().expect("a map");
        let (key, wrapper) = table.iter().next().expect("one queue");
        let read: MessageQueue = serde_json::from_str(key).expect("a queue");
        assert_eq!(read, queue("t", 0));
        assert_eq!(wrapper["pullOffset"], 0);
    }

    #[test]
    fn consumer_connection_names_every_field_rocketmq_reads() {
        let connection = ConsumerConnection {
            connection_set: vec![ConsumerConnectionEntry {
                client_id: "10.0.0.5@1#1".to_owned(),
                client_addr: String::new(),
                language: "OTHER".to_owned(),
                version: 0,
            }],
            subscription_table: BTreeMap::from([(
                "t".to_owned(),
                tag_subscription("t", "TagB || TagA"),
            )]),
            consume_type: None,
            message_model: Some("CLUSTERING".to_owned()),
        };
        let body = encode_consumer_connection(&connection).expect("encodes");
        let value: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
        let entry = &value["connectionSet"][0];
        assert_eq!(entry["clientId"], "10.0.0.5@1#1");
        assert_eq!(entry["clientAddr"], "");
        assert_eq!(entry["language"], "OTHER");
        assert_eq!(entry["version"], 0);
        let subscription = &value["subscriptionTable"]["t"];
        assert_eq!(subscription["subString"], "TagB || TagA");
        assert_eq!(subscription["tagsSet"], serde_json::json!(["TagA", "TagB"]));
        assert_eq!(
            subscription["codeSet"],
            serde_json::json!([java_string_hash("TagA"), java_string_hash("TagB")])
        );
        assert_eq!(subscription["expressionType"], "TAG");
        assert_eq!(subscription["classFilterMode"], false);
        assert_eq!(subscription["subVersion"], 0);
        assert_eq!(value["messageModel"], "CLUSTERING");
        assert!(value.get("consumeType").is_none());
    }

    #[test]
    fn tag_subscriptions_split_tags_and_hash_them_as_java_does() {
        assert_eq!(java_string_hash("TagA"), 2_598_919);
        assert_eq!(java_string_hash(""), 0);
        let all = tag_subscription("t", "*");
        assert!(all.tags_set.is_empty() && all.code_set.is_empty());
        assert_eq!(all.sub_string, "*");
        assert_eq!(tag_subscription("t", "").sub_string, "*");
        let some = tag_subscription("t", " a || b ||a ");
        assert_eq!(some.tags_set, ["a", "b"]);
        assert_eq!(some.code_set, [97, 98]);
    }
}
