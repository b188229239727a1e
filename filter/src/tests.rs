//! Unit tests: every operator, the NULL and conversion rules (checked on the three-valued
//! outcome, not only on "matches"), keywords, strings, limits and error positions.

use crate::evaluate::{condition, Abandon};
use crate::{Expression, ParseError, MAX_EXPRESSION_BYTES, MAX_IN_ITEMS, MAX_NESTING_DEPTH};

const T: Result<Option<bool>, Abandon> = Ok(Some(true));
const F: Result<Option<bool>, Abandon> = Ok(Some(false));
const NULL: Result<Option<bool>, Abandon> = Ok(None);
const ABANDONED: Result<Option<bool>, Abandon> = Err(Abandon);

fn compile(source: &str) -> Expression {
    Expression::compile(source).unwrap_or_else(|error| {
        let start: String = source.chars().take(80).collect();
        panic!("{start:?}: {error}")
    })
}

/// The three-valued outcome of `source` on a message with `properties`.
fn outcome(source: &str, properties: &[(&str, &str)]) -> Result<Option<bool>, Abandon> {
    let expression = compile(source);
    let lookup = |name: &str| {
        properties
            .iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| *value)
    };
    let result = condition(&expression.root, &lookup);
    assert_eq!(expression.matches(lookup), result == T, "{source:?}");
    result
}

fn error(source: &str) -> ParseError {
    match Expression::compile(source) {
        Ok(expression) => panic!("{source:?} compiled: {expression:?}"),
        Err(error) => error,
    }
}

fn error_at(source: &str, position: usize, needle: &str) {
    let error = error(source);
    assert_eq!(error.position, position, "{source:?}: {error}");
    assert!(
        error.message.contains(needle),
        "{source:?}: {error} does not mention {needle:?}"
    );
}

#[test]
fn rocketmq_documented_example() {
    let message = [("a", "1")];
    assert_eq!(outcome("a BETWEEN 0 AND 3", &message), T);
    assert_eq!(outcome("a > 5", &message), F);
}

#[test]
fn ordering_operators_read_properties_as_numbers() {
    let message = [("a", "10"), ("b", "9"), ("f", "2.5")];
    for (source, expected) in [
        ("a > 9", T),
        ("a > 10", F),
        ("a >= 10", T),
        ("a < 11", T),
        ("a < 10", F),
        ("a <= 10", T),
        ("a <= 9", F),
        ("9 < a", T),
        ("a > b", T), // as doubles, not as text ("10" < "9")
        ("a <= b", F),
        ("f > 2.4", T),
        ("f < 2.6", T),
        ("a > 9.5", T),
        ("a > 3000000000", F), // a long literal reads the property as a long
        ("a > -5", T),
        ("a > -(5)", T),
        ("a > - - 11", F),
        ("a > +9", T),
    ] {
        assert_eq!(outcome(source, &message), expected, "{source}");
    }
}

#[test]
fn equality_compares_text_with_text_and_converts_against_numbers() {
    let message = [("a", "1"), ("s", "hello"), ("d", "1.0"), ("t", "TRUE")];
    for (source, expected) in [
        ("a = 1", T),
        ("a = '1'", T),
        ("a <> 1", F),
        ("a <> 2", T),
        ("1 = a", T),
        ("a = 1.0", T), // Double.valueOf("1") = 1.0
        ("d = '1'", F), // text against text
        ("d = 1.0", T),
        ("s = 'hello'", T),
        ("s = 'Hello'", F), // case-sensitive values
        ("s <> 'x'", T),
        ("t = TRUE", T),  // Boolean.valueOf ignores case
        ("s = FALSE", T), // anything but "true" reads as false
        ("s = TRUE", F),
        ("a = 2147483648", F), // a long literal: Long.parseLong("1")
        ("TRUE = TRUE", T),
        ("TRUE <> FALSE", T),
        ("1 = 1", T),
        ("1 = 1.0", T),
        ("'x' = 'x'", T),
        ("1 = TRUE", F), // Integer against Boolean: "-1", never equal
    ] {
        assert_eq!(outcome(source, &message), expected, "{source}");
    }
}

