//! The numbers of RocketMQ's remoting protocol: request codes, response codes, permission bits,
//! PULL_MESSAGE sys-flag bits and message sys-flag bits, under RocketMQ's own names.
//!
//! Owns constants only; it never decides what a code means for ShardMQ (the handlers do). Only
//! the codes that ShardMQ's name server and broker meet are here; anything else is answered
//! with [`response::REQUEST_CODE_NOT_SUPPORTED`].

/// Request codes (RocketMQ's `RequestCode`).
pub mod request {
    // Client -> broker.
    pub const SEND_MESSAGE: i32 = 10;
    pub const PULL_MESSAGE: i32 = 11;
    pub const QUERY_MESSAGE: i32 = 12;
    /// Admin tools: create or update a topic on a broker.
    pub const UPDATE_AND_CREATE_TOPIC: i32 = 17;
    pub const QUERY_CONSUMER_OFFSET: i32 = 14;
    /// Sent oneway by both clients.
    pub const UPDATE_CONSUMER_OFFSET: i32 = 15;
    pub const SEARCH_OFFSET_BY_TIMESTAMP: i32 = 29;
    pub const GET_MAX_OFFSET: i32 = 30;
    pub const GET_MIN_OFFSET: i32 = 31;
    pub const GET_EARLIEST_MSG_STORETIME: i32 = 32;
    pub const VIEW_MESSAGE_BY_ID: i32 = 33;
    pub const HEART_BEAT: i32 = 34;
    pub const UNREGISTER_CLIENT: i32 = 35;
    pub const CONSUMER_SEND_MSG_BACK: i32 = 36;
    /// Sent oneway.
    pub const END_TRANSACTION: i32 = 37;
    pub const GET_CONSUMER_LIST_BY_GROUP: i32 = 38;
    pub const LOCK_BATCH_MQ: i32 = 41;
    pub const UNLOCK_BATCH_MQ: i32 = 42;
    pub const CHECK_CLIENT_CONFIG: i32 = 46;
    pub const SEND_MESSAGE_V2: i32 = 310;
    pub const SEND_BATCH_MESSAGE: i32 = 320;
    pub const LITE_PULL_MESSAGE: i32 = 361;

    // Admin tools (mqadmin, DefaultMQAdminExt) -> broker.
    /// Not served by ShardMQ; named for access control (an admin call in RocketMQ's ACL).
    pub const UPDATE_BROKER_CONFIG: i32 = 25;
    pub const GET_BROKER_RUNTIME_INFO: i32 = 28;
    pub const UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: i32 = 200;
    pub const GET_TOPIC_STATS_INFO: i32 = 202;
    pub const GET_CONSUMER_CONNECTION_LIST: i32 = 203;
    pub const DELETE_SUBSCRIPTIONGROUP: i32 = 207;
    pub const GET_CONSUME_STATS: i32 = 208;
    pub const DELETE_TOPIC_IN_BROKER: i32 = 215;
    pub const QUERY_TOPIC_CONSUME_BY_WHO: i32 = 300;

    // Broker -> client (sent oneway).
    pub const CHECK_TRANSACTION_STATE: i32 = 39;
    pub const NOTIFY_CONSUMER_IDS_CHANGED: i32 = 40;

    // Optional admin calls on clients.
    pub const RESET_CONSUMER_CLIENT_OFFSET: i32 = 220;
    pub const GET_CONSUMER_STATUS_FROM_CLIENT: i32 = 221;
    pub const GET_CONSUMER_RUNNING_INFO: i32 = 307;
    pub const CONSUME_MESSAGE_DIRECTLY: i32 = 309;

    // Broker -> name server.
    pub const REGISTER_BROKER: i32 = 103;
    pub const UNREGISTER_BROKER: i32 = 104;
    pub const QUERY_DATA_VERSION: i32 = 322;
    /// 5.x only.
    pub const BROKER_HEARTBEAT: i32 = 904;

