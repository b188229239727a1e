//! What the JSON bodies (`route`, `heartbeat`, `lock`) share: the size bound on a body, the
//! error type, and serde helpers that bound every list and map while it is being read and read
//! JSON `null` as empty.
//!
//! Owns no format of its own. Never sees frames or headers: a body arrives as the slice the
//! frame decoder cut, and leaves as a typed value (or the other way round).
//!
//! Why the lists are bounded during deserialization rather than after: a 4 MiB body of `{},`
//! would otherwise become a million-element vector before any check could run.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use bytes::Bytes;
use serde::de::{DeserializeOwned, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

/// Largest JSON body accepted, in bytes. Route, heartbeat and lock bodies are a few KiB; a
/// heartbeat from a client with hundreds of groups is still far below this.
pub const MAX_JSON_BODY_BYTES: usize = 4 * 1024 * 1024;

/// A JSON body that cannot be decoded or encoded. `body` names which (e.g. "HEART_BEAT body").
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("{body} is {body_bytes} bytes, over max_json_body_bytes ({max_json_body_bytes})")]
    TooLarge {
        body: &'static str,
        body_bytes: usize,
        max_json_body_bytes: usize,
    },
    #[error("{body} is not valid: {source}")]
    Invalid {
        body: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("{body} could not be written: {source}")]
    Encode {
        body: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

pub(crate) fn decode<T: DeserializeOwned>(
    body: &'static str,
    bytes: &[u8],
) -> Result<T, BodyError> {
    if bytes.len() > MAX_JSON_BODY_BYTES {
        return Err(BodyError::TooLarge {
            body,
            body_bytes: bytes.len(),
            max_json_body_bytes: MAX_JSON_BODY_BYTES,
        });
    }
    serde_json::from_slice(bytes).map_err(|source| BodyError::Invalid { body, source })
}

pub(crate) fn encode<T: Serialize>(body: &'static str, value: &T) -> Result<Bytes, BodyError> {
    serde_json::to_vec(value)
        .map(Bytes::from)
        .map_err(|source| BodyError::Encode { body, source })
}

/// Reads a JSON array (or `null`, as empty) of at most `max_entries` entries; `field` names the
/// list in the error.
pub(crate) fn bounded_list<'de, D, T>(
    deserializer: D,
    field: &'static str,
    max_entries: usize,
) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct ListVisitor<T> {
        field: &'static str,
        max_entries: usize,
        entries: PhantomData<T>,
    }

    impl<'de, T: Deserialize<'de>> Visitor<'de> for ListVisitor<T> {
        type Value = Vec<T>;

        fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
            write!(formatter, "`{}` as an array or null", self.field)
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<Vec<T>, E> {
            Ok(Vec::new())
        }

        fn visit_none<E: serde::de::Error>(self) -> Result<Vec<T>, E> {
            Ok(Vec::new())
        }

        fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Vec<T>, D::Error> {
            deserializer.deserialize_seq(self)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let mut entries = Vec::new();
            while let Some(entry) = seq.next_element()? {
                if entries.len() == self.max_entries {
                    return Err(A::Error::custom(too_many(self.field, self.max_entries)));
                }
                entries.push(entry);
            }
            Ok(entries)
        }
    }

    deserializer.deserialize_option(ListVisitor {
        field,
        max_entries,
        entries: PhantomData,
    })
}

/// Reads a JSON object (or `null`, as empty) of at most `max_entries` entries into a map;
/// `field` names the map in the error.
pub(crate) fn bounded_map<'de, D, K, V>(
    deserializer: D,
    field: &'static str,
    max_entries: usize,
) -> Result<BTreeMap<K, V>, D::Error>
where
    D: Deserializer<'de>,
    K: Deserialize<'de> + Ord,
    V: Deserialize<'de>,
{
    struct MapVisitor<K, V> {
        field: &'static str,
        max_entries: usize,
        entries: PhantomData<(K, V)>,
    }

    impl<'de, K: Deserialize<'de> + Ord, V: Deserialize<'de>> Visitor<'de> for MapVisitor<K, V> {
        type Value = BTreeMap<K, V>;

        fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
            write!(formatter, "`{}` as an object or null", self.field)
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<BTreeMap<K, V>, E> {
            Ok(BTreeMap::new())
        }

        fn visit_none<E: serde::de::Error>(self) -> Result<BTreeMap<K, V>, E> {
            Ok(BTreeMap::new())
        }

        fn visit_some<D: Deserializer<'de>>(
            self,
            deserializer: D,
        ) -> Result<BTreeMap<K, V>, D::Error> {
            deserializer.deserialize_map(self)
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<BTreeMap<K, V>, A::Error> {
            let mut entries = BTreeMap::new();
            while let Some((key, value)) = map.next_entry()? {
                if entries.len() == self.max_entries {
                    return Err(A::Error::custom(too_many(self.field, self.max_entries)));
                }
                entries.insert(key, value);
            }
            Ok(entries)
        }
    }

    deserializer.deserialize_option(MapVisitor {
        field,
        max_entries,
        entries: PhantomData,
    })
}

fn too_many(field: &str, max_entries: usize) -> String {
    format!("`{field}` has more than {max_entries} entries, the limit")
}

/// Reads `null` as the type's default (Java omits nulls, the Rust client writes them).
pub(crate) fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    struct Sample {
        #[serde(default, deserialize_with = "three_numbers")]
        numbers: Vec<i32>,
        #[serde(default, deserialize_with = "two_names")]
        names: BTreeMap<i64, String>,
        #[serde(default, deserialize_with = "null_as_default")]
        text: String,
    }

    fn three_numbers<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<i32>, D::Error> {
        bounded_list(deserializer, "numbers", 3)
    }

    fn two_names<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<BTreeMap<i64, String>, D::Error> {
        bounded_map(deserializer, "names", 2)
    }

    #[test]
    fn lists_and_maps_are_bounded_and_null_is_empty() {
        let sample: Sample = decode(
            "sample",
            br#"{"numbers":[1,2,3],"names":{"0":"a","1":"b"}}"#,
        )
        .expect("decodes");
        assert_eq!(sample.numbers, [1, 2, 3]);
        assert_eq!(sample.names.get(&1).map(String::as_str), Some("b"));

        let sample: Sample =
            decode("sample", br#"{"numbers":null,"names":null,"text":null}"#).expect("decodes");
        assert!(sample.numbers.is_empty() && sample.names.is_empty() && sample.text.is_empty());

        let error = decode::<Sample>("sample", br#"{"numbers":[1,2,3,4]}"#).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("`numbers` has more than 3 entries"),
            "{error}"
        );
        let error =
            decode::<Sample>("sample", br#"{"names":{"0":"a","1":"b","2":"c"}}"#).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("`names` has more than 2 entries"),
            "{error}"
        );
        let error = decode::<Sample>("sample", br#"{"numbers":{}}"#).unwrap_err();
        assert!(
            error.to_string().starts_with("sample is not valid"),
            "{error}"
        );
    }

    #[test]
    fn oversized_body_is_refused_before_parsing() {
        let body = vec![b' '; MAX_JSON_BODY_BYTES + 1];
        let error = decode::<Sample>("HEART_BEAT body", &body).unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "HEART_BEAT body is {} bytes, over max_json_body_bytes ({MAX_JSON_BODY_BYTES})",
                MAX_JSON_BODY_BYTES + 1
            )
        );
    }
}
