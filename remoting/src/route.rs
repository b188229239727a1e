//! The GET_ROUTEINFO_BY_TOPIC (105) success body: RocketMQ's `TopicRouteData` as JSON.
//!
//! Owns the types and their exact JSON shape:
//!
//! ```text
//! {"queueDatas":[{"brokerName","readQueueNums","writeQueueNums","perm","topicSysFlag"}],
//!  "brokerDatas":[{"cluster","brokerName","brokerAddrs":{"0":"ip:port",…},
//!                  "enableActingMaster"}],
//!  "filterServerTable":{}}
//! ```
//!
//! `rocketmq-client-rust` requires every one of these keys (Java 4.9 name servers omit
//! `enableActingMaster`, which breaks it), and parses `brokerAddrs` only with quoted numeric
//! keys, which is how serde writes integer map keys. `topicQueueMappingByBroker` is never
//! written: a non-empty one switches the client to static-topic mode. Never decides routes; the
//! name server fills these types in.
//!
//! Decoding (for tests and ShardMQ's own tools) tolerates unknown keys, absent optional keys and
//! nulls, and bounds every list and map.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Deserializer, Serialize};

use crate::json_body::{self, bounded_list, bounded_map, BodyError};

/// Most queue datas (one per broker name) read in one route.
pub const MAX_QUEUE_DATAS: usize = 1024;
/// Most broker datas (one per broker name) read in one route.
pub const MAX_BROKER_DATAS: usize = 1024;
/// Most addresses (master and slaves) read for one broker name.
pub const MAX_BROKER_ADDRS: usize = 64;
/// Most entries read in `filterServerTable`, and most filter servers per entry.
pub const MAX_FILTER_SERVERS: usize = 1024;

const BODY: &str = "GET_ROUTEINFO_BY_TOPIC body";

/// A topic's route: its queues per broker name and the brokers' addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TopicRouteData {
    #[serde(default, deserialize_with = "queue_datas")]
    pub queue_datas: Vec<QueueData>,
    #[serde(default, deserialize_with = "broker_datas")]
    pub broker_datas: Vec<BrokerData>,
    /// Broker address to filter-server addresses. Always written, normally empty.
    #[serde(default, deserialize_with = "filter_server_table")]
    pub filter_server_table: BTreeMap<String, Vec<String>>,
    /// Written only when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order_topic_conf: Option<String>,
}

/// A topic's queues on one broker name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueData {
    pub broker_name: String,
    pub read_queue_nums: i32,
    pub write_queue_nums: i32,
    /// `codes::perm` bits.
    pub perm: i32,
    pub topic_sys_flag: i32,
}

/// One broker name: its cluster and its addresses by broker id (0 = master, ≥ 1 = slaves).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BrokerData {
    pub cluster: String,
    pub broker_name: String,
    /// Broker id to literal `ip:port`. Written with quoted keys (`{"0":"…"}`).
    #[serde(deserialize_with = "broker_addrs")]
    pub broker_addrs: BTreeMap<i64, String>,
    /// Always written; read as false when absent (Java 4.9 name servers).
    #[serde(default)]
    pub enable_acting_master: bool,
    /// Written only when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone_name: Option<String>,
}

/// The GET_ROUTEINFO_BY_TOPIC success body for `route`.
pub fn encode_route_body(route: &TopicRouteData) -> Result<Bytes, BodyError> {
    json_body::encode(BODY, route)
}

/// Reads a GET_ROUTEINFO_BY_TOPIC success body.
pub fn decode_route_body(body: &[u8]) -> Result<TopicRouteData, BodyError> {
    json_body::decode(BODY, body)
}

fn queue_datas<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<QueueData>, D::Error> {
    bounded_list(deserializer, "queueDatas", MAX_QUEUE_DATAS)
}

fn broker_datas<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<BrokerData>, D::Error> {
    bounded_list(deserializer, "brokerDatas", MAX_BROKER_DATAS)
}

fn broker_addrs<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<BTreeMap<i64, String>, D::Error> {
    bounded_map(deserializer, "brokerAddrs", MAX_BROKER_ADDRS)
}

