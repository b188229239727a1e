//! The evaluator against a straightforward reference evaluator on random expressions and random
//! messages (issue 25: "a property test comparing the broker's evaluator with a reference").
//!
//! The reference is written from RocketMQ's rules as its `org.apache.rocketmq.filter.expression`
//! classes state them, independently of this crate's tree and evaluation: a condition is true,
//! false or NULL; a comparison with a missing property is NULL; `x = n` with `x` missing is
//! NULL; `BETWEEN` is `x >= low AND x <= high` (`NOT BETWEEN` is `x < low OR x > high`); `IN`
//! with `x` missing is NULL, negated or not; `IS [NOT] NULL` is never NULL; `AND` is false if
//! an operand is false, else NULL if one is NULL; `OR` is true if one is true, else NULL if one
//! is NULL; `NOT` keeps NULL; a message matches only when the whole condition is true. The
//! messages give each property an integer or nothing, so no conversion can fail.

use proptest::prelude::*;
use shardmq_filter::Expression;

const NAMES: [&str; 3] = ["a", "b", "c"];

#[derive(Debug, Clone, Copy)]
enum Order {
    Greater,
    GreaterOrEqual,
    Less,
    LessOrEqual,
    NotEqual,
}

#[derive(Debug, Clone)]
enum Condition {
    Compare(usize, Order, i64),
    Equal(usize, i64),
    Between {
        name: usize,
        low: i64,
        high: i64,
        is_negated: bool,
    },
    IsNull(usize, bool),
    In(usize, Vec<i64>, bool),
    And(Box<Condition>, Box<Condition>),
    Or(Box<Condition>, Box<Condition>),
    Not(Box<Condition>),
}

fn render(condition: &Condition) -> String {
    match condition {
        Condition::Compare(name, order, number) => {
            let operator = match order {
                Order::Greater => ">",
                Order::GreaterOrEqual => ">=",
                Order::Less => "<",
                Order::LessOrEqual => "<=",
                Order::NotEqual => "<>",
            };
            format!("{} {operator} {number}", NAMES[*name])
        }
        Condition::Equal(name, number) => format!("{} = {number}", NAMES[*name]),
        Condition::Between {
            name,
            low,
            high,
            is_negated,
        } => {
            let not = if *is_negated { "NOT " } else { "" };
            format!("{} {not}BETWEEN {low} AND {high}", NAMES[*name])
        }
        Condition::IsNull(name, is_negated) => {
            let not = if *is_negated { "NOT " } else { "" };
            format!("{} IS {not}NULL", NAMES[*name])
        }
        Condition::In(name, items, is_negated) => {
            let not = if *is_negated { "NOT " } else { "" };
            let items: Vec<String> = items.iter().map(|item| format!("'{item}'")).collect();
            format!("{} {not}IN ({})", NAMES[*name], items.join(", "))
        }
        Condition::And(left, right) => format!("({}) AND ({})", render(left), render(right)),
        Condition::Or(left, right) => format!("({}) OR ({})", render(left), render(right)),
        Condition::Not(operand) => format!("NOT ({})", render(operand)),
    }
}

/// RocketMQ's three-valued outcome of `condition` on a message whose property `NAMES[i]` is
/// `values[i]`.
fn reference(condition: &Condition, values: &[Option<i64>]) -> Option<bool> {
    let and = |left: Option<bool>, right: Option<bool>| match (left, right) {
        (Some(false), _) | (_, Some(false)) => Some(false),
        (Some(true), Some(true)) => Some(true),
        _ => None,
    };
    let or = |left: Option<bool>, right: Option<bool>| match (left, right) {
        (Some(true), _) | (_, Some(true)) => Some(true),
        (Some(false), Some(false)) => Some(false),
        _ => None,
    };
    match condition {
        Condition::Compare(name, order, number) => values[*name].map(|value| match order {
            Order::Greater => value > *number,
            Order::GreaterOrEqual => value >= *number,
            Order::Less => value < *number,
            Order::LessOrEqual => value <= *number,
            Order::NotEqual => value != *number,
        }),
        Condition::Equal(name, number) => values[*name].map(|value| value == *number),
        Condition::Between {
            name,
            low,
            high,
            is_negated,
        } => {
            let value = values[*name];
            if *is_negated {
                or(value.map(|v| v < *low), value.map(|v| v > *high))
            } else {
                and(value.map(|v| v >= *low), value.map(|v| v <= *high))
            }
        }
        Condition::IsNull(name, is_negated) => Some(values[*name].is_none() != *is_negated),
        Condition::In(name, items, is_negated) => {
            values[*name].map(|value| items.contains(&value) != *is_negated)
        }
        Condition::And(left, right) => and(reference(left, values), reference(right, values)),
        Condition::Or(left, right) => or(reference(left, values), reference(right, values)),
        Condition::Not(operand) => reference(operand, values).map(|holds| !holds),
    }
}

fn condition() -> impl Strategy<Value = Condition> {
    let name = 0..NAMES.len();
    let number = -12i64..12;
    let order = prop::sample::select(vec![
        Order::Greater,
        Order::GreaterOrEqual,
        Order::Less,
        Order::LessOrEqual,
        Order::NotEqual,
    ]);
    let leaf = prop_oneof![
        (name.clone(), order, number.clone())
            .prop_map(|(name, order, number)| Condition::Compare(name, order, number)),
        (name.clone(), number.clone()).prop_map(|(name, number)| Condition::Equal(name, number)),
        (name.clone(), number.clone(), 0i64..8, any::<bool>()).prop_map(
            |(name, low, width, is_negated)| Condition::Between {
                name,
                low,
                high: low + width,
                is_negated,
            }
        ),
        (name.clone(), any::<bool>())
            .prop_map(|(name, is_negated)| Condition::IsNull(name, is_negated)),
        (name, prop::collection::vec(number, 1..4), any::<bool>())
            .prop_map(|(name, items, is_negated)| Condition::In(name, items, is_negated)),
    ];
    leaf.prop_recursive(5, 32, 2, |inner| {
        prop_oneof![
            (inner.clone(), inner.clone())
                .prop_map(|(left, right)| Condition::And(Box::new(left), Box::new(right))),
            (inner.clone(), inner.clone())
                .prop_map(|(left, right)| Condition::Or(Box::new(left), Box::new(right))),
            inner.prop_map(|operand| Condition::Not(Box::new(operand))),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn the_evaluator_agrees_with_the_reference(
        condition in condition(),
        values in prop::collection::vec(prop::option::weighted(0.8, -15i64..15), NAMES.len()),
    ) {
        let source = render(&condition);
        let expression = Expression::compile(&source)
            .unwrap_or_else(|error| panic!("{source:?} does not compile: {error}"));
        let texts: Vec<Option<String>> =
            values.iter().map(|value| value.map(|v| v.to_string())).collect();
        let lookup = |name: &str| {
            NAMES
                .iter()
                .position(|known| *known == name)
                .and_then(|index| texts[index].as_deref())
        };
        let expected = reference(&condition, &values) == Some(true);
        prop_assert_eq!(
            expression.matches(lookup),
            expected,
            "{} on {:?}",
            source,
            values
        );
    }
}
