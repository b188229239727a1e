//! The JSON command header (serialize type 0).
//!
//! Owns the mapping between a `RemotingCommand` and the JSON object
//! `{code, language, version, opaque, flag, remark?, extFields?, serializeTypeCurrentRPC}`.
//! Never sees the frame around the header or the body.
//!
//! Writing: the keys in the order `rocketmq-client-rust` writes them; `remark` and `extFields`
//! are left out when there is nothing to say (as Java does with nulls), while the six keys that
//! client requires in every response are always present. Reading: the five numeric/enum keys are
//! required, `remark`/`extFields` may be absent or null, unknown keys are ignored, every ext
//! value must be a JSON string, and the ext fields are counted and measured against
//! [`HeaderLimits`] as they are taken. The header was bounded by `max_header_bytes` before it got
//! here, which bounds what the JSON parser can allocate.

use std::collections::BTreeMap;

use bytes::{BufMut, BytesMut};
use serde::Serialize;
use serde_json::{Map, Value};

use super::{EncodeError, HeaderError, HeaderLimits, LanguageCode, RemotingCommand, SerializeType};

/// The header as written, borrowing everything from the command.
#[derive(Serialize)]
struct JsonHeader<'a> {
    code: i32,
    language: &'static str,
    version: i32,
    opaque: i32,
    flag: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    remark: Option<&'a str>,
    #[serde(rename = "extFields", skip_serializing_if = "is_empty")]
    ext_fields: &'a BTreeMap<String, String>,
    #[serde(rename = "serializeTypeCurrentRPC")]
    serialize_type_current_rpc: &'static str,
}

fn is_empty(ext_fields: &&BTreeMap<String, String>) -> bool {
    ext_fields.is_empty()
}

pub(super) fn encode(command: &RemotingCommand, dst: &mut BytesMut) -> Result<(), EncodeError> {
    let header = JsonHeader {
        code: command.code,
        language: command.language.name(),
        version: command.version,
        opaque: command.opaque,
        flag: command.flag,
        remark: command.remark.as_deref(),
        ext_fields: &command.ext_fields,
        serialize_type_current_rpc: SerializeType::Json.name(),
    };
    serde_json::to_writer(dst.writer(), &header).map_err(EncodeError::Json)
}

pub(super) fn decode(header: &[u8], limits: &HeaderLimits) -> Result<RemotingCommand, HeaderError> {
    let value: Value = serde_json::from_slice(header).map_err(HeaderError::Json)?;
    let mut object = match value {
        Value::Object(object) => object,
        other => {
            return Err(HeaderError::NotAnObject {
                found: kind(&other),
            })
        }
    };
    Ok(RemotingCommand {
        code: take_i32(&object, "code")?,
        language: take_language(&object)?,
        version: take_i32(&object, "version")?,
        opaque: take_i32(&object, "opaque")?,
        flag: take_i32(&object, "flag")?,
        remark: take_remark(&mut object)?,
        ext_fields: take_ext_fields(&mut object, limits)?,
        body: bytes::Bytes::new(),
        serialize_type: SerializeType::Json,
    })
}

fn take_i32(object: &Map<String, Value>, field: &'static str) -> Result<i32, HeaderError> {
    let value = match object.get(field) {
        None | Some(Value::Null) => return Err(HeaderError::MissingField { field }),
        Some(value) => value,
    };
    value
        .as_i64()
        .and_then(|wide| i32::try_from(wide).ok())
        .ok_or(HeaderError::FieldType {
            field,
            expected: "a 32-bit integer",
        })
}

/// A language name this crate does not know (a newer client's) is read as OTHER: the language
/// is informational, and refusing the request would be worse than not knowing its name.
fn take_language(object: &Map<String, Value>) -> Result<LanguageCode, HeaderError> {
    match object.get("language") {
        None | Some(Value::Null) => Err(HeaderError::MissingField { field: "language" }),
        Some(Value::String(name)) => {
            Ok(LanguageCode::from_name(name).unwrap_or(LanguageCode::Other))
        }
        Some(_) => Err(HeaderError::FieldType {
            field: "language",
            expected: "a language name",
        }),
    }
}