    // Client (and admin tool) -> name server.
    pub const GET_ROUTEINFO_BY_TOPIC: i32 = 105;
    pub const GET_BROKER_CLUSTER_INFO: i32 = 106;
    pub const GET_ALL_TOPIC_LIST_FROM_NAMESERVER: i32 = 206;
    pub const GET_TOPICS_BY_CLUSTER: i32 = 224;
    /// Admin tools: drop a topic's routes (after deleting it on its brokers).
    pub const DELETE_TOPIC_IN_NAMESRV: i32 = 216;

    /// RocketMQ's name of a request code above (for logs and metric labels).
    pub fn name(code: i32) -> Option<&'static str> {
        Some(match code {
            SEND_MESSAGE => "SEND_MESSAGE",
            PULL_MESSAGE => "PULL_MESSAGE",
            QUERY_MESSAGE => "QUERY_MESSAGE",
            UPDATE_AND_CREATE_TOPIC => "UPDATE_AND_CREATE_TOPIC",
            QUERY_CONSUMER_OFFSET => "QUERY_CONSUMER_OFFSET",
            UPDATE_CONSUMER_OFFSET => "UPDATE_CONSUMER_OFFSET",
            SEARCH_OFFSET_BY_TIMESTAMP => "SEARCH_OFFSET_BY_TIMESTAMP",
            GET_MAX_OFFSET => "GET_MAX_OFFSET",
            GET_MIN_OFFSET => "GET_MIN_OFFSET",
            GET_EARLIEST_MSG_STORETIME => "GET_EARLIEST_MSG_STORETIME",
            VIEW_MESSAGE_BY_ID => "VIEW_MESSAGE_BY_ID",
            HEART_BEAT => "HEART_BEAT",
            UNREGISTER_CLIENT => "UNREGISTER_CLIENT",
            CONSUMER_SEND_MSG_BACK => "CONSUMER_SEND_MSG_BACK",
            END_TRANSACTION => "END_TRANSACTION",
            GET_CONSUMER_LIST_BY_GROUP => "GET_CONSUMER_LIST_BY_GROUP",
            LOCK_BATCH_MQ => "LOCK_BATCH_MQ",
            UNLOCK_BATCH_MQ => "UNLOCK_BATCH_MQ",
            CHECK_CLIENT_CONFIG => "CHECK_CLIENT_CONFIG",
            SEND_MESSAGE_V2 => "SEND_MESSAGE_V2",
            SEND_BATCH_MESSAGE => "SEND_BATCH_MESSAGE",
            LITE_PULL_MESSAGE => "LITE_PULL_MESSAGE",
            UPDATE_BROKER_CONFIG => "UPDATE_BROKER_CONFIG",
            GET_BROKER_RUNTIME_INFO => "GET_BROKER_RUNTIME_INFO",
            UPDATE_AND_CREATE_SUBSCRIPTIONGROUP => "UPDATE_AND_CREATE_SUBSCRIPTIONGROUP",
            GET_TOPIC_STATS_INFO => "GET_TOPIC_STATS_INFO",
            GET_CONSUMER_CONNECTION_LIST => "GET_CONSUMER_CONNECTION_LIST",
            DELETE_SUBSCRIPTIONGROUP => "DELETE_SUBSCRIPTIONGROUP",
            GET_CONSUME_STATS => "GET_CONSUME_STATS",
            DELETE_TOPIC_IN_BROKER => "DELETE_TOPIC_IN_BROKER",
            QUERY_TOPIC_CONSUME_BY_WHO => "QUERY_TOPIC_CONSUME_BY_WHO",
            CHECK_TRANSACTION_STATE => "CHECK_TRANSACTION_STATE",
            NOTIFY_CONSUMER_IDS_CHANGED => "NOTIFY_CONSUMER_IDS_CHANGED",
            RESET_CONSUMER_CLIENT_OFFSET => "RESET_CONSUMER_CLIENT_OFFSET",
            GET_CONSUMER_STATUS_FROM_CLIENT => "GET_CONSUMER_STATUS_FROM_CLIENT",
            GET_CONSUMER_RUNNING_INFO => "GET_CONSUMER_RUNNING_INFO",
            CONSUME_MESSAGE_DIRECTLY => "CONSUME_MESSAGE_DIRECTLY",
            REGISTER_BROKER => "REGISTER_BROKER",
            UNREGISTER_BROKER => "UNREGISTER_BROKER",
            QUERY_DATA_VERSION => "QUERY_DATA_VERSION",
            BROKER_HEARTBEAT => "BROKER_HEARTBEAT",
            GET_ROUTEINFO_BY_TOPIC => "GET_ROUTEINFO_BY_TOPIC",
            GET_BROKER_CLUSTER_INFO => "GET_BROKER_CLUSTER_INFO",
            GET_ALL_TOPIC_LIST_FROM_NAMESERVER => "GET_ALL_TOPIC_LIST_FROM_NAMESERVER",
            GET_TOPICS_BY_CLUSTER => "GET_TOPICS_BY_CLUSTER",
            DELETE_TOPIC_IN_NAMESRV => "DELETE_TOPIC_IN_NAMESRV",
            _ => return None,
        })
    }
}

