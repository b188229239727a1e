//! Topic routes from ShardMQ's name server to rocketmq-client-rust 1.0.0 sending RocketMQ's
//! binary headers (`ROCKETMQ_SERIALIZE_TYPE=ROCKETMQ`, which the client reads once per process:
//! hence a test binary of its own). The scenarios are in `scenarios/mod.rs`; `route_json.rs`
//! runs them with JSON headers.

mod scenarios;

use shardmq_compat::client::SerializeType;

const SERIALIZE_TYPE: SerializeType = SerializeType::ROCKETMQ;

#[test]
fn route_of_a_topic_comes_from_shardmq_s_name_server() {
    scenarios::route_of_a_topic_comes_from_shardmq_s_name_server(SERIALIZE_TYPE);
}

#[test]
fn an_unknown_topic_has_no_route() {
    scenarios::an_unknown_topic_has_no_route(SERIALIZE_TYPE);
}
