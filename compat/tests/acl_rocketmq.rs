//! RocketMQ's ACL 1.0 between rocketmq-client-rust 1.0.0 and a broker with access control on,
//! RocketMQ's binary headers (`ROCKETMQ_SERIALIZE_TYPE=ROCKETMQ`, read once per process: hence a
//! test binary of its own); `acl_json.rs` runs it with JSON headers. The scenario is in
//! `acl_scenarios/mod.rs`.

mod acl_scenarios;

use shardmq_compat::client::SerializeType;

const SERIALIZE_TYPE: SerializeType = SerializeType::ROCKETMQ;

#[test]
fn a_client_with_credentials_sends_and_consumes_and_one_without_is_refused() {
    acl_scenarios::a_client_with_credentials_sends_and_consumes_and_one_without_is_refused(
        SERIALIZE_TYPE,
    );
}
