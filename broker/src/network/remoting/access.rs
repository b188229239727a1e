//! Access control on a remoting request (docs/acl.md, "RocketMQ clients (remoting)"): RocketMQ
//! 4.9's `PlainAccessValidator` in front of the remoting table.
//!
//! Owns what a remoting request needs ([`needs`], RocketMQ's `PlainAccessValidator.parse` and
//! `Permission.ADMIN_CODE`) and the order of the checks. The accounts, the signature rule and
//! the decision are `shardmq-acl`'s; the store, the refusal and its count are
//! `network::access`'s. Never: decides anything when access control is off (one check of the
//! store), or looks at a request after a handler has touched it: the ext fields checked are the
//! ones the client signed, as they arrived.

use shardmq_acl::signature::ACCESS_KEY_FIELD;
use shardmq_acl::{Action, Denied, Need};
use shardmq_remoting::codes::request;
use shardmq_remoting::{decode_heartbeat_body, HeartbeatData, RemotingCommand};

use crate::network::access;
use crate::network::request::{Connection, Refusal};

/// The metric kind of a request code no table names.
const UNNAMED_KIND: &str = "REMOTING_UNKNOWN_CODE";

/// Decides one remoting request, before it is dispatched: a request from an address that is
/// not trusted must carry `AccessKey` and a `Signature` over its ext fields and body; then
/// the account (or the trusted address) must hold what the request needs. `Ok` at once when
/// access control is off.
pub(super) fn check(connection: &Connection, command: &RemotingCommand) -> Result<(), Refusal> {
    let Some(acl) = access::current() else {
        return Ok(());
    };
    let remote = connection.peer.ip();
    let access_key = command.ext(ACCESS_KEY_FIELD);
    let kind = || request::name(command.code).unwrap_or(UNNAMED_KIND);
    if !acl.is_trusted(access_key, remote) {
        if access_key.is_none() {
            return Err(access::denied(kind(), &Denied::NoCredentials { remote }));
        }
        acl.verify_rocketmq_request(&command.ext_fields, &command.body)
            .map_err(|refusal| access::denied(kind(), &refusal))?;
    }
    // Decoded here as well as by its handler: heartbeats come every 30 s per client, and the
    // decision must not wait for the handler to act on them.
    let heartbeat = (command.code == request::HEART_BEAT)
        .then(|| decode_heartbeat_body(&command.body).ok())
        .flatten();
    acl.authorize(access_key, remote, &needs(command, heartbeat.as_ref()))
        .map_err(|refusal| access::denied(kind(), &refusal))
}

