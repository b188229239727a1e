//! Property tests: random expressions on random messages never panic, and on messages where an
//! expression and all its operands are known (no NULL, no failed conversion), `NOT (e)` matches
//! exactly when `e` does not.

use proptest::prelude::*;
use shardmq_filter::Expression;

const NAMES: [&str; 4] = ["a", "b", "c", "TAGS"];

/// A condition over `NAMES` whose every operand is a number or a string compared as text, so
/// that on a message giving every name an integer value it is never NULL and never abandoned.
fn known_condition() -> impl Strategy<Value = String> {
    let name = prop::sample::select(NAMES.to_vec());
    let number = -20i64..20;
    let leaf = prop_oneof![
        (
            name.clone(),
            prop::sample::select(vec!["=", "<>", ">", ">=", "<", "<="]),
            number.clone()
        )
            .prop_map(|(name, operator, number)| format!("{name} {operator} {number}")),
        (name.clone(), number.clone(), 0i64..10, any::<bool>()).prop_map(
            |(name, low, width, is_negated)| {
                let not = if is_negated { "NOT " } else { "" };
                format!("{name} {not}BETWEEN {low} AND {}", low + width)
            }
        ),
        (
            name.clone(),
            prop::collection::vec(number.clone(), 1..4),
            any::<bool>()
        )
            .prop_map(|(name, items, is_negated)| {
                let items: Vec<String> = items.iter().map(|item| format!("'{item}'")).collect();
                let not = if is_negated { "NOT " } else { "" };
                format!("{name} {not}IN ({})", items.join(", "))
            }),
        (name.clone(), any::<bool>()).prop_map(|(name, is_negated)| {
            format!("{name} IS {}NULL", if is_negated { "NOT " } else { "" })
        }),
        (
            name.clone(),
            0i64..10,
            prop::sample::select(vec!["CONTAINS", "STARTSWITH", "ENDSWITH"])
        )
            .prop_map(|(name, digit, test)| format!("{name} {test} '{digit}'")),
        (name.clone(), number.clone()).prop_map(|(name, number)| format!("{name} = '{number}'")),
        (name, number).prop_map(|(name, number)| format!("{name} > {number}.5")),
    ];
    leaf.prop_recursive(4, 24, 2, |inner| {
        prop_oneof![
            (inner.clone(), inner.clone())
                .prop_map(|(left, right)| format!("({left}) AND ({right})")),
            (inner.clone(), inner.clone()).prop_map(|(left, right)| format!("{left} OR {right}")),
            inner.prop_map(|operand| format!("NOT ({operand})")),
        ]
    })
}

fn lookup<'a>(message: &'a [(String, String)]) -> impl Fn(&str) -> Option<&'a str> + 'a {
    move |name| {
        message
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }
}

proptest! {
    #[test]
    fn not_negates_a_known_condition(
        condition in known_condition(),
        values in prop::collection::vec(-25i64..25, NAMES.len()),
    ) {
        let message: Vec<(String, String)> = NAMES
            .iter()
            .zip(&values)
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect();
        let expression = Expression::compile(&condition).unwrap();
        let negation = Expression::compile(&format!("NOT ({condition})")).unwrap();
        prop_assert_eq!(negation.matches(lookup(&message)), !expression.matches(lookup(&message)));
    }

    #[test]
    fn generated_conditions_never_panic_on_any_message(
        condition in known_condition(),
        message in prop::collection::vec(
            (prop::sample::select(NAMES.to_vec()), prop_oneof![
                "-?[0-9]{1,12}", "[0-9]*\\.[0-9]*", ".{0,6}", Just("true".to_owned()),
                Just("NaN".to_owned()), Just("-Infinity".to_owned()),
            ]),
            0..5,
        ),
    ) {
        let message: Vec<(String, String)> =
            message.into_iter().map(|(name, value)| (name.to_owned(), value)).collect();
        let expression = Expression::compile(&condition).unwrap();
        let _ = expression.matches(lookup(&message));
    }

    #[test]
    fn arbitrary_text_never_panics(
        source in prop_oneof![
            ".{0,80}",
            "[ a-cA-C0-9'().,=<>+\\-*/]{0,60}",
            prop::collection::vec(prop::sample::select(vec![
                "a", "b", "NOT", "AND", "OR", "IN", "BETWEEN", "IS", "NULL", "TRUE", "FALSE",
                "CONTAINS", "STARTSWITH", "ENDSWITH", "(", ")", ",", "=", "<>", "<", ">=", "-",
                "+", "1", "2.5", "'x'", "''", "0", "1e3", "--", "/*", "*/",
            ]), 0..24).prop_map(|tokens| tokens.join(" ")),
        ],
        message in prop::collection::vec((prop::sample::select(vec!["a", "b"]), ".{0,8}"), 0..3),
    ) {
        if let Ok(expression) = Expression::compile(&source) {
            let message: Vec<(String, String)> =
                message.into_iter().map(|(name, value)| (name.to_owned(), value)).collect();
            let _ = expression.matches(lookup(&message));
            prop_assert!(expression.properties().windows(2).all(|pair| pair[0] < pair[1]));
        }
    }
}
