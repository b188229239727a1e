//! The compiled form of an expression: a tree of [`Node`]s with every literal already parsed.
//!
//! Built only by the parser (which checks the operand rules RocketMQ checks when it builds its
//! expression objects) and read only by the evaluator. It never sees the source text again: a
//! node holds the values it needs, not the tokens it came from.

/// A literal: the value kinds RocketMQ's constants take (`Integer`, `Long`, `Double`, `String`,
/// `Boolean` and `null` in Java). Property values are always strings; numbers only come from
/// literals and their negations.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Constant {
    Null,
    Bool(bool),
    /// A decimal literal that fits Java's `int`.
    Int(i32),
    /// A decimal literal that needs Java's `long`.
    Long(i64),
    Double(f64),
    Str(Box<str>),
}

/// `>`, `>=`, `<`, `<=`: the ordering comparisons (RocketMQ's `createGreaterThan` and siblings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ordering {
    Greater,
    GreaterOrEqual,
    Less,
    LessOrEqual,
}

impl Ordering {
    /// Whether a comparison answering `order` (left against right) satisfies this operator.
    pub(crate) fn accepts(self, order: std::cmp::Ordering) -> bool {
        match self {
            Ordering::Greater => order.is_gt(),
            Ordering::GreaterOrEqual => order.is_ge(),
            Ordering::Less => order.is_lt(),
            Ordering::LessOrEqual => order.is_le(),
        }
    }
}

/// `CONTAINS`, `STARTSWITH`, `ENDSWITH` (RocketMQ 4.9.3+).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TextTest {
    Contains,
    StartsWith,
    EndsWith,
}

impl TextTest {
    pub(crate) fn holds(self, text: &str, search: &str) -> bool {
        match self {
            TextTest::Contains => text.contains(search),
            TextTest::StartsWith => text.starts_with(search),
            TextTest::EndsWith => text.ends_with(search),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Node {
    Constant(Constant),
    /// A message property, looked up by name (case-sensitive).
    Property(Box<str>),
    /// Unary minus: negates a number, yields NULL for anything else.
    Negate(Box<Node>),
    Not(Box<Node>),
    /// `AND` of two or more conditions, evaluated left to right. A chain of `AND`s is one node:
    /// three-valued `AND` with RocketMQ's short circuit is associative (same answer, same
    /// operands evaluated), and a flat node keeps the tree's height bounded.
    And(Vec<Node>),
    Or(Vec<Node>),
    /// `=`, and `IS NULL` as `= NULL` (RocketMQ's `doCreateEqual`).
    Equal(Box<(Node, Node)>),
    Compare(Ordering, Box<(Node, Node)>),
    /// `property [NOT] IN (...)`: `items` sorted and deduplicated for a binary search.
    In {
        property: Box<str>,
        items: Box<[Box<str>]>,
        is_negated: bool,
    },
    Text {
        test: TextTest,
        operand: Box<Node>,
        search: Box<str>,
        is_negated: bool,
    },
}

impl Node {
    /// The tree's height (a leaf is 1), bounded by `MAX_NESTING_DEPTH` at compile time.
    pub(crate) fn height(&self) -> usize {
        1 + match self {
            Node::Constant(_) | Node::Property(_) | Node::In { .. } => 0,
            Node::Negate(operand) | Node::Not(operand) => operand.height(),
            Node::Text { operand, .. } => operand.height(),
            Node::And(operands) | Node::Or(operands) => {
                operands.iter().map(Node::height).max().unwrap_or(0)
            }
            Node::Equal(pair) | Node::Compare(_, pair) => pair.0.height().max(pair.1.height()),
        }
    }

    /// Adds the names of the properties this tree reads to `names`.
    pub(crate) fn collect_properties<'a>(&'a self, names: &mut Vec<&'a str>) {
        match self {
            Node::Constant(_) => {}
            Node::Property(name) | Node::In { property: name, .. } => names.push(name),
            Node::Negate(operand) | Node::Not(operand) => operand.collect_properties(names),
            Node::Text { operand, .. } => operand.collect_properties(names),
            Node::And(operands) | Node::Or(operands) => {
                for operand in operands {
                    operand.collect_properties(names);
                }
            }
            Node::Equal(pair) | Node::Compare(_, pair) => {
                pair.0.collect_properties(names);
                pair.1.collect_properties(names);
            }
        }
    }
}
