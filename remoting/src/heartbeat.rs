//! The HEART_BEAT (34) request body: RocketMQ's `HeartbeatData` as JSON.
//!
//! Owns the types and their JSON shape:
//!
//! ```text
//! {"clientID":"…","producerDataSet":[{"groupName"}],
//!  "consumerDataSet":[{"groupName","consumeType","messageModel","consumeFromWhere","unitMode",
//!     "subscriptionDataSet":[{"classFilterMode","topic","subString","tagsSet","codeSet",
//!                             "subVersion","expressionType"}]}],
//!  "heartbeatFingerprint":0,"withoutSub":false}
//! ```
//!
//! Never acts on a heartbeat (registering channels and subscriptions is the broker's). Reading
//! requires `clientID`, each group's `groupName` and each subscription's `topic`; everything
//! else may be absent or null, unknown keys are ignored (Java and Rust clients add different
//! extras), and every list is bounded. The enum-like fields stay strings, so a value from a
//! newer client does not make the whole heartbeat unreadable.

use bytes::Bytes;
use serde::{Deserialize, Deserializer, Serialize};

use crate::json_body::{self, bounded_list, null_as_default, BodyError};

/// Most producer groups read in one heartbeat.
pub const MAX_PRODUCER_GROUPS: usize = 1024;
/// Most consumer groups read in one heartbeat.
pub const MAX_CONSUMER_GROUPS: usize = 1024;
/// Most subscriptions read for one consumer group.
pub const MAX_SUBSCRIPTIONS_PER_GROUP: usize = 1024;
/// Most tags (and most tag hash codes) read for one subscription.
pub const MAX_TAGS_PER_SUBSCRIPTION: usize = 1024;

const BODY: &str = "HEART_BEAT body";

/// What a client announces every 30 s: its id and the groups it belongs to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatData {
    /// `ip@pid#…`, the id clients sort to share queues.
    #[serde(rename = "clientID")]
    pub client_id: String,
    #[serde(default, deserialize_with = "producer_groups")]
    pub producer_data_set: Vec<ProducerData>,
    #[serde(default, deserialize_with = "consumer_groups")]
    pub consumer_data_set: Vec<ConsumerData>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub heartbeat_fingerprint: i64,
    #[serde(default, deserialize_with = "null_as_default")]
    pub without_sub: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProducerData {
    pub group_name: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConsumerData {
    pub group_name: String,
    /// `CONSUME_ACTIVELY` (pull), `CONSUME_PASSIVELY` (push) or `CONSUME_POP`.
    #[serde(default, deserialize_with = "null_as_default")]
    pub consume_type: String,
    /// `CLUSTERING` or `BROADCASTING`.
    #[serde(default, deserialize_with = "null_as_default")]
    pub message_model: String,
    /// `CONSUME_FROM_LAST_OFFSET`, `CONSUME_FROM_FIRST_OFFSET`, `CONSUME_FROM_TIMESTAMP`, …
    #[serde(default, deserialize_with = "null_as_default")]
    pub consume_from_where: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub unit_mode: bool,
    #[serde(default, deserialize_with = "subscriptions")]
    pub subscription_data_set: Vec<SubscriptionData>,
}

impl ConsumerData {
    /// Whether the group shares its queues among its members (as opposed to broadcasting).
    pub fn is_clustering(&self) -> bool {
        self.message_model == "CLUSTERING"
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubscriptionData {
    #[serde(default, deserialize_with = "null_as_default")]
    pub class_filter_mode: bool,
    pub topic: String,
    /// The expression: `*`, `a || b`, or an SQL92 filter.
    #[serde(default, deserialize_with = "null_as_default")]
    pub sub_string: String,
    #[serde(default, deserialize_with = "tags")]
    pub tags_set: Vec<String>,
    /// Java `String.hashCode` of each tag.
    #[serde(default, deserialize_with = "tag_codes")]
    pub code_set: Vec<i32>,
    /// Compared with a pull's `subVersion` (SUBSCRIPTION_NOT_LATEST when older).
    #[serde(default, deserialize_with = "null_as_default")]
    pub sub_version: i64,
    /// `TAG` (the default) or `SQL92`.
    #[serde(default = "tag_expression", deserialize_with = "expression_type")]
    pub expression_type: String,
}

/// Reads a HEART_BEAT request body.
pub fn decode_heartbeat_body(body: &[u8]) -> Result<HeartbeatData, BodyError> {
    json_body::decode(BODY, body)
}

/// CHECK_CLIENT_CONFIG's body: a client asks, before it subscribes with a SQL92 expression,
/// whether the broker accepts that subscription.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckClientRequestBody {
    #[serde(default, deserialize_with = "null_as_default")]
    pub client_id: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub group: String,
    pub subscription_data: SubscriptionData,
}

/// Reads a CHECK_CLIENT_CONFIG request body.
pub fn decode_check_client_body(body: &[u8]) -> Result<CheckClientRequestBody, BodyError> {
    json_body::decode("CHECK_CLIENT_CONFIG body", body)
}

/// Writes a HEART_BEAT request body (for tests and ShardMQ's own tools).
pub fn encode_heartbeat_body(heartbeat: &HeartbeatData) -> Result<Bytes, BodyError> {
    json_body::encode(BODY, heartbeat)
}

fn tag_expression() -> String {
    "TAG".to_owned()
}

fn expression_type<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(deserializer)?.unwrap_or_else(tag_expression))
}