fn filter_server_table<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<BTreeMap<String, Vec<String>>, D::Error> {
    /// One entry's list of filter servers, bounded too.
    #[derive(Deserialize)]
    struct FilterServers(#[serde(deserialize_with = "filter_servers")] Vec<String>);

    fn filter_servers<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
        bounded_list(deserializer, "filterServerTable entry", MAX_FILTER_SERVERS)
    }

    let table: BTreeMap<String, FilterServers> =
        bounded_map(deserializer, "filterServerTable", MAX_FILTER_SERVERS)?;
    Ok(table
        .into_iter()
        .map(|(broker_addr, FilterServers(servers))| (broker_addr, servers))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codes::perm;

    fn sample() -> TopicRouteData {
        TopicRouteData {
            queue_datas: vec![QueueData {
                broker_name: "b1".into(),
                read_queue_nums: 4,
                write_queue_nums: 4,
                perm: perm::READ | perm::WRITE,
                topic_sys_flag: 0,
            }],
            broker_datas: vec![BrokerData {
                cluster: "c1".into(),
                broker_name: "b1".into(),
                broker_addrs: BTreeMap::from([
                    (0, "10.0.0.1:10911".into()),
                    (1, "10.0.0.2:10911".into()),
                ]),
                enable_acting_master: false,
                zone_name: None,
            }],
            filter_server_table: BTreeMap::new(),
            order_topic_conf: None,
        }
    }

    #[test]
    fn encodes_exactly_the_reference_body() {
        let body = encode_route_body(&sample()).expect("encodes");
        assert_eq!(
            std::str::from_utf8(&body).expect("UTF-8"),
            concat!(
                r#"{"queueDatas":[{"brokerName":"b1","readQueueNums":4,"writeQueueNums":4,"#,
                r#""perm":6,"topicSysFlag":0}],"#,
                r#""brokerDatas":[{"cluster":"c1","brokerName":"b1","#,
                r#""brokerAddrs":{"0":"10.0.0.1:10911","1":"10.0.0.2:10911"},"#,
                r#""enableActingMaster":false}],"#,
                r#""filterServerTable":{}}"#
            )
        );
    }

    #[test]
    fn round_trips_with_optional_keys() {
        let mut route = sample();
        route.order_topic_conf = Some("b1:4".into());
        route.broker_datas[0].zone_name = Some("z1".into());
        route.filter_server_table =
            BTreeMap::from([("10.0.0.1:10911".into(), vec!["10.0.0.1:30000".into()])]);
        let body = encode_route_body(&route).expect("encodes");
        assert_eq!(decode_route_body(&body).expect("decodes"), route);
    }

    #[test]
    fn decodes_a_java_4_9_route_and_ignores_unknown_keys() {
        let route = decode_route_body(
            br#"{"brokerDatas":[{"brokerAddrs":{"0":"10.0.0.1:10911"},"brokerName":"b1",
                "cluster":"c1"}],"queueDatas":[{"brokerName":"b1","perm":6,"readQueueNums":4,
                "topicSysFlag":0,"writeQueueNums":4}],"topicQueueMappingByBroker":null}"#,
        )
        .expect("decodes");
        assert!(!route.broker_datas[0].enable_acting_master);
        assert!(route.filter_server_table.is_empty());
    }

    #[test]
    fn lists_are_bounded() {
        let queue =
            r#"{"brokerName":"b","readQueueNums":1,"writeQueueNums":1,"perm":6,"topicSysFlag":0}"#;
        let many = vec![queue; MAX_QUEUE_DATAS + 1].join(",");
        let body = format!(r#"{{"queueDatas":[{many}]}}"#);
        let error = decode_route_body(body.as_bytes()).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("`queueDatas` has more than 1024 entries"),
            "{error}"
        );
        assert!(error.to_string().starts_with(BODY), "{error}");

        let addrs: Vec<String> = (0..=MAX_BROKER_ADDRS)
            .map(|id| format!(r#""{id}":"a""#))
            .collect();
        let body = format!(
            r#"{{"brokerDatas":[{{"cluster":"c","brokerName":"b","brokerAddrs":{{{}}}}}]}}"#,
            addrs.join(",")
        );
        let error = decode_route_body(body.as_bytes()).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("`brokerAddrs` has more than 64 entries"),
            "{error}"
        );
    }

    #[test]
    fn queue_data_needs_all_five_fields() {
        let error = decode_route_body(br#"{"queueDatas":[{"brokerName":"b1","readQueueNums":4}]}"#)
            .unwrap_err();
        assert!(error.to_string().contains("writeQueueNums"), "{error}");
    }
}
