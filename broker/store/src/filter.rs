//! Tag filtering by subscription expression: `*` (everything) or `TagA || TagB`.
//!
//! Owns parsing the expression and matching a ConsumeQueue tags hash against it. The hash test
//! is what the broker can do without reading records; clients confirm by exact tag match, since
//! different tags can share a hash.

use super::record::tags_hash;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TagFilter {
    All,
    Tags { tags: Vec<String>, hashes: Vec<u64> },
}

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

    pub fn matches_hash(&self, hash: u64) -> bool {
        match self {
            TagFilter::All => true,
            TagFilter::Tags { hashes, .. } => hashes.contains(&hash),
        }
    }

    pub fn matches_tag(&self, tag: Option<&str>) -> bool {
        match self {
            TagFilter::All => true,
            TagFilter::Tags { tags, .. } => tag.is_some_and(|t| tags.iter().any(|x| x == t)),
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
}