#[test]
fn failed_conversions_abandon_the_whole_expression() {
    let message = [
        ("a", "abc"),
        ("b", "1.5"),
        ("n", "3"),
        ("big", "3000000000"),
    ];
    for source in [
        "a > 5",
        "a = 5",
        "a BETWEEN 1 AND 3",
        "b = 1", // Integer.parseInt("1.5") throws
        "b > 1",
        "big = 1", // Integer.parseInt overflows
        "a > n",   // two strings read as doubles
        "NOT (a > 5)",
        "a > 5 OR n = 3", // the left operand throws before the right is read
        "n = 3 AND a > 5",
        "TRUE = a", // RocketMQ casts the Boolean to String and throws
    ] {
        assert_eq!(outcome(source, &message), ABANDONED, "{source}");
    }
    // An operand that already decided stops the evaluation before the failing one.
    assert_eq!(outcome("n = 3 OR a > 5", &message), T);
    assert_eq!(outcome("n = 4 AND a > 5", &message), F);
    assert_eq!(outcome("big = 3000000000", &message), T);
    assert_eq!(outcome("b = 1.5", &message), T);
}

#[test]
fn missing_properties_are_null() {
    let none: [(&str, &str); 0] = [];
    for (source, expected) in [
        ("a > 5", NULL),
        ("a = 5", NULL),
        ("a = 'x'", NULL),
        ("a <> 'x'", NULL),
        ("NOT (a > 5)", NULL),
        ("a BETWEEN 1 AND 3", NULL),
        ("a NOT BETWEEN 1 AND 3", NULL),
        ("a IN ('1')", NULL),
        ("a NOT IN ('1')", NULL),
        ("a IS NULL", T),
        ("a IS NOT NULL", F),
        ("-a IS NULL", T),
        ("a > 5 OR TRUE", T),
        ("a > 5 OR FALSE", NULL),
        ("a > 5 AND FALSE", F),
        ("a > 5 AND TRUE", NULL),
        ("NULL", NULL),
        ("NOT NULL", NULL),
        ("NULL IS NULL", T),
        ("a = b", T),  // RocketMQ: both NULL compare equal
        ("5 = a", F),  // a value against a NULL right side is false...
        ("5 <> a", T), // ...so its negation is true
        ("a = 5 IS NULL", T),
        // The text tests answer false, never NULL, even negated.
        ("a CONTAINS 'x'", F),
        ("a NOT CONTAINS 'x'", F),
        ("a STARTSWITH 'x'", F),
        ("a NOT STARTSWITH 'x'", F),
        ("a ENDSWITH 'x'", F),
        ("a NOT ENDSWITH 'x'", F),
        ("NOT (a CONTAINS 'x')", T),
    ] {
        assert_eq!(outcome(source, &none), expected, "{source}");
    }
    assert_eq!(outcome("a = b", &[("a", "1")]), F);
    assert_eq!(outcome("a <> b", &[("a", "1")]), T);
    assert_eq!(outcome("a = b", &[("b", "1")]), NULL);
}

#[test]
fn three_valued_logic() {
    let message = [("t", "1"), ("f", "2")];
    let (yes, no, unknown) = ("t = 1", "f = 1", "missing = 1");
    for (left, right, and, or) in [
        (yes, yes, T, T),
        (yes, no, F, T),
        (yes, unknown, NULL, T),
        (no, no, F, F),
        (no, unknown, F, NULL),
        (unknown, unknown, NULL, NULL),
        (unknown, yes, NULL, T),
        (unknown, no, F, NULL),
    ] {
        assert_eq!(outcome(&format!("{left} AND {right}"), &message), and);
        assert_eq!(outcome(&format!("{left} OR {right}"), &message), or);
    }
    assert_eq!(outcome("NOT (t = 1)", &message), F);
    assert_eq!(outcome("NOT (f = 1)", &message), T);
    assert_eq!(outcome("NOT NOT (t = 1)", &message), T);
    assert_eq!(outcome("TRUE", &message), T);
    assert_eq!(outcome("FALSE", &message), F);
    assert_eq!(outcome("NOT FALSE", &message), T);
    // AND binds tighter than OR.
    assert_eq!(outcome("t = 1 OR f = 1 AND f = 3", &message), T);
    assert_eq!(outcome("(t = 1 OR f = 1) AND f = 3", &message), F);
}

