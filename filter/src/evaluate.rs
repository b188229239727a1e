//! Evaluation of a compiled tree against one message's properties, as RocketMQ's expression
//! objects evaluate (`ComparisonExpression`, `LogicExpression`, `UnaryExpression`).
//!
//! A property comes in as `Option<&str>` from the caller's lookup; values live on the stack and
//! borrow from the tree or the message, so evaluating allocates nothing. Three outcomes exist
//! for a condition: true, false and NULL (unknown); and RocketMQ has a fourth, the exception its
//! conversions throw (`"abc"` read as a number), after which the broker treats the whole
//! expression as not matching (`ExpressionMessageFilter.isMatchedByCommitLog` catches it and
//! returns false). That is [`Abandon`] here, carried up with `?`.

use std::cmp::Ordering;

use crate::java;
use crate::tree::{Constant, Node};

/// The evaluation was abandoned where RocketMQ throws (a failed conversion of a property
/// string); the expression does not match the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Abandon;

type Outcome<T> = Result<T, Abandon>;

/// A value during evaluation: a borrowed view of a [`Constant`] or of a property string.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Value<'v> {
    Null,
    Bool(bool),
    Int(i32),
    Long(i64),
    Double(f64),
    Str(&'v str),
}

impl<'v> Value<'v> {
    pub(crate) fn of(constant: &'v Constant) -> Value<'v> {
        match constant {
            Constant::Null => Value::Null,
            Constant::Bool(value) => Value::Bool(*value),
            Constant::Int(value) => Value::Int(*value),
            Constant::Long(value) => Value::Long(*value),
            Constant::Double(value) => Value::Double(*value),
            Constant::Str(value) => Value::Str(value),
        }
    }

    fn of_condition(condition: Option<bool>) -> Value<'v> {
        condition.map_or(Value::Null, Value::Bool)
    }
}

/// Whether `node` (a condition) holds: `Some(true)`, `Some(false)` or `None` for NULL.
pub(crate) fn condition<'v, 'a: 'v, 's: 'v>(
    node: &'s Node,
    lookup: &impl Fn(&str) -> Option<&'a str>,
) -> Outcome<Option<bool>> {
    match node {
        Node::Not(operand) => Ok(condition(operand, lookup)?.map(|holds| !holds)),
        Node::And(operands) => and(operands, lookup),
        Node::Or(operands) => or(operands, lookup),
        Node::Equal(pair) => equal(&pair.0, &pair.1, lookup),
        Node::Compare(operator, pair) => {
            // Left first, and right only when left is not NULL, as RocketMQ does.
            let left = value(&pair.0, lookup)?;
            if left == Value::Null {
                return Ok(None);
            }
            let right = value(&pair.1, lookup)?;
            if right == Value::Null {
                return Ok(None);
            }
            Ok(Some(operator.accepts(order_for_comparison(left, right)?)))
        }
        Node::In {
            property,
            items,
            is_negated,
        } => Ok(lookup(property).map(|text| {
            let is_listed = items.binary_search_by(|item| (**item).cmp(text)).is_ok();
            is_listed != *is_negated
        })),
        Node::Text {
            test,
            operand,
            search,
            is_negated,
        } => {
            // RocketMQ answers false (never NULL) for an empty search, a NULL or a non-string
            // operand, for the negated forms too.
            if search.is_empty() {
                return Ok(Some(false));
            }
            match value(operand, lookup)? {
                Value::Str(text) => Ok(Some(test.holds(text, search) != *is_negated)),
                _ => Ok(Some(false)),
            }
        }
        Node::Constant(_) | Node::Property(_) | Node::Negate(_) => match value(node, lookup)? {
            Value::Bool(holds) => Ok(Some(holds)),
            Value::Null => Ok(None),
            // The parser admits only conditions where a condition is read; RocketMQ's cast to
            // Boolean would throw here.
            _ => {
                debug_assert!(
                    false,
                    "a non-boolean node where a condition belongs: {node:?}"
                );
                Err(Abandon)
            }
        },
    }
}

/// RocketMQ's `AND`: false as soon as an operand is false (the rest unread), else NULL if an
/// operand was NULL, else true.
fn and<'v, 'a: 'v, 's: 'v>(
    operands: &'s [Node],
    lookup: &impl Fn(&str) -> Option<&'a str>,
) -> Outcome<Option<bool>> {
    let mut is_unknown = false;
    for operand in operands {
        match condition(operand, lookup)? {
            Some(false) => return Ok(Some(false)),
            Some(true) => {}
            None => is_unknown = true,
        }
    }
    Ok((!is_unknown).then_some(true))
}

/// RocketMQ's `OR`: true as soon as an operand is true, else NULL if an operand was NULL, else
/// false.
fn or<'v, 'a: 'v, 's: 'v>(
    operands: &'s [Node],
    lookup: &impl Fn(&str) -> Option<&'a str>,
) -> Outcome<Option<bool>> {
    let mut is_unknown = false;
    for operand in operands {
        match condition(operand, lookup)? {
            Some(true) => return Ok(Some(true)),
            Some(false) => {}
            None => is_unknown = true,
        }
    }
    Ok(if is_unknown { None } else { Some(false) })
}

