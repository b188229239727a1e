//! RocketMQ's ACL 1.0 between rocketmq-client-rust 1.0.0 and a broker with access control on,
//! JSON headers (the client's default). The scenario is in `acl_scenarios/mod.rs`;
//! `acl_rocketmq.rs` runs it with the binary header.

mod acl_scenarios;

use shardmq_compat::client::SerializeType;

const SERIALIZE_TYPE: SerializeType = SerializeType::JSON;

#[test]
fn a_client_with_credentials_sends_and_consumes_and_one_without_is_refused() {
    acl_scenarios::a_client_with_credentials_sends_and_consumes_and_one_without_is_refused(
        SERIALIZE_TYPE,
    );
}
