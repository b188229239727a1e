//! Topic routes from ShardMQ's name server to rocketmq-client-rust 1.0.0 sending JSON headers
//! (its default: neither `rocketmq.serialize.type` nor `ROCKETMQ_SERIALIZE_TYPE` set). The
//! scenarios are in `scenarios/mod.rs`; `route_rocketmq.rs` runs them with the binary header.

mod scenarios;

use shardmq_compat::client::SerializeType;

const SERIALIZE_TYPE: SerializeType = SerializeType::JSON;

#[test]
fn route_of_a_topic_comes_from_shardmq_s_name_server() {
    scenarios::route_of_a_topic_comes_from_shardmq_s_name_server(SERIALIZE_TYPE);
}

#[test]
fn an_unknown_topic_has_no_route() {
    scenarios::an_unknown_topic_has_no_route(SERIALIZE_TYPE);
}