/// RocketMQ's `doCreateEqual`: NULL = NULL is true (that is `IS NULL`), a NULL left against a
/// value is NULL, a value against a NULL right is false; otherwise the values compare equal
/// after the conversions of [`order_values`].
fn equal<'v, 'a: 'v, 's: 'v>(
    left: &'s Node,
    right: &'s Node,
    lookup: &impl Fn(&str) -> Option<&'a str>,
) -> Outcome<Option<bool>> {
    let left = value(left, lookup)?;
    let right = value(right, lookup)?;
    match (left, right) {
        (Value::Null, Value::Null) => Ok(Some(true)),
        (Value::Null, _) => Ok(None),
        (_, Value::Null) => Ok(Some(false)),
        // Java's `equals` is tried first, but wherever it holds the comparison answers 0 too.
        // Two strings compare as strings here; only the ordering operators read them as numbers.
        _ => Ok(Some(order_values(left, right)?.is_eq())),
    }
}

pub(crate) fn value<'v, 'a: 'v, 's: 'v>(
    node: &'s Node,
    lookup: &impl Fn(&str) -> Option<&'a str>,
) -> Outcome<Value<'v>> {
    match node {
        Node::Constant(constant) => Ok(Value::of(constant)),
        Node::Property(name) => Ok(lookup(name).map_or(Value::Null, Value::Str)),
        Node::Negate(operand) => Ok(match value(operand, lookup)? {
            Value::Int(number) => Value::Int(number.wrapping_neg()),
            Value::Long(number) => Value::Long(number.wrapping_neg()),
            Value::Double(number) => Value::Double(-number),
            // RocketMQ negates numbers only; a string property negates to NULL.
            _ => Value::Null,
        }),
        _ => Ok(Value::of_condition(condition(node, lookup)?)),
    }
}

/// The order of two non-NULL values for `>`, `>=`, `<`, `<=`: two strings are both read as
/// doubles (RocketMQ's `ComparisonExpression.evaluate`), anything else goes to [`order`].
fn order_for_comparison(left: Value, right: Value) -> Outcome<Ordering> {
    if let (Value::Str(left), Value::Str(right)) = (left, right) {
        let left = java::parse_double(left).ok_or(Abandon)?;
        let right = java::parse_double(right).ok_or(Abandon)?;
        return Ok(java::compare_doubles(left, right));
    }
    order_values(left, right)
}

/// RocketMQ's `ComparisonExpression.__compare` with string conversion on: values of different
/// types are converted towards the other side (a string to the number's type with Java's
/// parser, an int to long or double, a long to double); a conversion that fails abandons the
/// evaluation; a pair with no conversion compares as "less" (-1), as RocketMQ's does.
pub(crate) fn order_values(left: Value, right: Value) -> Outcome<Ordering> {
    use Value::*;
    Ok(match (left, right) {
        (Bool(left), Bool(right)) => left.cmp(&right),
        (Int(left), Int(right)) => left.cmp(&right),
        (Long(left), Long(right)) => left.cmp(&right),
        (Double(left), Double(right)) => java::compare_doubles(left, right),
        (Str(left), Str(right)) => left.cmp(right),

        (Int(left), Long(right)) => i64::from(left).cmp(&right),
        (Long(left), Int(right)) => left.cmp(&i64::from(right)),
        (Int(left), Double(right)) => java::compare_doubles(f64::from(left), right),
        (Double(left), Int(right)) => java::compare_doubles(left, f64::from(right)),
        (Long(left), Double(right)) => java::compare_doubles(left as f64, right),
        (Double(left), Long(right)) => java::compare_doubles(left, right as f64),

        (Int(left), Str(right)) => left.cmp(&converted(java::parse_int(right))?),
        (Long(left), Str(right)) => left.cmp(&converted(java::parse_long(right))?),
        (Double(left), Str(right)) => {
            java::compare_doubles(left, converted(java::parse_double(right))?)
        }
        (Str(left), Int(right)) => converted(java::parse_int(left))?.cmp(&right),
        (Str(left), Long(right)) => converted(java::parse_long(left))?.cmp(&right),
        (Str(left), Double(right)) => {
            java::compare_doubles(converted(java::parse_double(left))?, right)
        }
        (Str(left), Bool(right)) => java::parse_boolean(left).cmp(&right),
        // RocketMQ's Boolean-against-String branch casts the Boolean to String and throws.
        (Bool(_), Str(_)) => return Err(Abandon),

        // Booleans against numbers, and NULL (the callers answer NULL before asking).
        _ => Ordering::Less,
    })
}

/// A converted property string, or [`Abandon`] where Java's parser throws.
fn converted<T>(parsed: Option<T>) -> Outcome<T> {
    parsed.ok_or(Abandon)
}