#[test]
fn between_and_not_between() {
    for (value, between) in [
        ("1", F),
        ("2", T),
        ("5", T),
        ("10", T),
        ("11", F),
        ("2.5", ABANDONED),
    ] {
        let message = [("a", value)];
        assert_eq!(outcome("a BETWEEN 2 AND 10", &message), between, "{value}");
        let not_between = between.map(|holds| holds.map(|holds| !holds));
        assert_eq!(
            outcome("a NOT BETWEEN 2 AND 10", &message),
            not_between,
            "{value}"
        );
    }
    let message = [("a", "2.5"), ("low", "2"), ("high", "3")];
    assert_eq!(outcome("a BETWEEN 2.0 AND 3.5", &message), T);
    assert_eq!(outcome("a BETWEEN low AND high", &message), T);
    assert_eq!(outcome("a BETWEEN 2 AND 2", &[("a", "2")]), T);
    assert_eq!(outcome("a BETWEEN -5 AND -1", &[("a", "-3")]), T);
    // NOT BETWEEN does not check its bounds (RocketMQ's createNotBetween).
    assert_eq!(outcome("a NOT BETWEEN 10 AND 2", &[("a", "5")]), T);
}

#[test]
fn in_and_not_in() {
    let source = "a IN ('3', '4', '5', '4')";
    assert_eq!(outcome(source, &[("a", "4")]), T);
    assert_eq!(outcome(source, &[("a", "8")]), F);
    assert_eq!(outcome(source, &[("a", " 4")]), F);
    assert_eq!(outcome("a NOT IN ('3', '4')", &[("a", "8")]), T);
    assert_eq!(outcome("a NOT IN ('3', '4')", &[("a", "3")]), F);
    assert_eq!(outcome("a IN ('')", &[("a", "")]), T);
    let many: Vec<String> = (0..MAX_IN_ITEMS).map(|item| format!("'{item}'")).collect();
    let source = format!("a IN ({})", many.join(","));
    assert_eq!(outcome(&source, &[("a", "1023")]), T);
    assert_eq!(outcome(&source, &[("a", "1024")]), F);
}

#[test]
fn text_tests() {
    let message = [("v", "axb"), ("n", "12")];
    for (source, expected) in [
        ("v CONTAINS 'x'", T),
        ("v CONTAINS 'y'", F),
        ("v NOT CONTAINS 'x'", F),
        ("v NOT CONTAINS 'y'", T),
        ("v STARTSWITH 'ax'", T),
        ("v STARTSWITH 'xb'", F),
        ("v NOT STARTSWITH 'ax'", F),
        ("v ENDSWITH 'xb'", T),
        ("v ENDSWITH 'ax'", F),
        ("v NOT ENDSWITH 'q'", T),
        ("v CONTAINS ''", F),
        ("v NOT CONTAINS ''", F),
        ("'axb' CONTAINS 'x'", T),
        ("' ' STARTSWITH ' '", T),
        ("n CONTAINS '2'", T),
        ("12 CONTAINS '2'", F), // a number is not a string
        ("-n CONTAINS '2'", F),
        ("(n = 12) CONTAINS 'true'", F),
    ] {
        assert_eq!(outcome(source, &message), expected, "{source}");
    }
}

#[test]
fn keywords_ignore_case_and_properties_do_not() {
    let message = [("a", "3"), ("A", "4"), ("tags", "x")];
    assert_eq!(outcome("a = 3 and A = 4", &message), T);
    assert_eq!(
        outcome("a = 3 AnD a NoT bEtWeEn 5 AnD 6 oR FaLsE", &message),
        T
    );
    assert_eq!(outcome("a is not null and tags In ('x')", &message), T);
    assert_eq!(
        outcome(
            "tags contains 'x' and tags startsWith 'x' and tags EndsWith 'x'",
            &message
        ),
        T
    );
    assert_eq!(outcome("true = True", &message), T);
    assert_eq!(outcome("a = 3l", &message), T);
    assert_eq!(
        outcome("$x_1 IS NULL AND _y IS NULL AND notx IS NULL", &message),
        T
    );
}

#[test]
fn strings_and_literals() {
    let message = [
        ("q", "it's"),
        ("e", ""),
        ("n", "line\nbreak"),
        ("TAGS", "''tag''"),
    ];
    assert_eq!(outcome("q = 'it''s'", &message), T);
    assert_eq!(outcome("e = ''", &message), T);
    assert_eq!(outcome("n = 'line\nbreak'", &message), T);
    assert_eq!(outcome("TAGS = '''''tag'''''", &message), T);
    assert_eq!(outcome("'é' = 'é'", &message), T);
    let number = [("x", "31415000000")];
    assert_eq!(outcome("x > 3.1E10", &number), T);
    assert_eq!(outcome("x > 3.1e+10 AND x < .5E11", &number), T);
    assert_eq!(outcome("x > 5.", &number), T);
    assert_eq!(outcome("x = 31415000000", &number), T);
    assert_eq!(outcome("x > 3E10", &number), T);
    assert_eq!(outcome("0 = 0", &number), T);
    assert_eq!(
        outcome(
            "-- a comment\nx > 1.5 /* and\nanother */ AND x < 1E11 -- tail",
            &number
        ),
        T
    );
    assert_eq!(outcome("x IS NOT NULL--", &number), T);
}