fn producer_groups<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<ProducerData>, D::Error> {
    bounded_list(deserializer, "producerDataSet", MAX_PRODUCER_GROUPS)
}

fn consumer_groups<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<ConsumerData>, D::Error> {
    bounded_list(deserializer, "consumerDataSet", MAX_CONSUMER_GROUPS)
}

fn subscriptions<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<SubscriptionData>, D::Error> {
    bounded_list(
        deserializer,
        "subscriptionDataSet",
        MAX_SUBSCRIPTIONS_PER_GROUP,
    )
}

fn tags<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    bounded_list(deserializer, "tagsSet", MAX_TAGS_PER_SUBSCRIPTION)
}

fn tag_codes<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<i32>, D::Error> {
    bounded_list(deserializer, "codeSet", MAX_TAGS_PER_SUBSCRIPTION)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_the_reference_heartbeat() {
        let heartbeat = decode_heartbeat_body(
            br#"{"clientID":"10.0.0.5@12345#1","producerDataSet":[{"groupName":"PG"}],
                "consumerDataSet":[{"groupName":"CG","consumeType":"CONSUME_PASSIVELY",
                  "messageModel":"CLUSTERING","consumeFromWhere":"CONSUME_FROM_LAST_OFFSET",
                  "unitMode":false,
                  "subscriptionDataSet":[{"classFilterMode":false,"topic":"T","subString":"a || b",
                    "tagsSet":["a","b"],"codeSet":[97,98],"subVersion":1724370000000,
                    "expressionType":"TAG"},{"topic":"%RETRY%CG","subString":"*"}]}],
                "heartbeatFingerprint":0,"withoutSub":false}"#,
        )
        .expect("decodes");
        assert_eq!(heartbeat.client_id, "10.0.0.5@12345#1");
        assert_eq!(heartbeat.producer_data_set[0].group_name, "PG");
        let consumer = &heartbeat.consumer_data_set[0];
        assert!(consumer.is_clustering());
        assert_eq!(consumer.subscription_data_set.len(), 2);
        let tagged = &consumer.subscription_data_set[0];
        assert_eq!(tagged.tags_set, ["a", "b"]);
        assert_eq!(tagged.code_set, [97, 98]);
        assert_eq!(tagged.sub_version, 1_724_370_000_000);
        let retry = &consumer.subscription_data_set[1];
        assert_eq!(retry.topic, "%RETRY%CG");
        assert_eq!(retry.expression_type, "TAG");
        assert!(retry.tags_set.is_empty());
    }

    #[test]
    fn decodes_a_check_client_body() {
        let check = decode_check_client_body(
            br#"{"clientId":"c@1","group":"CG","namespace":null,
                "subscriptionData":{"topic":"T","subString":"a > 1","expressionType":"SQL92",
                  "tagsSet":[],"codeSet":[],"subVersion":1}}"#,
        )
        .expect("decodes");
        assert_eq!(check.group, "CG");
        assert_eq!(check.subscription_data.sub_string, "a > 1");
        assert_eq!(check.subscription_data.expression_type, "SQL92");
        assert!(
            decode_check_client_body(br#"{"group":"CG"}"#).is_err(),
            "no subscription"
        );
    }

    #[test]
    fn tolerates_nulls_absent_keys_and_unknown_keys() {
        let heartbeat = decode_heartbeat_body(
            br#"{"clientID":"c","producerDataSet":null,"heartbeatFingerprint":null,
                "consumerDataSet":[{"groupName":"CG","consumeFromWhere":null,"future":{"x":1},
                  "subscriptionDataSet":[{"topic":"T","tagsSet":null,"expressionType":null,
                    "filterClassSource":null}]}],"isWithoutSub":true}"#,
        )
        .expect("decodes");
        assert!(heartbeat.producer_data_set.is_empty());
        let consumer = &heartbeat.consumer_data_set[0];
        assert_eq!(consumer.consume_from_where, "");
        assert_eq!(consumer.subscription_data_set[0].expression_type, "TAG");
    }

    #[test]
    fn client_id_is_required() {
        let error = decode_heartbeat_body(br#"{"producerDataSet":[]}"#).unwrap_err();
        assert!(error.to_string().contains("clientID"), "{error}");
        let error = decode_heartbeat_body(b"[]").unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("HEART_BEAT body is not valid"),
            "{error}"
        );
    }

    #[test]
    fn lists_are_bounded() {
        let groups = vec![r#"{"groupName":"g"}"#; MAX_PRODUCER_GROUPS + 1].join(",");
        let body = format!(r#"{{"clientID":"c","producerDataSet":[{groups}]}}"#);
        let error = decode_heartbeat_body(body.as_bytes()).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("`producerDataSet` has more than 1024 entries"),
            "{error}"
        );
        let tags = vec![r#""t""#; MAX_TAGS_PER_SUBSCRIPTION + 1].join(",");
        let body = format!(
            r#"{{"clientID":"c","consumerDataSet":[{{"groupName":"g",
                "subscriptionDataSet":[{{"topic":"T","tagsSet":[{tags}]}}]}}]}}"#
        );
        let error = decode_heartbeat_body(body.as_bytes()).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("`tagsSet` has more than 1024 entries"),
            "{error}"
        );
    }

    #[test]
    fn round_trips() {
        let heartbeat = HeartbeatData {
            client_id: "c".into(),
            producer_data_set: vec![ProducerData {
                group_name: "PG".into(),
            }],
            consumer_data_set: vec![ConsumerData {
                group_name: "CG".into(),
                consume_type: "CONSUME_ACTIVELY".into(),
                message_model: "BROADCASTING".into(),
                consume_from_where: "CONSUME_FROM_FIRST_OFFSET".into(),
                unit_mode: true,
                subscription_data_set: vec![SubscriptionData {
                    class_filter_mode: false,
                    topic: "T".into(),
                    sub_string: "a > 1".into(),
                    tags_set: vec![],
                    code_set: vec![],
                    sub_version: 7,
                    expression_type: "SQL92".into(),
                }],
            }],
            heartbeat_fingerprint: 3,
            without_sub: true,
        };
        let body = encode_heartbeat_body(&heartbeat).expect("encodes");
        assert!(std::str::from_utf8(&body)
            .unwrap()
            .starts_with(r#"{"clientID":"c""#));
        assert_eq!(decode_heartbeat_body(&body).expect("decodes"), heartbeat);
    }
}
