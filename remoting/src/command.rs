//! `RemotingCommand`: one request or response of RocketMQ's remoting protocol, and its header.
//!
//! Owns the command's fields, the flag bits, typed access to the ext fields (the request's
//! "custom header", flattened to strings) and the dispatch between the two header formats, which
//! live in the submodules `json` (serialize type 0) and `binary` (serialize type 1, ROCKETMQ).
//!
//! Never touches frames or sockets: a header arrives here as the exact slice the frame decoder
//! cut out of the frame (`crate::frame`), and leaves as bytes appended to a `BytesMut`. The body
//! is carried through untouched; what it means is for the handlers (and `crate::route`,
//! `crate::heartbeat`, `crate::lock`, `crate::message`) to say.
//!
//! Every length and count read from a header is checked against [`HeaderLimits`] and against the
//! bytes that remain before it is used.

mod binary;
mod json;

use std::collections::BTreeMap;
use std::str::FromStr;

use bytes::{Bytes, BytesMut};

/// Flag bit 0: the command is a response.
pub const FLAG_RESPONSE: i32 = 1;
/// Flag bit 1: the request is oneway and must never be answered.
pub const FLAG_ONEWAY: i32 = 2;

/// The version ShardMQ stamps on the commands it sends: RocketMQ 5.3.3's `MQVersion` ordinal.
/// Clients store the broker's version from the HEART_BEAT reply and refuse some features below
/// 232, so this must be a real, recent version.
pub const SERVER_VERSION: i32 = 479;

/// Default bound on a command header, in bytes. The largest legitimate header is a SEND whose
/// `properties` ext value is near its 32767-byte limit, plus a few dozen short fields.
pub const DEFAULT_MAX_HEADER_BYTES: usize = 64 * 1024;
/// Default bound on the number of ext fields in one header. The widest request header
/// (PULL_MESSAGE with the 5.x RPC fields) has about twenty.
pub const DEFAULT_MAX_EXT_FIELDS: usize = 128;
/// Default bound on one ext field name, in bytes. Names are Java field names.
pub const DEFAULT_MAX_EXT_KEY_BYTES: usize = 256;

/// How the header of a frame is serialized: the top byte of the frame's second word.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SerializeType {
    /// 0: a JSON object.
    Json,
    /// 1: RocketMQ's own binary layout (`ROCKETMQ`).
    RocketMq,
}

impl SerializeType {
    /// The byte that names this type on the wire.
    pub const fn code(self) -> u8 {
        match self {
            SerializeType::Json => 0,
            SerializeType::RocketMq => 1,
        }
    }

    /// The type a wire byte names, if it is a known one.
    pub const fn from_code(code: u8) -> Option<SerializeType> {
        match code {
            0 => Some(SerializeType::Json),
            1 => Some(SerializeType::RocketMq),
            _ => None,
        }
    }

    /// The name used in the JSON header's `serializeTypeCurrentRPC`.
    pub const fn name(self) -> &'static str {
        match self {
            SerializeType::Json => "JSON",
            SerializeType::RocketMq => "ROCKETMQ",
        }
    }
}

/// The sender's implementation language (RocketMQ's `LanguageCode`): a number in the binary
/// header, a name in the JSON header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum LanguageCode {
    Java = 0,
    Cpp = 1,
    Dotnet = 2,
    Python = 3,
    Delphi = 4,
    Erlang = 5,
    Ruby = 6,
    Other = 7,
    Http = 8,
    Go = 9,
    Php = 10,
    Oms = 11,
    Rust = 12,
    NodeJs = 13,
}

/// Every language, in the order of its wire number (index = number), with its wire name.
const LANGUAGES: [(LanguageCode, &str); 14] = [
    (LanguageCode::Java, "JAVA"),
    (LanguageCode::Cpp, "CPP"),
    (LanguageCode::Dotnet, "DOTNET"),
    (LanguageCode::Python, "PYTHON"),
    (LanguageCode::Delphi, "DELPHI"),
    (LanguageCode::Erlang, "ERLANG"),
    (LanguageCode::Ruby, "RUBY"),
    (LanguageCode::Other, "OTHER"),
    (LanguageCode::Http, "HTTP"),
    (LanguageCode::Go, "GO"),
    (LanguageCode::Php, "PHP"),
    (LanguageCode::Oms, "OMS"),
    (LanguageCode::Rust, "RUST"),
    (LanguageCode::NodeJs, "NODE_JS"),
];

