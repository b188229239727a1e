//! RocketMQ's SQL92 message filter: an expression over a message's properties, compiled once
//! per subscription and evaluated on every message the subscription could receive.
//!
//! The broker evaluates it on each stored message's properties at pull time; the client and
//! the CLI compile it to check an expression when subscribing. This crate owns the language
//! and nothing else: no I/O, no async, no message or property types. Text comes in through
//! [`Expression::compile`]; property values come in through the caller's lookup function in
//! [`Expression::matches`], which answers one bool. Evaluation allocates nothing.
//!
//! The behaviour follows Apache RocketMQ's `filter` module (itself ActiveMQ's selector, cut
//! down) so that a message matches here exactly when it would there; `docs/sql-filter.md` has
//! the full description with examples. In short:
//!
//! ```text
//! condition  := and ( OR and )*
//! and        := equality ( AND equality )*
//! equality   := comparison ( ( '=' | '<>' ) comparison | IS [NOT] NULL )*
//! comparison := unary ( ( '>' | '>=' | '<' | '<=' ) unary
//!                     | [NOT] BETWEEN unary AND unary
//!                     | [NOT] IN '(' string ( ',' string )* ')'
//!                     | [NOT] ( CONTAINS | STARTSWITH | ENDSWITH ) string )*
//! unary      := '+' unary | '-' unary | NOT unary | primary
//! primary    := integer | float | string | TRUE | FALSE | NULL | property | '(' condition ')'
//! property   := [A-Za-z_$][A-Za-z0-9_$]*        (case-sensitive; keywords are not)
//! integer    := 0 | [1-9][0-9]* [lL]?            (int, or long when it does not fit an int)
//! float      := 5.  5.5  .5  5E10  5.5e-3        (a double: finite, and not 0.0)
//! string     := 'text' with '' for a quote
//! ```
//!
//! Blanks are space, tab, CR, LF and form feed; `-- ...` and `/* ... */` are comments.
//! `NOT` binds tighter than comparisons, as in RocketMQ: write `NOT (a = 1)`.
//!
//! Semantics (RocketMQ's):
//! - A property value is a string; a missing property is NULL.
//! - A comparison of a property with a number reads the property with Java's parser for the
//!   number's type (`Integer.parseInt` against an int literal, `Long.parseLong` against a long,
//!   `Double.valueOf` against a float), so `a = 1` holds for `"1"` but not for `"1.0"`; two
//!   properties under `>`, `>=`, `<`, `<=` are both read as doubles; `=` between two strings
//!   compares text; a property against `TRUE`/`FALSE` is true when it spells "true" in any case.
//! - A conversion that fails (`"abc"` read as a number) is an error in RocketMQ, which the
//!   broker turns into "the message does not match": the whole expression is false for that
//!   message, whatever surrounds the comparison (even `NOT` or `OR`), unless an earlier operand
//!   of `AND`/`OR` already decided (they evaluate left to right and stop early).
//! - Three-valued logic: a comparison with NULL is NULL (`IS NULL` excepted); `NOT NULL`
//!   is NULL; `AND` is false if an operand is false, else NULL if one is NULL; `OR` is true if
//!   an operand is true, else NULL if one is NULL; the message matches only on true. So with
//!   `a` missing, neither `a > 5` nor `NOT (a > 5)` matches.
//! - Quirks kept: `a = b` with both missing is true and with only `b` missing is false (so
//!   `a <> b` is then true); `CONTAINS`, `STARTSWITH`, `ENDSWITH` and their `NOT` forms are
//!   false (not NULL) on a missing property or an empty search string.
//!
//! Deliberate differences from RocketMQ, each turning a silent surprise into a compile error:
//! trailing text after a complete expression (`a = 1 b = 2`; RocketMQ ignores `b = 2`) and a
//! bare property where a condition belongs (`a`, `a AND b = 1`, `NOT a = 1`; RocketMQ casts
//! it to a Boolean, which a string never is).
//!
//! Limits (the source comes from the wire): [`MAX_EXPRESSION_BYTES`], [`MAX_NESTING_DEPTH`],
//! [`MAX_IN_ITEMS`]; past any of them [`Expression::compile`] returns a [`ParseError`].
//!
//! Modules: `lexer` (tokens), `parser` (precedence and RocketMQ's operand checks), `tree` (the
//! compiled form), `evaluate` (three-valued evaluation), `java` (the Java parsing and ordering
//! rules RocketMQ's comparisons inherit).

mod evaluate;
mod java;
mod lexer;
mod parser;
mod tree;

use tree::Node;

/// The longest expression source accepted, in bytes.
pub const MAX_EXPRESSION_BYTES: usize = 16 * 1024;
/// The deepest nesting accepted: parentheses and prefix operators open at once, and the height
/// of the compiled tree.
pub const MAX_NESTING_DEPTH: usize = 64;
/// The most strings one `IN (...)` list may hold.
pub const MAX_IN_ITEMS: usize = 1024;

/// A compiled filter expression.
#[derive(Debug, Clone)]
pub struct Expression {
    source: String,
    root: Node,
    /// Sorted and deduplicated.
    properties: Vec<String>,
}

/// Why an expression does not compile: where (a 0-based character offset into the source) and
/// what was expected or is wrong there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("at position {position}: {message}")]
pub struct ParseError {
    pub position: usize,
    pub message: String,
}

impl ParseError {
    /// An error at `byte_offset` of `source`, reported as a character offset.
    pub(crate) fn at_byte(source: &str, byte_offset: usize, message: impl Into<String>) -> Self {
        debug_assert!(source.is_char_boundary(byte_offset));
        let position = source
            .get(..byte_offset)
            .map_or(0, |before| before.chars().count());
        ParseError {
            position,
            message: message.into(),
        }
    }
}

impl Expression {
    /// Compiles `source`; the error names the position (a character offset, 0-based) and what
    /// was expected there.
    pub fn compile(source: &str) -> Result<Expression, ParseError> {
        if source.len() > MAX_EXPRESSION_BYTES {
            return Err(ParseError {
                position: 0,
                message: format!(
                    "the expression is {} bytes, over max_expression_bytes ({MAX_EXPRESSION_BYTES})",
                    source.len()
                ),
            });
        }
        let tokens = lexer::tokenize(source)?;
        let root = parser::parse(source, tokens)?;
        let mut names = Vec::new();
        root.collect_properties(&mut names);
        names.sort_unstable();
        names.dedup();
        let properties = names.into_iter().map(str::to_owned).collect();
        Ok(Expression {
            source: source.to_owned(),
            root,
            properties,
        })
    }

    /// Whether a message whose properties `lookup` answers matches: `lookup` returns a
    /// property's value, or `None` when the message has no such property. Only names from
    /// [`Expression::properties`] are asked for.
    #[must_use]
    pub fn matches<'a>(&self, lookup: impl Fn(&str) -> Option<&'a str>) -> bool {
        evaluate::condition(&self.root, &lookup) == Ok(Some(true))
    }

    /// The property names the expression reads, sorted and deduplicated.
    pub fn properties(&self) -> &[String] {
        &self.properties
    }

    /// The text the expression was compiled from.
    pub fn source(&self) -> &str {
        &self.source
    }
}

#[cfg(test)]
mod tests;
