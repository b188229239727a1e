//! A pull's filter: a tag expression, `*` (everything) or `TagA || TagB`, or a SQL92
//! expression over the message's properties (docs/sql-filter.md).
//!
//! Owns parsing the tag expression and matching a ConsumeQueue tags hash against it. The hash
//! test is what the broker can do without reading records; clients confirm by exact tag match,
//! since different tags can share a hash. A SQL92 expression cannot be told from the hash: each
//! record is read and its properties decide ([`TagFilter::matches_record`]).

use std::sync::Arc;

use super::record::{tags_hash, RecordView};

#[derive(Debug, Clone)]
pub enum TagFilter {
    All,
    Tags {
        tags: Vec<String>,
        hashes: Vec<u64>,
    },
    /// A compiled SQL92 expression (compiled once per subscription by the caller).
    Sql(Arc<shardmq_filter::Expression>),
}

impl PartialEq for TagFilter {
    fn eq(&self, other: &TagFilter) -> bool {
        match (self, other) {
            (TagFilter::All, TagFilter::All) => true,
            (TagFilter::Tags { tags: a, .. }, TagFilter::Tags { tags: b, .. }) => a == b,
            (TagFilter::Sql(a), TagFilter::Sql(b)) => a.source() == b.source(),
            _ => false,
        }
    }
}

impl Eq for TagFilter {}

impl TagFilter {
    /// Parses an expression; empty and `*` mean everything.
    pub fn parse(expression: &str) -> TagFilter {
        let trimmed = expression.trim();
        if trimmed.is_empty() || trimmed == "*" {
            return TagFilter::All;
        }
        let tags: Vec<String> = trimmed
            .split("||")
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_owned)
            .collect();
        if tags.is_empty() {
            return TagFilter::All;
        }
        let hashes = tags.iter().map(|t| tags_hash(t)).collect();
        TagFilter::Tags { tags, hashes }
    }

    /// Whether a ConsumeQueue entry with tags hash `hash` may match (a SQL92 expression: any).
    pub fn matches_hash(&self, hash: u64) -> bool {
        match self {
            TagFilter::All | TagFilter::Sql(_) => true,
            TagFilter::Tags { hashes, .. } => hashes.contains(&hash),
        }
    }

    pub fn matches_tag(&self, tag: Option<&str>) -> bool {
        match self {
            TagFilter::All | TagFilter::Sql(_) => true,
            TagFilter::Tags { tags, .. } => tag.is_some_and(|t| tags.iter().any(|x| x == t)),
        }
    }

    /// Whether the filter reads records, not only their ConsumeQueue entries.
    pub fn reads_records(&self) -> bool {
        matches!(self, TagFilter::Sql(_))
    }

    /// Whether the stored `record` matches: for a SQL92 expression, evaluated over the
    /// record's properties (TAGS among them); the other filters decided by the hash already. A
    /// record whose properties cannot be read matches, so that the consumer's end-to-end check
    /// reports it rather than the filter hiding it.
    pub fn matches_record(&self, record: &[u8]) -> bool {
        let TagFilter::Sql(expression) = self else {
            return true;
        };
        match RecordView::parse_unchecked(record) {
            Ok(view) => expression.matches(|name| view.property(name)),
            Err(_) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_expressions() {
        assert_eq!(TagFilter::parse("*"), TagFilter::All);
        assert_eq!(TagFilter::parse(" "), TagFilter::All);
        let filter = TagFilter::parse("TagA || TagB");
        assert!(filter.matches_hash(tags_hash("TagA")));
        assert!(filter.matches_hash(tags_hash("TagB")));
        assert!(!filter.matches_hash(tags_hash("TagC")));
        assert!(filter.matches_tag(Some("TagB")));
        assert!(!filter.matches_tag(None));
    }

    #[test]
    fn a_sql_filter_reads_the_record_s_properties() {
        use crate::record::{encode_record, RecordInput};
        let record = |properties: &[(&str, &str)]| {
            let mut buf = bytes::BytesMut::new();
            let input = RecordInput {
                topic: "T",
                queue_id: 0,
                flag: 0,
                body: b"body",
                properties,
                sys_flag: 0,
                born_timestamp_ms: 1_700_000_000_000,
                born_host: "127.0.0.1:5555".parse().unwrap(),
                store_host: "127.0.0.1:10911".parse().unwrap(),
                reconsume_times: 0,
                prepared_transaction_offset: 0,
            };
            encode_record(&mut buf, &input).unwrap();
            buf.freeze()
        };
        let filter = TagFilter::Sql(Arc::new(
            shardmq_filter::Expression::compile("a BETWEEN 0 AND 3 AND TAGS = 'x'").unwrap(),
        ));
        assert!(filter.reads_records());
        assert!(filter.matches_hash(tags_hash("anything")));
        assert!(filter.matches_record(&record(&[("a", "2"), ("TAGS", "x")])));
        assert!(!filter.matches_record(&record(&[("a", "7"), ("TAGS", "x")])));
        assert!(
            !filter.matches_record(&record(&[("TAGS", "x")])),
            "a missing property"
        );
        assert!(
            filter.matches_record(b"not a record"),
            "left to the client's check"
        );
        assert!(!TagFilter::All.reads_records());
        assert!(TagFilter::All.matches_record(b"anything"));
    }
}