impl LanguageCode {
    /// Every language, in wire-number order.
    pub fn all() -> impl Iterator<Item = LanguageCode> {
        LANGUAGES.iter().map(|(language, _)| *language)
    }

    /// The number used in the binary header.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// The name used in the JSON header.
    pub fn name(self) -> &'static str {
        LANGUAGES[self.code() as usize].1
    }

    /// The language a binary header's number names, if it is a known one.
    pub fn from_code(code: u8) -> Option<LanguageCode> {
        LANGUAGES.get(code as usize).map(|(language, _)| *language)
    }

    /// The language a JSON header's name names, if it is a known one.
    pub fn from_name(name: &str) -> Option<LanguageCode> {
        LANGUAGES
            .iter()
            .find(|(_, known)| *known == name)
            .map(|(language, _)| *language)
    }
}

/// Bounds on what a decoded header may hold. Built with `Default` and the `with_` methods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderLimits {
    /// Largest header accepted, in bytes.
    pub max_header_bytes: usize,
    /// Largest number of ext fields accepted.
    pub max_ext_fields: usize,
    /// Longest ext field name accepted, in bytes.
    pub max_ext_key_bytes: usize,
}

impl Default for HeaderLimits {
    fn default() -> Self {
        HeaderLimits {
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            max_ext_fields: DEFAULT_MAX_EXT_FIELDS,
            max_ext_key_bytes: DEFAULT_MAX_EXT_KEY_BYTES,
        }
    }
}

impl HeaderLimits {
    #[must_use]
    pub fn with_max_header_bytes(mut self, max_header_bytes: usize) -> Self {
        self.max_header_bytes = max_header_bytes;
        self
    }

    #[must_use]
    pub fn with_max_ext_fields(mut self, max_ext_fields: usize) -> Self {
        self.max_ext_fields = max_ext_fields;
        self
    }

    #[must_use]
    pub fn with_max_ext_key_bytes(mut self, max_ext_key_bytes: usize) -> Self {
        self.max_ext_key_bytes = max_ext_key_bytes;
        self
    }

    /// Checks one more ext field against the limits, given how many were accepted before it.
    fn check_ext_field(&self, fields_before: usize, key_bytes: usize) -> Result<(), HeaderError> {
        if fields_before >= self.max_ext_fields {
            return Err(HeaderError::TooManyExtFields {
                max_ext_fields: self.max_ext_fields,
            });
        }
        if key_bytes > self.max_ext_key_bytes {
            return Err(HeaderError::ExtKeyTooLong {
                key_bytes,
                max_ext_key_bytes: self.max_ext_key_bytes,
            });
        }
        Ok(())
    }
}

