//! Subscription expressions: a tag expression, `*` (every message) or `TagA || TagB`, or a
//! SQL92 expression over message properties (docs/sql-filter.md).
//!
//! Owns: parsing an expression and the exact tag match the client applies after the broker's
//! filter. The broker filters by tag hash only (different tags may share a hash), so a consumer
//! confirms each message's tag itself (as RocketMQ's client does). A SQL92 expression is
//! compiled here only to refuse a malformed one at subscribe time; the broker evaluates it.
//! Never: sending anything.

use crate::error::{Error, Result};

/// A parsed subscription expression: tags (the default) or SQL92.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagExpression {
    text: String,
    /// `None` for every message (or a SQL92 expression); else the tags accepted.
    tags: Option<Vec<String>>,
    /// `text` is a SQL92 expression.
    is_sql: bool,
}

impl TagExpression {
    /// Parses `*`, an empty expression (both: every message) or `TagA || TagB`.
    pub fn parse(expression: &str) -> Result<Self> {
        if expression.contains(['\u{1}', '\u{2}']) {
            return Err(Error::InvalidArgument(format!(
                "tag expression `{}` contains control characters",
                expression.escape_debug()
            )));
        }
        let trimmed = expression.trim();
        if trimmed.is_empty() || trimmed == "*" {
            return Ok(Self::all());
        }
        let tags: Vec<String> = trimmed
            .split("||")
            .map(str::trim)
            .filter(|tag| !tag.is_empty())
            .map(str::to_owned)
            .collect();
        if tags.is_empty() {
            // Separators and no tag (`||`): a mistake, not a wish for every message.
            return Err(Error::InvalidArgument(format!(
                "tag expression `{}` names no tag (use `*` for every message)",
                expression.escape_debug()
            )));
        }
        Ok(Self {
            text: tags.join(" || "),
            tags: Some(tags),
            is_sql: false,
        })
    }

    /// A SQL92 expression over message properties (`TAGS` among them), for example
    /// `region = 'eu' AND price > 10`; refused with the error's position when it does not
    /// compile. Served only by brokers run with `enable_property_filter`.
    pub fn sql(expression: &str) -> Result<Self> {
        shardmq_filter::Expression::compile(expression).map_err(|error| {
            Error::InvalidArgument(format!(
                "SQL92 expression `{}`: {error}",
                expression.escape_debug()
            ))
        })?;
        Ok(Self {
            text: expression.to_owned(),
            tags: None,
            is_sql: true,
        })
    }

    /// Whether this is a SQL92 expression.
    #[must_use]
    pub fn is_sql(&self) -> bool {
        self.is_sql
    }

    /// The expression type as the wire names it: `TAG` or `SQL92`.
    #[must_use]
    pub fn expression_type(&self) -> &'static str {
        if self.is_sql {
            "SQL92"
        } else {
            "TAG"
        }
    }

    /// The expression that accepts every message.
    #[must_use]
    pub fn all() -> Self {
        Self {
            text: "*".to_owned(),
            tags: None,
            is_sql: false,
        }
    }

    /// The expression as sent to the broker.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether every message is wanted (no tag needs looking at, no SQL92 filter).
    #[must_use]
    pub fn is_all(&self) -> bool {
        self.tags.is_none() && !self.is_sql
    }

    /// Whether a message with `tag` is wanted (a SQL92 expression: the broker decided).
    #[must_use]
    pub fn matches(&self, tag: Option<&str>) -> bool {
        match &self.tags {
            None => true,
            Some(tags) => tag.is_some_and(|tag| tags.iter().any(|wanted| wanted == tag)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_matches_exactly() {
        let all = TagExpression::parse(" * ").unwrap();
        assert!(all.matches(None));
        assert!(all.matches(Some("x")));
        assert!(all.is_all());
        let some = TagExpression::parse("TagA||TagB ||  ").unwrap();
        assert_eq!(some.as_str(), "TagA || TagB");
        assert!(!some.is_all());
        assert!(some.matches(Some("TagA")));
        assert!(some.matches(Some("TagB")));
        assert!(!some.matches(Some("TagC")));
        assert!(!some.matches(Some("taga")));
        assert!(!some.matches(None));
        assert!(TagExpression::parse("a\u{1}").is_err());
        assert_eq!(TagExpression::parse("").unwrap(), TagExpression::all());
        assert!(TagExpression::parse("||").is_err(), "separators only");
        assert!(TagExpression::parse(" || || ").is_err(), "separators only");
    }

    #[test]
    fn sql_expressions_compile_at_subscribe_time() {
        let sql = TagExpression::sql("a BETWEEN 0 AND 3").unwrap();
        assert!(sql.is_sql() && !sql.is_all());
        assert_eq!(sql.expression_type(), "SQL92");
        assert_eq!(sql.as_str(), "a BETWEEN 0 AND 3");
        assert!(sql.matches(None), "the broker filtered already");
        assert_eq!(TagExpression::all().expression_type(), "TAG");
        let error = TagExpression::sql("a > ").unwrap_err().to_string();
        assert!(error.contains("position"), "{error}");
    }
}