#[test]
fn properties_are_listed_sorted_and_once() {
    let expression =
        compile("b = 1 AND a IN ('x') OR c CONTAINS 'y' AND b BETWEEN 1 AND 2 OR -d > 1");
    assert_eq!(expression.properties(), ["a", "b", "c", "d"]);
    assert_eq!(compile("TRUE").properties(), [] as [String; 0]);
    assert_eq!(compile("  a = 1 ").source(), "  a = 1 ");
}

#[test]
fn error_display_names_the_position() {
    let error = error("a = ");
    assert_eq!(
        error.to_string(),
        format!("at position 4: {}", error.message)
    );
}

#[test]
fn malformed_expressions_report_where() {
    error_at("a = 'abc", 4, "unterminated string");
    error_at("a = ", 4, "expected a value");
    error_at("a > 1 AND", 9, "expected a value");
    error_at("a ! 1", 2, "unexpected character '!'");
    error_at("a != 1", 2, "unexpected character '!'");
    error_at("a = 1 # b", 6, "unexpected character '#'");
    error_at("(a = 1", 6, "expected ')'");
    error_at("((a = 1)", 8, "expected ')'");
    error_at("a = 1)", 5, "unexpected ')'");
    error_at("a = 1 b = 2", 6, "unexpected property b");
    error_at("a = 1 NOT", 6, "unexpected keyword NOT");
    error_at("", 0, "expected a value");
    error_at("   ", 3, "expected a value");
    error_at("a = 1 /* open", 6, "unterminated comment");
    error_at("a = 007", 4, "cannot start with 0");
    error_at("é = 1", 0, "unexpected character");
    error_at("a = 'é' AND é", 12, "unexpected character"); // a character offset, not bytes
    error_at("a IS 5", 5, "NULL or NOT NULL");
    error_at("a IS NOT 5", 9, "NULL after IS NOT");
    error_at("a BETWEEN 1 OR 2", 12, "AND between");
    error_at("a IN 'x'", 5, "'(' after IN");
    error_at("a IN ()", 6, "expected a quoted string");
    error_at("a IN ('x' 'y')", 10, "',' or ')'");
    error_at("a IN ('x', 1)", 11, "expected a quoted string");
    error_at("a CONTAINS x", 11, "quoted string after CONTAINS");
    error_at("a NOT STARTSWITH 1", 17, "quoted string after STARTSWITH");
    error_at("a ENDSWITH", 10, "quoted string after ENDSWITH");
    error_at("a = 1 == 2", 7, "expected a value");
}

#[test]
fn non_conditions_are_refused() {
    error_at("a", 0, "property a is not a condition");
    error_at("1", 0, "expected a condition but found 1");
    error_at("'x'", 0, "expected a condition");
    error_at("-a", 0, "expected a condition");
    error_at("(a)", 0, "property a is not a condition");
    error_at("a = 1 AND b", 10, "property b is not a condition");
    error_at("a OR b = 1", 0, "property a is not a condition");
    error_at("NOT a = 1", 4, "property a is not a condition");
    error_at("NOT 5", 4, "expected a condition");
    error_at("1 + 2", 2, "unexpected '+'"); // no arithmetic in RocketMQ's grammar
    error_at("a * 2 > 1", 2, "unexpected character '*'");
}