/// Response codes (RocketMQ's `RemotingSysResponseCode` and `ResponseCode`).
pub mod response {
    pub const SUCCESS: i32 = 0;
    pub const SYSTEM_ERROR: i32 = 1;
    pub const SYSTEM_BUSY: i32 = 2;
    /// The answer to anything ShardMQ does not implement.
    pub const REQUEST_CODE_NOT_SUPPORTED: i32 = 3;
    pub const FLUSH_DISK_TIMEOUT: i32 = 10;
    pub const SLAVE_NOT_AVAILABLE: i32 = 11;
    pub const FLUSH_SLAVE_TIMEOUT: i32 = 12;
    pub const MESSAGE_ILLEGAL: i32 = 13;
    pub const SERVICE_NOT_AVAILABLE: i32 = 14;
    pub const NO_PERMISSION: i32 = 16;
    /// From the name server: no route for the topic.
    pub const TOPIC_NOT_EXIST: i32 = 17;
    pub const PULL_NOT_FOUND: i32 = 19;
    pub const PULL_RETRY_IMMEDIATELY: i32 = 20;
    pub const PULL_OFFSET_MOVED: i32 = 21;
    /// QUERY_CONSUMER_OFFSET: no stored offset; the client falls back to consumeFromWhere.
    pub const QUERY_NOT_FOUND: i32 = 22;
    pub const SUBSCRIPTION_PARSE_FAILED: i32 = 23;
    pub const SUBSCRIPTION_NOT_EXIST: i32 = 24;
    pub const SUBSCRIPTION_NOT_LATEST: i32 = 25;
    pub const SUBSCRIPTION_GROUP_NOT_EXIST: i32 = 26;
    pub const FILTER_DATA_NOT_EXIST: i32 = 27;
    pub const FILTER_DATA_NOT_LATEST: i32 = 28;
    pub const NO_BUYER_ID: i32 = 204;
    pub const NOT_IN_CURRENT_UNIT: i32 = 205;
    /// Pull: the client retries after 20 ms rather than 3 s.
    pub const FLOW_CONTROL: i32 = 215;
    /// Java 5.x producers retry on another broker.
    pub const GO_AWAY: i32 = 1500;
}

/// Topic permission bits (`perm` in routes and topic configs).
pub mod perm {
    pub const PRIORITY: i32 = 8;
    pub const READ: i32 = 4;
    pub const WRITE: i32 = 2;
    pub const INHERIT: i32 = 1;
}