fn take_remark(object: &mut Map<String, Value>) -> Result<Option<String>, HeaderError> {
    match object.remove("remark") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(remark)) => Ok(Some(remark)),
        Some(_) => Err(HeaderError::FieldType {
            field: "remark",
            expected: "a string or null",
        }),
    }
}

fn take_ext_fields(
    object: &mut Map<String, Value>,
    limits: &HeaderLimits,
) -> Result<BTreeMap<String, String>, HeaderError> {
    let entries = match object.remove("extFields") {
        None | Some(Value::Null) => return Ok(BTreeMap::new()),
        Some(Value::Object(entries)) => entries,
        Some(_) => {
            return Err(HeaderError::FieldType {
                field: "extFields",
                expected: "an object or null",
            })
        }
    };
    let mut ext_fields = BTreeMap::new();
    for (key, value) in entries {
        limits.check_ext_field(ext_fields.len(), key.len())?;
        match value {
            Value::String(value) => {
                ext_fields.insert(key, value);
            }
            other => {
                return Err(HeaderError::ExtValueNotString {
                    key,
                    found: kind(&other),
                })
            }
        }
    }
    Ok(ext_fields)
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{FLAG_RESPONSE, SERVER_VERSION};

    fn decode_text(text: &str) -> Result<RemotingCommand, HeaderError> {
        decode(text.as_bytes(), &HeaderLimits::default())
    }

    fn encode_value(command: &RemotingCommand) -> Map<String, Value> {
        let mut dst = BytesMut::new();
        encode(command, &mut dst).expect("encodes");
        match serde_json::from_slice(&dst).expect("valid JSON") {
            Value::Object(object) => object,
            other => panic!("not an object: {other}"),
        }
    }

    /// `rocketmq-client-rust` 1.0.0 fails to decode a response that lacks any of these six keys
    /// (reference §1.4): there are no defaults in either of its parsers.
    #[test]
    fn every_response_carries_the_six_keys_the_rust_client_requires() {
        let request = RemotingCommand {
            code: 34,
            language: LanguageCode::Rust,
            version: 474,
            opaque: 41,
            flag: 0,
            remark: None,
            ext_fields: BTreeMap::new(),
            body: bytes::Bytes::new(),
            serialize_type: SerializeType::Json,
        };
        let bare = RemotingCommand::response_to(&request, 0);
        let full = RemotingCommand::response_to(&request, 1)
            .with_remark("broken")
            .with_ext("offset", 5);
        for response in [bare, full] {
            let object = encode_value(&response);
            for key in [
                "code",
                "language",
                "version",
                "opaque",
                "flag",
                "serializeTypeCurrentRPC",
            ] {
                assert!(
                    object.contains_key(key),
                    "response lacks `{key}`: {object:?}"
                );
            }
            assert_eq!(object["language"], "JAVA");
            assert_eq!(object["version"], SERVER_VERSION);
            assert_eq!(object["opaque"], 41);
            assert_eq!(object["flag"], FLAG_RESPONSE);
            assert_eq!(object["serializeTypeCurrentRPC"], "JSON");
        }
    }

    #[test]
    fn keys_are_written_in_the_rust_clients_order() {
        let command = RemotingCommand::request(105, 1)
            .with_remark("r")
            .with_ext("topic", "T")
            .with_ext("acceptStandardJsonOnly", true);
        let mut dst = BytesMut::new();
        encode(&command, &mut dst).expect("encodes");
        assert_eq!(
            std::str::from_utf8(&dst).expect("UTF-8"),
            "{\"code\":105,\"language\":\"JAVA\",\"version\":479,\"opaque\":1,\"flag\":0,\
             \"remark\":\"r\",\"extFields\":{\"acceptStandardJsonOnly\":\"true\",\"topic\":\"T\"},\
             \"serializeTypeCurrentRPC\":\"JSON\"}"
        );
    }

    #[test]
    fn decodes_a_rust_client_request_with_nulls() {
        let command = decode_text(
            r#"{"code":105,"language":"RUST","version":474,"opaque":-3,"flag":0,
                "remark":null,"extFields":null,"serializeTypeCurrentRPC":"JSON"}"#,
        )
        .expect("decodes");
        assert_eq!(command.code, 105);
        assert_eq!(command.language, LanguageCode::Rust);
        assert_eq!(command.version, 474);
        assert_eq!(command.opaque, -3);
        assert_eq!(command.remark, None);
        assert!(command.ext_fields.is_empty());
    }

    #[test]
    fn decodes_a_java_request_with_absent_keys_and_unknown_ones() {
        let command = decode_text(
            r#"{"code":10,"extFields":{"a":"PG","b":"T"},"flag":0,"language":"JAVA",
                "opaque":7,"serializeTypeCurrentRPC":"JSON","version":401,"future":[1,2]}"#,
        )
        .expect("decodes");
        assert_eq!(command.ext("a"), Some("PG"));
        assert_eq!(command.ext("b"), Some("T"));
        assert_eq!(command.remark, None);
    }

    #[test]
    fn unknown_language_name_reads_as_other() {
        let command =
            decode_text(r#"{"code":1,"language":"KOTLIN","version":1,"opaque":1,"flag":0}"#)
                .expect("decodes");
        assert_eq!(command.language, LanguageCode::Other);
    }

    #[test]
    fn header_that_is_not_an_object_is_refused() {
        for (text, found) in [("[1,2]", "array"), ("\"x\"", "string"), ("42", "number")] {
            let error = decode_text(text).unwrap_err();
            assert!(
                matches!(error, HeaderError::NotAnObject { found: f } if f == found),
                "{text}: {error:?}"
            );
        }
        assert!(matches!(
            decode_text("{\"code\":"),
            Err(HeaderError::Json(_))
        ));
        assert!(matches!(decode_text(""), Err(HeaderError::Json(_))));
    }

    #[test]
    fn non_string_ext_value_is_refused_naming_the_key() {
        let error = decode_text(
            r#"{"code":11,"language":"RUST","version":474,"opaque":1,"flag":0,
                "extFields":{"topic":"T","queueId":3}}"#,
        )
        .unwrap_err();
        assert!(matches!(
            &error,
            HeaderError::ExtValueNotString { key, found: "number" } if key == "queueId"
        ));
        assert_eq!(
            error.to_string(),
            "ext field `queueId` has a JSON number value; ext values must be strings"
        );
    }

    #[test]
    fn missing_and_mistyped_fields_are_named() {
        let missing = decode_text(r#"{"code":1,"language":"JAVA","version":1,"flag":0}"#);
        assert!(matches!(
            missing,
            Err(HeaderError::MissingField { field: "opaque" })
        ));
        let too_wide =
            decode_text(r#"{"code":1,"language":"JAVA","version":1,"opaque":4294967296,"flag":0}"#);
        assert!(matches!(
            too_wide,
            Err(HeaderError::FieldType {
                field: "opaque",
                ..
            })
        ));
        let bad_remark = decode_text(
            r#"{"code":1,"language":"JAVA","version":1,"opaque":1,"flag":0,"remark":5}"#,
        );
        assert!(matches!(
            bad_remark,
            Err(HeaderError::FieldType {
                field: "remark",
                ..
            })
        ));
        let bad_ext = decode_text(
            r#"{"code":1,"language":"JAVA","version":1,"opaque":1,"flag":0,"extFields":[]}"#,
        );
        assert!(matches!(
            bad_ext,
            Err(HeaderError::FieldType {
                field: "extFields",
                ..
            })
        ));
    }

    #[test]
    fn huge_ext_fields_are_refused() {
        let many: Vec<String> = (0..200).map(|i| format!("\"k{i}\":\"v\"")).collect();
        let text = format!(
            r#"{{"code":1,"language":"JAVA","version":1,"opaque":1,"flag":0,"extFields":{{{}}}}}"#,
            many.join(",")
        );
        assert!(matches!(
            decode_text(&text),
            Err(HeaderError::TooManyExtFields {
                max_ext_fields: 128
            })
        ));
        let long_key = format!(
            r#"{{"code":1,"language":"JAVA","version":1,"opaque":1,"flag":0,
                "extFields":{{"{}":"v"}}}}"#,
            "k".repeat(300)
        );
        assert!(matches!(
            decode_text(&long_key),
            Err(HeaderError::ExtKeyTooLong {
                key_bytes: 300,
                max_ext_key_bytes: 256
            })
        ));
    }
}