#[test]
fn operand_checks_follow_rocketmq() {
    // checkLessThanOperand: only numbers, properties and negations are ordered.
    error_at("a > 'x'", 4, "cannot be compared with >");
    error_at("'x' < a", 0, "cannot be compared with >");
    error_at("a > TRUE", 4, "cannot be compared");
    error_at("a > NULL", 4, "cannot be compared");
    error_at("a > 1 > 2", 0, "cannot be compared");
    error_at("a BETWEEN 'a' AND 'b'", 10, "cannot be compared");
    // checkEqualOperand and checkEqualOperandCompatability.
    error_at("a = NULL", 4, "use IS NULL");
    error_at("NULL <> a", 0, "use IS NULL");
    error_at("TRUE = 1", 7, "TRUE cannot be compared with 1");
    assert_eq!(outcome("1 = TRUE", &[]), F); // only one direction is checked
                                             // createBetween: non-NULL constant bounds, low <= high.
    error_at("a BETWEEN 10 AND 0", 10, "low bound must not exceed");
    error_at(" a between 10 and 0", 11, "low bound must not exceed");
    error_at("a BETWEEN NULL AND 3", 10, "cannot be NULL");
    error_at("a BETWEEN 'x' AND 3", 10, "low bound must not exceed");
    // createInFilter: a property on the left.
    error_at("'x' IN ('x')", 0, "IN needs a property");
    error_at("(a) = 1 AND 5 IN ('5')", 12, "IN needs a property");
    // Literals.
    error_at("a > 100000000000000000000000", 4, "does not fit");
    error_at("a > 1e400", 4, "larger than the largest double");
    error_at("a > 0.0", 4, "write 0");
    error_at("a > 1e-400", 4, "below the smallest");
    error_at("a and between 2 and 10", 6, "expected a value");
}

#[test]
fn limits_are_enforced() {
    let long = format!("a = '{}'", "x".repeat(MAX_EXPRESSION_BYTES));
    error_at(&long, 0, "over max_expression_bytes (16384)");
    let fits = format!("a = '{}'", "x".repeat(MAX_EXPRESSION_BYTES - 6));
    assert_eq!(fits.len(), MAX_EXPRESSION_BYTES);
    compile(&fits);

    let nested = |depth: usize| format!("{}a = 1{}", "(".repeat(depth), ")".repeat(depth));
    compile(&nested(MAX_NESTING_DEPTH));
    error_at(
        &nested(MAX_NESTING_DEPTH + 1),
        MAX_NESTING_DEPTH,
        "max_nesting_depth (64)",
    );
    let nots = |depth: usize| format!("{}TRUE", "NOT ".repeat(depth));
    compile(&nots(MAX_NESTING_DEPTH - 1));
    error(&nots(MAX_NESTING_DEPTH + 1));
    let minus = format!("a = {}1", "- ".repeat(MAX_NESTING_DEPTH + 1));
    error_at(&minus, 4 + 2 * MAX_NESTING_DEPTH, "max_nesting_depth");
    // A chain of equalities grows the tree, not the parser's recursion.
    let chain = format!("a = 1{}", " = TRUE".repeat(MAX_NESTING_DEPTH));
    error_at(&chain, 0, "max_nesting_depth");
    // Long AND/OR chains are flat and fine.
    let wide: Vec<String> = (0..800).map(|item| format!("p{item} IS NULL")).collect();
    let wide = compile(&wide.join(" AND "));
    assert!(wide.matches(|_| None));
    assert_eq!(wide.properties().len(), 800);

    let items = |count: usize| {
        let items: Vec<String> = (0..count).map(|item| format!("'{item}'")).collect();
        format!("a IN ({})", items.join(","))
    };
    compile(&items(MAX_IN_ITEMS));
    let too_many = items(MAX_IN_ITEMS + 1);
    let last_item = too_many
        .rfind('\'')
        .and_then(|end| too_many[..end].rfind('\''));
    error_at(&too_many, last_item.unwrap_or(0), "max_in_items (1024)");
}

#[test]
fn documented_examples() {
    // The examples table of docs/sql-filter.md.
    let message = [
        ("a", "1"),
        ("s", "hello"),
        ("TAGS", "TagA"),
        ("price", "12.50"),
    ];
    for (source, expected) in [
        ("a BETWEEN 0 AND 3", T),
        ("a > 5", F),
        ("a = '1'", T),
        ("a = 1", T),
        ("a = 1.0", T),
        ("price > 10", ABANDONED),
        ("price > 10.0", T),
        ("s IN ('hello', 'hi') AND TAGS <> 'TagB'", T),
        ("missing > 5 OR s = 'hello'", T),
        ("NOT (missing > 5)", NULL),
        ("missing IS NULL", T),
        ("s STARTSWITH 'he' AND s NOT ENDSWITH 'x'", T),
        ("s = FALSE", T),
        ("-0.5 < a", T),
    ] {
        assert_eq!(outcome(source, &message), expected, "{source}");
    }
}