/// PULL_MESSAGE `sysFlag` bits (RocketMQ's `PullSysFlag`).
pub mod pull_sys_flag {
    /// Store the request's `commitOffset`; when clear, `commitOffset` may be junk (−1).
    pub const COMMIT_OFFSET: i32 = 0x1;
    /// Long polling allowed.
    pub const SUSPEND: i32 = 0x2;
    /// Use the request's `subscription`; when clear, use the heartbeat's.
    pub const SUBSCRIPTION: i32 = 0x4;
    pub const CLASS_FILTER: i32 = 0x8;
    /// Arrives as LITE_PULL_MESSAGE.
    pub const LITE_PULL: i32 = 0x10;
}

/// Message `sysFlag` bits (RocketMQ's `MessageSysFlag`), as in SEND headers and stored records.
pub mod message_sys_flag {
    pub const COMPRESSED: i32 = 0x1;
    pub const MULTI_TAGS: i32 = 0x2;
    /// Bits 2–3 hold the transaction type; these are its four values and the mask.
    pub const TRANSACTION_TYPE_MASK: i32 = 0xC;
    pub const TRANSACTION_NOT_TYPE: i32 = 0x0;
    pub const TRANSACTION_PREPARED_TYPE: i32 = 0x4;
    pub const TRANSACTION_COMMIT_TYPE: i32 = 0x8;
    pub const TRANSACTION_ROLLBACK_TYPE: i32 = 0xC;
    pub const BORNHOST_V6: i32 = 0x10;
    pub const STOREHOST_V6: i32 = 0x20;
    pub const NEED_UNWRAP: i32 = 0x40;
    pub const INNER_BATCH: i32 = 0x80;
    /// Bits 8–10 hold the compression type; 0 is read as ZLIB.
    pub const COMPRESSION_TYPE_MASK: i32 = 0x700;
    pub const COMPRESSION_LZ4: i32 = 1 << 8;
    pub const COMPRESSION_ZSTD: i32 = 2 << 8;
    pub const COMPRESSION_ZLIB: i32 = 3 << 8;

    /// The transaction type bits of `sys_flag`.
    pub const fn transaction_type(sys_flag: i32) -> i32 {
        sys_flag & TRANSACTION_TYPE_MASK
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transaction_type_values_are_the_end_transaction_commit_or_rollback_values() {
        // END_TRANSACTION's `commitOrRollback` uses the same numbers: 0 / 8 / 12.
        assert_eq!(message_sys_flag::TRANSACTION_NOT_TYPE, 0);
        assert_eq!(message_sys_flag::TRANSACTION_COMMIT_TYPE, 8);
        assert_eq!(message_sys_flag::TRANSACTION_ROLLBACK_TYPE, 12);
        assert_eq!(
            message_sys_flag::transaction_type(
                message_sys_flag::TRANSACTION_PREPARED_TYPE | message_sys_flag::COMPRESSED
            ),
            message_sys_flag::TRANSACTION_PREPARED_TYPE
        );
    }

    #[test]
    fn request_names_are_the_constants_names() {
        assert_eq!(
            request::name(request::SEND_MESSAGE_V2),
            Some("SEND_MESSAGE_V2")
        );
        assert_eq!(
            request::name(request::UPDATE_AND_CREATE_TOPIC),
            Some("UPDATE_AND_CREATE_TOPIC")
        );
        assert_eq!(request::name(-1), None);
    }

    #[test]
    fn bit_sets_do_not_overlap() {
        let pull = [
            pull_sys_flag::COMMIT_OFFSET,
            pull_sys_flag::SUSPEND,
            pull_sys_flag::SUBSCRIPTION,
            pull_sys_flag::CLASS_FILTER,
            pull_sys_flag::LITE_PULL,
        ];
        assert_eq!(pull.iter().fold(0, |all, bit| all | bit), 0x1F);
        let perms = [perm::PRIORITY, perm::READ, perm::WRITE, perm::INHERIT];
        assert_eq!(perms.iter().fold(0, |all, bit| all | bit), 0xF);
        assert_eq!(
            message_sys_flag::COMPRESSION_TYPE_MASK & message_sys_flag::COMPRESSION_ZLIB,
            message_sys_flag::COMPRESSION_ZLIB
        );
    }
}
