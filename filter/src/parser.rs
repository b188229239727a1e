//! Recursive descent over the tokens, with the precedence of RocketMQ's `SelectorParser.jj`
//! (loosest first): `OR`; `AND`; `=`, `<>`, `IS [NOT] NULL`; `>`, `>=`, `<`, `<=`,
//! `[NOT] BETWEEN`, `[NOT] IN`, `[NOT] CONTAINS|STARTSWITH|ENDSWITH`; the prefixes `+`, `-`,
//! `NOT`; literals, properties and parentheses.
//!
//! Input: tokens from the lexer. Output: a checked [`Node`] tree, or the first error with its
//! position. The operand checks RocketMQ makes while building its expression objects
//! (`checkLessThanOperand`, `checkEqualOperand`, the BETWEEN bounds, IN on a property only)
//! are made here, so an expression RocketMQ refuses is refused at compile time here too. The
//! parser's recursion and the tree's height are both bounded by `MAX_NESTING_DEPTH`.

use std::cmp::Ordering as Order;

use crate::evaluate::{order_values, Value};
use crate::lexer::{Keyword, Token, TokenKind};
use crate::tree::{Constant, Node, Ordering, TextTest};
use crate::{ParseError, MAX_IN_ITEMS, MAX_NESTING_DEPTH};

/// What RocketMQ's type checks need to know about a parsed operand (its Java class family).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A number or string literal (`ConstantExpression`).
    Literal,
    /// `TRUE`, `FALSE`, `NULL` (`BooleanConstantExpression`: a constant and a condition).
    BooleanLiteral,
    Property,
    /// Comparisons, logic, `IN`, text tests (`BooleanExpression`).
    Condition,
    /// Unary minus (neither a constant nor a condition, even when folded).
    Negation,
}

#[derive(Debug, Clone)]
struct Parsed {
    node: Node,
    kind: Kind,
    /// Byte offsets of the operand's source text.
    start: usize,
    end: usize,
    height: usize,
}

impl Parsed {
    fn constant(&self) -> Option<&Constant> {
        match (&self.node, self.kind) {
            (Node::Constant(constant), Kind::Literal | Kind::BooleanLiteral) => Some(constant),
            _ => None,
        }
    }
}

pub(crate) fn parse(source: &str, tokens: Vec<Token<'_>>) -> Result<Node, ParseError> {
    let mut parser = Parser {
        source,
        tokens,
        next: 0,
        depth: 0,
    };
    let top = parser.or()?;
    let token = parser.peek(0);
    if token.kind != TokenKind::End {
        return Err(parser.error(
            token.start,
            format!(
                "unexpected {} after a complete expression",
                token.describe()
            ),
        ));
    }
    let top = parser.condition(top)?;
    debug_assert!(top.node.height() == top.height);
    debug_assert!(top.height <= MAX_NESTING_DEPTH);
    Ok(top.node)
}

struct Parser<'s> {
    source: &'s str,
    tokens: Vec<Token<'s>>,
    next: usize,
    /// Parentheses and prefix operators open around the current position.
    depth: usize,
}