/// A header that cannot be decoded. The frame around it was consumed whole, so the connection's
/// frame boundaries are intact; the command's opaque is unknown, though.
#[derive(Debug, thiserror::Error)]
pub enum HeaderError {
    #[error("command header is {header_bytes} bytes, over max_header_bytes ({max_header_bytes})")]
    TooLarge {
        header_bytes: usize,
        max_header_bytes: usize,
    },
    #[error("JSON command header is not valid JSON: {0}")]
    Json(#[source] serde_json::Error),
    #[error("JSON command header is {found}, not an object")]
    NotAnObject { found: &'static str },
    #[error("command header has no `{field}`")]
    MissingField { field: &'static str },
    #[error("command header field `{field}` is not {expected}")]
    FieldType {
        field: &'static str,
        expected: &'static str,
    },
    #[error("ext field `{key}` has a JSON {found} value; ext values must be strings")]
    ExtValueNotString { key: String, found: &'static str },
    #[error("command header has more ext fields than max_ext_fields ({max_ext_fields})")]
    TooManyExtFields { max_ext_fields: usize },
    #[error("ext field name is {key_bytes} bytes, over max_ext_key_bytes ({max_ext_key_bytes})")]
    ExtKeyTooLong {
        key_bytes: usize,
        max_ext_key_bytes: usize,
    },
    #[error(
        "binary command header is truncated: `{field}` needs {needed_bytes} bytes, \
         {remaining_bytes} remain"
    )]
    Truncated {
        field: &'static str,
        needed_bytes: usize,
        remaining_bytes: usize,
    },
    #[error("binary command header has a negative length {length} for `{field}`")]
    NegativeLength { field: &'static str, length: i64 },
    #[error("binary command header field `{field}` is not UTF-8")]
    NotUtf8 { field: &'static str },
    #[error("binary command header has {trailing_bytes} bytes after its ext fields")]
    TrailingBytes { trailing_bytes: usize },
}

/// A command that cannot be encoded. Nothing is left in the destination buffer.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    #[error("command {field} {value} does not fit the binary header's 16 bits")]
    OutOfI16Range { field: &'static str, value: i32 },
    #[error("ext field name is {key_bytes} bytes, over the binary header's 32767")]
    ExtKeyTooLong { key_bytes: usize },
    #[error("command header `{field}` is {length_bytes} bytes, over the 2147483647 an i32 holds")]
    LengthTooLarge {
        field: &'static str,
        length_bytes: usize,
    },
    #[error("command header is {header_bytes} bytes, over the frame's 24-bit limit (16777215)")]
    HeaderTooLarge { header_bytes: usize },
    #[error("frame is {frame_bytes} bytes, over max_frame_bytes ({max_frame_bytes})")]
    FrameTooLarge {
        frame_bytes: usize,
        max_frame_bytes: usize,
    },
    #[error("JSON command header could not be written: {0}")]
    Json(#[source] serde_json::Error),
}

/// A required ext field is missing or does not parse as the type the request header gives it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExtFieldError {
    #[error("required ext field `{field}` is missing")]
    Missing { field: String },
    #[error("ext field `{field}` is {value:?}, not {expected}")]
    Unparsable {
        field: String,
        /// The value, cut to its first [`EXT_VALUE_IN_ERROR_BYTES`] bytes.
        value: String,
        expected: &'static str,
    },
}

/// How much of a bad ext value an [`ExtFieldError`] keeps, in bytes.
pub const EXT_VALUE_IN_ERROR_BYTES: usize = 64;

/// One remoting command. `body` is a slice of the frame it arrived in (no copy).
///
/// `serialize_type` is how the header was (or will be) serialized; a response made with
/// [`RemotingCommand::response_to`] inherits the request's, so clients get their answer in the
/// format they spoke.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemotingCommand {
    /// Request code, or response code in a response.
    pub code: i32,
    pub language: LanguageCode,
    pub version: i32,
    /// The request id; a response echoes its request's.
    pub opaque: i32,
    /// Bit 0 [`FLAG_RESPONSE`], bit 1 [`FLAG_ONEWAY`].
    pub flag: i32,
    /// Error text. `Some("")` is written as absent by the binary format.
    pub remark: Option<String>,
    /// The typed request/response header, flattened to strings by field name.
    pub ext_fields: BTreeMap<String, String>,
    pub body: Bytes,
    pub serialize_type: SerializeType,
}

impl RemotingCommand {
    /// A request ShardMQ sends (a broker-initiated request such as CHECK_TRANSACTION_STATE),
    /// numbered from the sender's own counter. JSON, language JAVA, [`SERVER_VERSION`].
    pub fn request(code: i32, opaque: i32) -> RemotingCommand {
        RemotingCommand {
            code,
            language: LanguageCode::Java,
            version: SERVER_VERSION,
            opaque,
            flag: 0,
            remark: None,
            ext_fields: BTreeMap::new(),
            body: Bytes::new(),
            serialize_type: SerializeType::Json,
        }
    }

    /// The response to `request` with response code `code`: echoes the opaque and the serialize
    /// type, flag = response, language JAVA (clients reject names they do not know) and
    /// [`SERVER_VERSION`].
    pub fn response_to(request: &RemotingCommand, code: i32) -> RemotingCommand {
        RemotingCommand {
            flag: FLAG_RESPONSE,
            opaque: request.opaque,
            serialize_type: request.serialize_type,
            ..RemotingCommand::request(code, request.opaque)
        }
    }

    #[must_use]
    pub fn with_remark(mut self, remark: impl Into<String>) -> Self {
        self.remark = Some(remark.into());
        self
    }

    #[must_use]
    pub fn with_ext(mut self, key: impl Into<String>, value: impl ToString) -> Self {
        self.set_ext(key, value);
        self
    }

    #[must_use]
    pub fn with_body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }

    #[must_use]
    pub fn with_serialize_type(mut self, serialize_type: SerializeType) -> Self {
        self.serialize_type = serialize_type;
        self
    }

    /// Marks the command oneway: the receiver will not answer it.
    #[must_use]
    pub fn with_oneway(mut self) -> Self {
        self.flag |= FLAG_ONEWAY;
        self
    }

    pub fn set_ext(&mut self, key: impl Into<String>, value: impl ToString) {
        self.ext_fields.insert(key.into(), value.to_string());
    }

    pub fn is_response(&self) -> bool {
        self.flag & FLAG_RESPONSE != 0
    }

    pub fn is_oneway(&self) -> bool {
        self.flag & FLAG_ONEWAY != 0
    }

    /// The ext field `field`, if present.
    pub fn ext(&self, field: &str) -> Option<&str> {
        self.ext_fields.get(field).map(String::as_str)
    }

    /// The required ext field `field`.
    pub fn ext_str(&self, field: &str) -> Result<&str, ExtFieldError> {
        self.ext(field).ok_or_else(|| ExtFieldError::Missing {
            field: field.to_owned(),
        })
    }

    /// The required ext field `field` as an `int`.
    pub fn ext_i32(&self, field: &str) -> Result<i32, ExtFieldError> {
        required(field, self.ext_opt_i32(field)?)
    }

    /// The required ext field `field` as a `long`.
    pub fn ext_i64(&self, field: &str) -> Result<i64, ExtFieldError> {
        required(field, self.ext_opt_i64(field)?)
    }

    /// The required ext field `field` as a `boolean` (`true`/`false`, any case).
    pub fn ext_bool(&self, field: &str) -> Result<bool, ExtFieldError> {
        required(field, self.ext_opt_bool(field)?)
    }

    /// The optional ext field `field` as an `int`: absent is `None`, unparsable an error.
    pub fn ext_opt_i32(&self, field: &str) -> Result<Option<i32>, ExtFieldError> {
        self.ext_parsed(field, "a 32-bit integer")
    }

    /// The optional ext field `field` as a `long`: absent is `None`, unparsable an error.
    pub fn ext_opt_i64(&self, field: &str) -> Result<Option<i64>, ExtFieldError> {
        self.ext_parsed(field, "a 64-bit integer")
    }

    /// The optional ext field `field` as a `boolean`: absent is `None`, unparsable an error.
    pub fn ext_opt_bool(&self, field: &str) -> Result<Option<bool>, ExtFieldError> {
        let Some(value) = self.ext(field) else {
            return Ok(None);
        };
        if value.eq_ignore_ascii_case("true") {
            Ok(Some(true))
        } else if value.eq_ignore_ascii_case("false") {
            Ok(Some(false))
        } else {
            Err(unparsable(field, value, "a boolean"))
        }
    }

    fn ext_parsed<T: FromStr>(
        &self,
        field: &str,
        expected: &'static str,
    ) -> Result<Option<T>, ExtFieldError> {
        let Some(value) = self.ext(field) else {
            return Ok(None);
        };
        value
            .parse()
            .map(Some)
            .map_err(|_| unparsable(field, value, expected))
    }

    /// Appends the header in `self.serialize_type` to `dst`. On error `dst` is left as it was.
    pub fn encode_header(&self, dst: &mut BytesMut) -> Result<(), EncodeError> {
        let start = dst.len();
        let result = match self.serialize_type {
            SerializeType::Json => json::encode(self, dst),
            SerializeType::RocketMq => binary::encode(self, dst),
        };
        if result.is_err() {
            dst.truncate(start);
        }
        result
    }

    /// Decodes a header of `serialize_type` that fills `header` exactly. The body is left empty.
    pub fn decode_header(
        serialize_type: SerializeType,
        header: &[u8],
        limits: &HeaderLimits,
    ) -> Result<RemotingCommand, HeaderError> {
        if header.len() > limits.max_header_bytes {
            return Err(HeaderError::TooLarge {
                header_bytes: header.len(),
                max_header_bytes: limits.max_header_bytes,
            });
        }
        let command = match serialize_type {
            SerializeType::Json => json::decode(header, limits)?,
            SerializeType::RocketMq => binary::decode(header, limits)?,
        };
        debug_assert!(command.ext_fields.len() <= limits.max_ext_fields);
        Ok(command)
    }
}

fn required<T>(field: &str, value: Option<T>) -> Result<T, ExtFieldError> {
    value.ok_or_else(|| ExtFieldError::Missing {
        field: field.to_owned(),
    })
}

fn unparsable(field: &str, value: &str, expected: &'static str) -> ExtFieldError {
    let mut end = value.len().min(EXT_VALUE_IN_ERROR_BYTES);
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    ExtFieldError::Unparsable {
        field: field.to_owned(),
        value: value[..end].to_owned(),
        expected,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> RemotingCommand {
        RemotingCommand {
            code: 11,
            language: LanguageCode::Rust,
            version: 474,
            opaque: -7,
            flag: 0,
            remark: None,
            ext_fields: BTreeMap::new(),
            body: Bytes::new(),
            serialize_type: SerializeType::RocketMq,
        }
    }

    #[test]
    fn languages_round_trip_by_code_and_name() {
        for (number, language) in LanguageCode::all().enumerate() {
            assert_eq!(language.code() as usize, number);
            assert_eq!(LanguageCode::from_code(language.code()), Some(language));
            assert_eq!(LanguageCode::from_name(language.name()), Some(language));
        }
        assert_eq!(LanguageCode::Rust.code(), 12);
        assert_eq!(LanguageCode::NodeJs.name(), "NODE_JS");
        assert_eq!(LanguageCode::from_code(14), None);
        assert_eq!(LanguageCode::from_name("KOTLIN"), None);
    }

    #[test]
    fn response_echoes_opaque_and_serialize_type() {
        let response = RemotingCommand::response_to(&request(), 0);
        assert_eq!(response.opaque, -7);
        assert_eq!(response.flag, FLAG_RESPONSE);
        assert!(response.is_response());
        assert!(!response.is_oneway());
        assert_eq!(response.language, LanguageCode::Java);
        assert_eq!(response.version, SERVER_VERSION);
        assert_eq!(response.serialize_type, SerializeType::RocketMq);
    }

    #[test]
    fn oneway_flag() {
        let command = RemotingCommand::request(15, 3).with_oneway();
        assert!(command.is_oneway());
        assert!(!command.is_response());
    }

    #[test]
    fn typed_ext_getters() {
        let command = request()
            .with_ext("queueId", 3)
            .with_ext("queueOffset", -9_000_000_000_i64)
            .with_ext("committed", "TRUE")
            .with_ext("topic", "T");
        assert_eq!(command.ext_str("topic"), Ok("T"));
        assert_eq!(command.ext_i32("queueId"), Ok(3));
        assert_eq!(command.ext_i64("queueOffset"), Ok(-9_000_000_000));
        assert_eq!(command.ext_bool("committed"), Ok(true));
        assert_eq!(command.ext_opt_i32("maxMsgBytes"), Ok(None));
        assert_eq!(command.ext("missing"), None);
    }

    #[test]
    fn ext_getter_errors_name_the_field() {
        let command = request()
            .with_ext("queueId", "x".repeat(100))
            .with_ext("queueOffset", "9223372036854775808")
            .with_ext("committed", "yes");
        let missing = command.ext_i32("consumerGroup").unwrap_err();
        assert_eq!(
            missing.to_string(),
            "required ext field `consumerGroup` is missing"
        );
        match command.ext_i32("queueId").unwrap_err() {
            ExtFieldError::Unparsable {
                field,
                value,
                expected,
            } => {
                assert_eq!(field, "queueId");
                assert_eq!(value.len(), EXT_VALUE_IN_ERROR_BYTES);
                assert_eq!(expected, "a 32-bit integer");
            }
            other => panic!("unexpected {other:?}"),
        }
        let overflow = command.ext_i64("queueOffset").unwrap_err();
        assert!(overflow.to_string().contains("`queueOffset`"), "{overflow}");
        let not_bool = command.ext_bool("committed").unwrap_err();
        assert!(not_bool.to_string().contains("not a boolean"), "{not_bool}");
        assert!(command.ext_str("absent").is_err());
    }

    #[test]
    fn error_value_is_cut_on_a_char_boundary() {
        let command = request().with_ext("queueId", "é".repeat(40));
        match command.ext_i32("queueId").unwrap_err() {
            ExtFieldError::Unparsable { value, .. } => {
                assert!(value.len() <= EXT_VALUE_IN_ERROR_BYTES);
                assert!(value.chars().all(|c| c == 'é'));
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn header_over_the_limit_is_refused_before_parsing() {
        let limits = HeaderLimits::default().with_max_header_bytes(8);
        let error = RemotingCommand::decode_header(SerializeType::Json, b"{\"code\":0}", &limits)
            .unwrap_err();
        assert!(matches!(
            error,
            HeaderError::TooLarge {
                header_bytes: 10,
                max_header_bytes: 8
            }
        ));
        assert_eq!(
            error.to_string(),
            "command header is 10 bytes, over max_header_bytes (8)"
        );
    }

    #[test]
    fn failed_encode_leaves_the_buffer_unchanged() {
        let mut dst = BytesMut::from(&b"keep"[..]);
        let mut command = request();
        command.code = 40_000;
        assert!(matches!(
            command.encode_header(&mut dst),
            Err(EncodeError::OutOfI16Range { field: "code", .. })
        ));
        assert_eq!(&dst[..], b"keep");
    }
}
