//! The LOCK_BATCH_MQ (41) and UNLOCK_BATCH_MQ (42) bodies, as JSON.
//!
//! Owns the request body `{"consumerGroup","clientId","onlyThisBroker","mqSet":[{"topic",
//! "brokerName","queueId"}]}` (the same for lock and unlock) and the lock reply body
//! `{"lockOKMQSet":[…]}`. Never holds or grants locks; the broker's lock table does.
//!
//! Reading requires `consumerGroup`, `clientId` and every queue's three fields; unknown keys are
//! ignored, `onlyThisBroker` and the sets may be absent or null, and the sets are bounded.

use bytes::Bytes;
use serde::{Deserialize, Deserializer, Serialize};

use crate::json_body::{self, bounded_list, null_as_default, BodyError};

/// Most queues read in one lock or unlock request (or reply): every queue one client holds on
/// one broker, across all its topics.
pub const MAX_LOCK_QUEUES: usize = 16 * 1024;

/// A queue as clients name it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageQueue {
    pub topic: String,
    pub broker_name: String,
    pub queue_id: i32,
}

/// The LOCK_BATCH_MQ and UNLOCK_BATCH_MQ request body.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LockBatchRequestBody {
    pub consumer_group: String,
    pub client_id: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub only_this_broker: bool,
    #[serde(default, deserialize_with = "queues")]
    pub mq_set: Vec<MessageQueue>,
}

/// The LOCK_BATCH_MQ reply body: the queues now locked by the requesting client.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockBatchResponseBody {
    #[serde(rename = "lockOKMQSet", default, deserialize_with = "queues")]
    pub lock_ok_mq_set: Vec<MessageQueue>,
}

const REQUEST_BODY: &str = "LOCK_BATCH_MQ/UNLOCK_BATCH_MQ body";
const RESPONSE_BODY: &str = "LOCK_BATCH_MQ reply body";

/// Reads a LOCK_BATCH_MQ or UNLOCK_BATCH_MQ request body.
pub fn decode_lock_batch_request(body: &[u8]) -> Result<LockBatchRequestBody, BodyError> {
    json_body::decode(REQUEST_BODY, body)
}

/// Writes a LOCK_BATCH_MQ or UNLOCK_BATCH_MQ request body.
pub fn encode_lock_batch_request(request: &LockBatchRequestBody) -> Result<Bytes, BodyError> {
    json_body::encode(REQUEST_BODY, request)
}

/// Reads a LOCK_BATCH_MQ reply body.
pub fn decode_lock_batch_response(body: &[u8]) -> Result<LockBatchResponseBody, BodyError> {
    json_body::decode(RESPONSE_BODY, body)
}

/// Writes a LOCK_BATCH_MQ reply body.
pub fn encode_lock_batch_response(response: &LockBatchResponseBody) -> Result<Bytes, BodyError> {
    json_body::encode(RESPONSE_BODY, response)
}

fn queues<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<MessageQueue>, D::Error> {
    bounded_list(deserializer, "message queue set", MAX_LOCK_QUEUES)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(queue_id: i32) -> MessageQueue {
        MessageQueue {
            topic: "T".into(),
            broker_name: "b1".into(),
            queue_id,
        }
    }

    #[test]
    fn decodes_the_reference_request() {
        let request = decode_lock_batch_request(
            br#"{"consumerGroup":"CG","clientId":"10.0.0.5@1","onlyThisBroker":false,
                "mqSet":[{"topic":"T","brokerName":"b1","queueId":0},
                         {"topic":"T","brokerName":"b1","queueId":3}],"future":1}"#,
        )
        .expect("decodes");
        assert_eq!(request.consumer_group, "CG");
        assert_eq!(request.client_id, "10.0.0.5@1");
        assert_eq!(request.mq_set, [queue(0), queue(3)]);
    }

    #[test]
    fn encodes_the_reply_with_its_exact_key() {
        let reply = LockBatchResponseBody {
            lock_ok_mq_set: vec![queue(1)],
        };
        let body = encode_lock_batch_response(&reply).expect("encodes");
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            r#"{"lockOKMQSet":[{"topic":"T","brokerName":"b1","queueId":1}]}"#
        );
        assert_eq!(decode_lock_batch_response(&body).expect("decodes"), reply);
    }

    #[test]
    fn request_round_trips() {
        let request = LockBatchRequestBody {
            consumer_group: "CG".into(),
            client_id: "c".into(),
            only_this_broker: true,
            mq_set: vec![queue(0), queue(1)],
        };
        let body = encode_lock_batch_request(&request).expect("encodes");
        assert_eq!(decode_lock_batch_request(&body).expect("decodes"), request);
    }

    #[test]
    fn malformed_requests_are_refused() {
        let error = decode_lock_batch_request(br#"{"clientId":"c","mqSet":[]}"#).unwrap_err();
        assert!(error.to_string().contains("consumerGroup"), "{error}");
        let error = decode_lock_batch_request(
            br#"{"consumerGroup":"CG","clientId":"c","mqSet":[{"topic":"T","brokerName":"b"}]}"#,
        )
        .unwrap_err();
        assert!(error.to_string().contains("queueId"), "{error}");
        let many = vec![r#"{"topic":"T","brokerName":"b","queueId":0}"#; MAX_LOCK_QUEUES + 1];
        let body = format!(
            r#"{{"consumerGroup":"CG","clientId":"c","mqSet":[{}]}}"#,
            many.join(",")
        );
        let error = decode_lock_batch_request(body.as_bytes()).unwrap_err();
        assert!(
            error.to_string().contains("more than 16384 entries"),
            "{error}"
        );
    }
}