impl<'s> Parser<'s> {
    fn peek(&self, ahead: usize) -> &Token<'s> {
        let last = self.tokens.len() - 1;
        &self.tokens[(self.next + ahead).min(last)]
    }

    fn advance(&mut self) -> Token<'s> {
        let token = self.peek(0).clone();
        if token.kind != TokenKind::End {
            self.next += 1;
        }
        token
    }

    fn is_keyword(&self, ahead: usize, keyword: Keyword) -> bool {
        self.peek(ahead).kind == TokenKind::Keyword(keyword)
    }

    /// The end (byte offset) of the last token consumed.
    fn last_end(&self) -> usize {
        self.next.checked_sub(1).map_or(0, |last| {
            self.tokens[last].start + self.tokens[last].text.len()
        })
    }

    fn error(&self, byte_offset: usize, message: impl Into<String>) -> ParseError {
        ParseError::at_byte(self.source, byte_offset, message)
    }

    fn text(&self, operand: &Parsed) -> &'s str {
        &self.source[operand.start..operand.end]
    }

    fn expect(&mut self, kind: TokenKind, what: &str) -> Result<Token<'s>, ParseError> {
        let token = self.peek(0);
        if token.kind == kind {
            return Ok(self.advance());
        }
        Err(self.error(
            token.start,
            format!("expected {what} but found {}", token.describe()),
        ))
    }

    fn enter(&mut self, at: usize) -> Result<(), ParseError> {
        self.depth += 1;
        if self.depth > MAX_NESTING_DEPTH {
            return Err(self.error(
                at,
                format!("the expression nests deeper than max_nesting_depth ({MAX_NESTING_DEPTH})"),
            ));
        }
        Ok(())
    }

    fn leave(&mut self) {
        debug_assert!(self.depth > 0);
        self.depth -= 1;
    }

    /// A composite operand, refused when it makes the tree too tall.
    fn build(
        &self,
        node: Node,
        kind: Kind,
        start: usize,
        height: usize,
    ) -> Result<Parsed, ParseError> {
        if height > MAX_NESTING_DEPTH {
            return Err(self.error(
                start,
                format!("the expression nests deeper than max_nesting_depth ({MAX_NESTING_DEPTH})"),
            ));
        }
        Ok(Parsed {
            node,
            kind,
            start,
            end: self.last_end(),
            height,
        })
    }

    /// RocketMQ's `asBooleanExpression`, stricter: a bare property is refused rather than cast
    /// (RocketMQ's cast of a string is always false, so `a AND b = 1` could never match).
    fn condition(&self, operand: Parsed) -> Result<Parsed, ParseError> {
        match operand.kind {
            Kind::Condition | Kind::BooleanLiteral => Ok(operand),
            Kind::Property => {
                let name = match &operand.node {
                    Node::Property(name) => name,
                    _ => self.text(&operand),
                };
                Err(self.error(
                    operand.start,
                    format!(
                        "property {name} is not a condition: compare it (e.g. {name} = 'x' or \
                         {name} IS NOT NULL); NOT applies to the operand right after it, so \
                         write NOT (a = 1)"
                    ),
                ))
            }
            Kind::Literal | Kind::Negation => Err(self.error(
                operand.start,
                format!("expected a condition but found {}", self.text(&operand)),
            )),
        }
    }

    fn or(&mut self) -> Result<Parsed, ParseError> {
        let mut left = self.and()?;
        while self.is_keyword(0, Keyword::Or) {
            self.advance();
            let right = self.and()?;
            left = self.logic(left, right, true)?;
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Parsed, ParseError> {
        let mut left = self.equality()?;
        while self.is_keyword(0, Keyword::And) {
            self.advance();
            let right = self.equality()?;
            left = self.logic(left, right, false)?;
        }
        Ok(left)
    }

    /// `left AND right` or `left OR right`, flattened into one n-ary node.
    fn logic(&self, left: Parsed, right: Parsed, is_or: bool) -> Result<Parsed, ParseError> {
        let left = self.condition(left)?;
        let right = self.condition(right)?;
        let start = left.start;
        let mut operands = Vec::new();
        let mut child_height = 0;
        for side in [left, right] {
            match (side.node, is_or) {
                (Node::Or(children), true) | (Node::And(children), false) => {
                    child_height = child_height.max(side.height - 1);
                    operands.extend(children);
                }
                (node, _) => {
                    child_height = child_height.max(side.height);
                    operands.push(node);
                }
            }
        }
        let node = if is_or {
            Node::Or(operands)
        } else {
            Node::And(operands)
        };
        self.build(node, Kind::Condition, start, child_height + 1)
    }

    fn equality(&mut self) -> Result<Parsed, ParseError> {
        let mut left = self.comparison()?;
        loop {
            let token = self.peek(0).clone();
            left = match token.kind {
                TokenKind::Equal | TokenKind::NotEqual => {
                    self.advance();
                    let right = self.comparison()?;
                    let equal = self.equal(left, right)?;
                    if token.kind == TokenKind::Equal {
                        equal
                    } else {
                        self.not(equal)?
                    }
                }
                TokenKind::Keyword(Keyword::Is) => {
                    self.advance();
                    let is_negated = self.is_keyword(0, Keyword::Not);
                    if is_negated {
                        self.advance();
                    }
                    self.expect(
                        TokenKind::Keyword(Keyword::Null),
                        if is_negated {
                            "NULL after IS NOT"
                        } else {
                            "NULL or NOT NULL after IS"
                        },
                    )?;
                    let height = left.height + 1;
                    let start = left.start;
                    let null = Node::Constant(Constant::Null);
                    let is_null = Node::Equal(Box::new((left.node, null)));
                    let is_null = self.build(is_null, Kind::Condition, start, height)?;
                    if is_negated {
                        self.not(is_null)?
                    } else {
                        is_null
                    }
                }
                _ => return Ok(left),
            };
        }
    }

    /// `left = right` with RocketMQ's `checkEqualOperand` and `checkEqualOperandCompatability`.
    fn equal(&self, left: Parsed, right: Parsed) -> Result<Parsed, ParseError> {
        for operand in [&left, &right] {
            if operand.constant() == Some(&Constant::Null) {
                return Err(self.error(
                    operand.start,
                    "NULL cannot be compared with = or <>: use IS NULL or IS NOT NULL",
                ));
            }
        }
        if left.kind == Kind::BooleanLiteral && right.kind == Kind::Literal {
            return Err(self.error(
                right.start,
                format!(
                    "{} cannot be compared with {}",
                    self.text(&left),
                    self.text(&right)
                ),
            ));
        }
        let height = left.height.max(right.height) + 1;
        let start = left.start;
        let node = Node::Equal(Box::new((left.node, right.node)));
        self.build(node, Kind::Condition, start, height)
    }

    fn not(&self, operand: Parsed) -> Result<Parsed, ParseError> {
        let operand = self.condition(operand)?;
        let height = operand.height + 1;
        let start = operand.start;
        self.build(
            Node::Not(Box::new(operand.node)),
            Kind::Condition,
            start,
            height,
        )
    }

    fn comparison(&mut self) -> Result<Parsed, ParseError> {
        let mut left = self.unary()?;
        loop {
            let is_negated = self.is_keyword(0, Keyword::Not);
            let operator_at = usize::from(is_negated);
            let ordering = match self.peek(0).kind {
                TokenKind::Greater => Some(Ordering::Greater),
                TokenKind::GreaterOrEqual => Some(Ordering::GreaterOrEqual),
                TokenKind::Less => Some(Ordering::Less),
                TokenKind::LessOrEqual => Some(Ordering::LessOrEqual),
                _ => None,
            };
            if let Some(ordering) = ordering {
                self.advance();
                let right = self.unary()?;
                left = self.compare(ordering, left, right)?;
                continue;
            }
            let keyword = match self.peek(operator_at).kind {
                TokenKind::Keyword(keyword) => keyword,
                _ => return Ok(left),
            };
            let test = match keyword {
                Keyword::Contains => Some(TextTest::Contains),
                Keyword::StartsWith => Some(TextTest::StartsWith),
                Keyword::EndsWith => Some(TextTest::EndsWith),
                _ => None,
            };
            left = match (keyword, test) {
                (_, Some(test)) => {
                    self.next += operator_at + 1;
                    let after = keyword_name(keyword);
                    let search = self.string_literal(after)?;
                    let height = left.height + 1;
                    let start = left.start;
                    let node = Node::Text {
                        test,
                        operand: Box::new(left.node),
                        search: search.into_boxed_str(),
                        is_negated,
                    };
                    self.build(node, Kind::Condition, start, height)?
                }
                (Keyword::Between, _) => {
                    self.next += operator_at + 1;
                    let low = self.unary()?;
                    self.expect(
                        TokenKind::Keyword(Keyword::And),
                        "AND between BETWEEN's bounds",
                    )?;
                    let high = self.unary()?;
                    self.between(left, low, high, is_negated)?
                }
                (Keyword::In, _) => {
                    self.next += operator_at + 1;
                    self.in_list(left, is_negated)?
                }
                _ => return Ok(left),
            };
        }
    }

    /// RocketMQ's `checkLessThanOperand`: only numbers, properties and negations are ordered.
    fn check_orderable(&self, operand: &Parsed) -> Result<(), ParseError> {
        let is_orderable = match operand.kind {
            Kind::Property | Kind::Negation => true,
            Kind::Literal => matches!(
                operand.constant(),
                Some(Constant::Int(_) | Constant::Long(_) | Constant::Double(_))
            ),
            Kind::BooleanLiteral | Kind::Condition => false,
        };
        if is_orderable {
            return Ok(());
        }
        Err(self.error(
            operand.start,
            format!(
                "{} cannot be compared with >, >=, <, <= or BETWEEN: only numbers and properties can",
                self.text(operand)
            ),
        ))
    }

    fn compare(
        &self,
        ordering: Ordering,
        left: Parsed,
        right: Parsed,
    ) -> Result<Parsed, ParseError> {
        self.check_orderable(&left)?;
        self.check_orderable(&right)?;
        let height = left.height.max(right.height) + 1;
        let start = left.start;
        let node = Node::Compare(ordering, Box::new((left.node, right.node)));
        self.build(node, Kind::Condition, start, height)
    }

    /// `value BETWEEN low AND high` is `value >= low AND value <= high`; `NOT BETWEEN` is
    /// `value < low OR value > high` (RocketMQ's `createBetween` / `createNotBetween`). Only
    /// BETWEEN checks constant bounds (non-NULL, low <= high), as RocketMQ does.
    fn between(
        &self,
        value: Parsed,
        low: Parsed,
        high: Parsed,
        is_negated: bool,
    ) -> Result<Parsed, ParseError> {
        if let (false, Some(low_value), Some(high_value)) =
            (is_negated, low.constant(), high.constant())
        {
            if *low_value == Constant::Null || *high_value == Constant::Null {
                return Err(self.error(low.start, "the bounds of BETWEEN cannot be NULL"));
            }
            let order = order_values(Value::of(high_value), Value::of(low_value));
            if order != Ok(Order::Greater) && order != Ok(Order::Equal) {
                return Err(self.error(
                    low.start,
                    format!(
                        "BETWEEN {} AND {}: the low bound must not exceed the high bound",
                        self.text(&low),
                        self.text(&high)
                    ),
                ));
            }
        }
        let start = value.start;
        let (first, second, is_or) = if is_negated {
            (Ordering::Less, Ordering::Greater, true)
        } else {
            (Ordering::GreaterOrEqual, Ordering::LessOrEqual, false)
        };
        let first = self.compare(first, value.clone(), low)?;
        let second = self.compare(second, value, high)?;
        let mut both = self.logic(first, second, is_or)?;
        both.start = start;
        Ok(both)
    }

    fn in_list(&mut self, property: Parsed, is_negated: bool) -> Result<Parsed, ParseError> {
        let Node::Property(name) = &property.node else {
            return Err(self.error(
                property.start,
                format!(
                    "IN needs a property on its left, not {}",
                    self.text(&property)
                ),
            ));
        };
        let name = name.clone();
        self.expect(TokenKind::LeftParenthesis, "'(' after IN")?;
        let mut items: Vec<Box<str>> = Vec::new();
        loop {
            let at = self.peek(0).start;
            items.push(self.string_literal("IN (")?.into_boxed_str());
            if items.len() > MAX_IN_ITEMS {
                return Err(self.error(
                    at,
                    format!("the IN list has more than max_in_items ({MAX_IN_ITEMS}) items"),
                ));
            }
            if self.peek(0).kind == TokenKind::Comma {
                self.advance();
                continue;
            }
            self.expect(TokenKind::RightParenthesis, "',' or ')' in the IN list")?;
            break;
        }
        items.sort_unstable();
        items.dedup();
        let node = Node::In {
            property: name,
            items: items.into_boxed_slice(),
            is_negated,
        };
        self.build(node, Kind::Condition, property.start, 1)
    }

    fn string_literal(&mut self, after: &str) -> Result<String, ParseError> {
        let token = self.peek(0);
        if let TokenKind::Str(text) = &token.kind {
            let text = text.clone();
            self.advance();
            return Ok(text);
        }
        Err(self.error(
            token.start,
            format!(
                "expected a quoted string after {after} but found {}",
                token.describe()
            ),
        ))
    }

    fn unary(&mut self) -> Result<Parsed, ParseError> {
        let token = self.peek(0).clone();
        let prefix = match token.kind {
            TokenKind::Plus | TokenKind::Minus | TokenKind::Keyword(Keyword::Not) => token.kind,
            _ => return self.primary(),
        };
        self.advance();
        self.enter(token.start)?;
        let operand = self.unary()?;
        self.leave();
        let mut result = match prefix {
            TokenKind::Plus => operand,
            TokenKind::Minus => self.negate(operand)?,
            _ => self.not(operand)?,
        };
        result.start = token.start;
        Ok(result)
    }

    /// Unary minus; a negated number literal is folded but stays a [`Kind::Negation`], since
    /// RocketMQ's checks see a `UnaryExpression` there, not a constant.
    fn negate(&self, operand: Parsed) -> Result<Parsed, ParseError> {
        let start = operand.start;
        let folded = match &operand.node {
            Node::Constant(Constant::Int(number)) => Some(Constant::Int(number.wrapping_neg())),
            Node::Constant(Constant::Long(number)) => Some(Constant::Long(number.wrapping_neg())),
            Node::Constant(Constant::Double(number)) => Some(Constant::Double(-number)),
            _ => None,
        };
        match folded {
            Some(constant) => self.build(Node::Constant(constant), Kind::Negation, start, 1),
            None => {
                let height = operand.height + 1;
                self.build(
                    Node::Negate(Box::new(operand.node)),
                    Kind::Negation,
                    start,
                    height,
                )
            }
        }
    }

    fn primary(&mut self) -> Result<Parsed, ParseError> {
        let token = self.advance();
        let (node, kind) = match &token.kind {
            TokenKind::Str(text) => (
                Node::Constant(Constant::Str(text.clone().into_boxed_str())),
                Kind::Literal,
            ),
            TokenKind::Integer => (Node::Constant(self.integer(&token)?), Kind::Literal),
            TokenKind::Float => (Node::Constant(self.float(&token)?), Kind::Literal),
            TokenKind::Keyword(Keyword::True) => {
                (Node::Constant(Constant::Bool(true)), Kind::BooleanLiteral)
            }
            TokenKind::Keyword(Keyword::False) => {
                (Node::Constant(Constant::Bool(false)), Kind::BooleanLiteral)
            }
            TokenKind::Keyword(Keyword::Null) => {
                (Node::Constant(Constant::Null), Kind::BooleanLiteral)
            }
            TokenKind::Identifier => (Node::Property(token.text.into()), Kind::Property),
            TokenKind::LeftParenthesis => {
                self.enter(token.start)?;
                let mut inner = self.or()?;
                self.expect(TokenKind::RightParenthesis, "')'")?;
                self.leave();
                inner.start = token.start;
                inner.end = self.last_end();
                return Ok(inner);
            }
            _ => {
                return Err(self.error(
                    token.start,
                    format!(
                        "expected a value (a literal, a property or '(') but found {}",
                        token.describe()
                    ),
                ))
            }
        };
        self.build(node, kind, token.start, 1)
    }

    /// RocketMQ's `createFromDecimal`: a Java `long` (an `l`/`L` suffix is dropped), narrowed
    /// to `int` when it fits.
    fn integer(&self, token: &Token<'_>) -> Result<Constant, ParseError> {
        let digits = token.text.trim_end_matches(['l', 'L']);
        let Some(value) = crate::java::parse_long(digits) else {
            return Err(self.error(
                token.start,
                format!(
                    "integer {} does not fit a 64-bit signed integer",
                    token.text
                ),
            ));
        };
        Ok(match i32::try_from(value) {
            Ok(small) => Constant::Int(small),
            Err(_) => Constant::Long(value),
        })
    }

    /// RocketMQ's `createFloat`: a Java `double` that must be finite and, a quirk kept for
    /// compatibility, at least `Double.MIN_VALUE` (so `0.0` is refused; write `0`).
    fn float(&self, token: &Token<'_>) -> Result<Constant, ParseError> {
        let value: f64 = token
            .text
            .parse()
            .map_err(|_| self.error(token.start, format!("{} is not a number", token.text)))?;
        if value.is_infinite() {
            return Err(self.error(
                token.start,
                format!("{} is larger than the largest double", token.text),
            ));
        }
        if value < f64::from_bits(1) {
            return Err(self.error(
                token.start,
                format!(
                    "{} is below the smallest positive double (RocketMQ refuses a zero float \
                     literal: write 0)",
                    token.text
                ),
            ));
        }
        Ok(Constant::Double(value))
    }
}

fn keyword_name(keyword: Keyword) -> &'static str {
    match keyword {
        Keyword::Contains => "CONTAINS",
        Keyword::StartsWith => "STARTSWITH",
        Keyword::EndsWith => "ENDSWITH",
        _ => "the operator",
    }
}
