//! Tag expressions: `*` (every message) or `TagA || TagB`.
//!
//! Owns: parsing an expression and the exact tag match the client applies after the broker's
//! filter. The broker filters by tag hash only (different tags may share a hash), so a consumer
//! confirms each message's tag itself (as RocketMQ's client does). Never: sending anything.

use crate::error::{Error, Result};

/// A parsed tag expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagExpression {
    text: String,
    /// `None` for every message; else the tags accepted.
    tags: Option<Vec<String>>,
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
        })
    }

    /// The expression that accepts every message.
    #[must_use]
    pub fn all() -> Self {
        Self {
            text: "*".to_owned(),
            tags: None,
        }
    }

    /// The expression as sent to the broker.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether every message is wanted (no tag needs looking at).
    #[must_use]
    pub fn is_all(&self) -> bool {
        self.tags.is_none()
    }

    /// Whether a message with `tag` is wanted.
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
}