/// What a remoting request needs: RocketMQ 4.9's `PlainAccessValidator.parse` per request
/// code, and the admin flag for RocketMQ's admin codes. Beyond RocketMQ: a batch send is
/// checked like a send, a lite pull like a pull, the query of a consumer offset like its
/// update; short of it: a send-back needs no PUB on its `originTopic` (as the native
/// send-back). A code that names nothing needs only a known account or a trusted address. A
/// missing field adds no need (the handler refuses the request as invalid), and so does a
/// heartbeat body that does not decode (`heartbeat` is `None`; its handler refuses it).
pub(super) fn needs<'a>(
    command: &'a RemotingCommand,
    heartbeat: Option<&'a HeartbeatData>,
) -> Vec<Need<'a>> {
    let mut needs = Vec::new();
    let topic = |needs: &mut Vec<Need<'a>>, field: &str, action| {
        if let Some(topic) = command.ext(field).filter(|t| !t.is_empty()) {
            needs.push(Need::Topic(topic, action));
        }
    };
    let group = |needs: &mut Vec<Need<'a>>, field: &str| {
        if let Some(group) = command.ext(field).filter(|g| !g.is_empty()) {
            needs.push(Need::Group(group, Action::Sub));
        }
    };
    match command.code {
        // A send to a retry topic `%RETRY%g` is checked as SUB on group g (shardmq-acl).
        request::SEND_MESSAGE => topic(&mut needs, "topic", Action::Pub),
        request::SEND_MESSAGE_V2 | request::SEND_BATCH_MESSAGE => {
            topic(&mut needs, "b", Action::Pub)
        }
        request::CONSUMER_SEND_MSG_BACK => group(&mut needs, "group"),
        request::PULL_MESSAGE | request::LITE_PULL_MESSAGE => {
            topic(&mut needs, "topic", Action::Sub);
            group(&mut needs, "consumerGroup");
        }
        request::QUERY_MESSAGE => topic(&mut needs, "topic", Action::Sub),
        request::HEART_BEAT => {
            for consumer in heartbeat.iter().flat_map(|h| &h.consumer_data_set) {
                if !consumer.group_name.is_empty() {
                    needs.push(Need::Group(&consumer.group_name, Action::Sub));
                }
                for subscription in &consumer.subscription_data_set {
                    needs.push(Need::Topic(&subscription.topic, Action::Sub));
                }
            }
        }
        request::UNREGISTER_CLIENT | request::GET_CONSUMER_LIST_BY_GROUP => {
            group(&mut needs, "consumerGroup")
        }
        request::UPDATE_CONSUMER_OFFSET | request::QUERY_CONSUMER_OFFSET => {
            group(&mut needs, "consumerGroup");
            topic(&mut needs, "topic", Action::Sub);
        }
        request::UPDATE_AND_CREATE_TOPIC
        | request::UPDATE_BROKER_CONFIG
        | request::DELETE_TOPIC_IN_BROKER
        | request::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP
        | request::DELETE_SUBSCRIPTIONGROUP => needs.push(Need::Admin),
        _ => {}
    }
    needs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(code: i32, fields: &[(&str, &str)]) -> RemotingCommand {
        fields.iter().fold(
            RemotingCommand::request(code, 1),
            |command, (key, value)| command.with_ext(*key, value),
        )
    }

    #[test]
    fn sends_need_pub_on_the_topic_of_their_header_shape() {
        let v1 = command(request::SEND_MESSAGE, &[("topic", "orders"), ("b", "x")]);
        assert_eq!(needs(&v1, None), [Need::Topic("orders", Action::Pub)]);
        for code in [request::SEND_MESSAGE_V2, request::SEND_BATCH_MESSAGE] {
            let v2 = command(code, &[("a", "producers"), ("b", "orders")]);
            assert_eq!(needs(&v2, None), [Need::Topic("orders", Action::Pub)]);
        }
    }

    #[test]
    fn consuming_needs_sub_on_the_group_and_the_topic() {
        let pull = command(
            request::PULL_MESSAGE,
            &[("topic", "orders"), ("consumerGroup", "billing")],
        );
        assert_eq!(
            needs(&pull, None),
            [
                Need::Topic("orders", Action::Sub),
                Need::Group("billing", Action::Sub)
            ]
        );
        let offset = command(
            request::UPDATE_CONSUMER_OFFSET,
            &[("topic", "orders"), ("consumerGroup", "billing")],
        );
        assert_eq!(
            needs(&offset, None),
            [
                Need::Group("billing", Action::Sub),
                Need::Topic("orders", Action::Sub)
            ]
        );
        let back = command(request::CONSUMER_SEND_MSG_BACK, &[("group", "billing")]);
        assert_eq!(needs(&back, None), [Need::Group("billing", Action::Sub)]);
    }

    #[test]
    fn a_heartbeat_needs_sub_on_each_consumer_group_and_subscribed_topic() {
        let body = br#"{"clientID":"c1","producerDataSet":[{"groupName":"p"}],
            "consumerDataSet":[{"groupName":"billing","consumeType":"CONSUME_PASSIVELY",
            "messageModel":"CLUSTERING","consumeFromWhere":"CONSUME_FROM_LAST_OFFSET",
            "unitMode":false,"subscriptionDataSet":[{"topic":"orders","subString":"*"},
            {"topic":"%RETRY%billing","subString":"*"}]}]}"#;
        let heartbeat = decode_heartbeat_body(body).unwrap();
        let command = command(request::HEART_BEAT, &[]).with_body(body.to_vec());
        assert_eq!(
            needs(&command, Some(&heartbeat)),
            [
                Need::Group("billing", Action::Sub),
                Need::Topic("orders", Action::Sub),
                Need::Topic("%RETRY%billing", Action::Sub)
            ]
        );
    }

    #[test]
    fn admin_codes_need_the_admin_flag_and_other_codes_nothing() {
        for code in [
            request::UPDATE_AND_CREATE_TOPIC,
            request::UPDATE_BROKER_CONFIG,
            request::DELETE_TOPIC_IN_BROKER,
            request::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
            request::DELETE_SUBSCRIPTIONGROUP,
        ] {
            assert_eq!(
                needs(&command(code, &[("topic", "t")]), None),
                [Need::Admin]
            );
        }
        let stats = command(request::GET_TOPIC_STATS_INFO, &[("topic", "orders")]);
        assert!(needs(&stats, None).is_empty());
    }
}
