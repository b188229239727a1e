//! RocketMQ's own filter tests (`filter/src/test/.../ExpressionTest.java` and `ParserTest.java`
//! in apache/rocketmq), adapted: property values are strings here, as they are on a broker
//! (RocketMQ's tests also feed Java numbers, which a message cannot carry), and "evaluates to
//! false or throws" is "does not match".

use shardmq_filter::Expression;

fn matches(source: &str, properties: &[(&str, &str)]) -> bool {
    let expression =
        Expression::compile(source).unwrap_or_else(|error| panic!("{source}: {error}"));
    expression.matches(|name| {
        properties
            .iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| *value)
    })
}

const AND: &str = "a=3 and b<>4 And c>5 AND d<=4";
const OR: &str = "a=3 or b<>4 Or c>5 OR d<=4";
const IN: &str = "a in ('3', '4', '5')";
const NOT_IN: &str = "a not in ('3', '4', '5')";
const BETWEEN: &str = "a between 2 and 10";
const NOT_BETWEEN: &str = "a not between 2 and 10";

#[test]
fn contains_startswith_endswith() {
    let axb = [("value", "axb")];
    for (source, expected) in [
        ("value contains 'x'", true),
        ("value startswith 'ax'", true),
        ("value endswith 'xb'", true),
        ("value not contains 'x'", false),
        ("value not startswith 'ax'", false),
        ("value not endswith 'xb'", false),
        ("value contains ''", false),
        ("value not contains ''", false),
        ("value not startswith ''", false),
        ("'axb' contains 'x'", true),
        ("'axb' not endswith 'u'", true),
        ("' ' contains ' '", true),
        ("' ' not startswith ' '", false),
        ("'axb' contains '.'", false),
        ("'s' contains '\\'", false),
    ] {
        assert_eq!(matches(source, &axb), expected, "{source}");
    }
    let abb = [("value", "abb")];
    assert!(!matches("value contains 'x'", &abb));
    assert!(matches("value not startswith 'x'", &abb));
    for source in [
        "value contains 'x'",
        "value not contains 'x'",
        "value not endswith 'x'",
    ] {
        assert!(!matches(source, &[]), "{source}");
    }
    for source in [
        "value contains x",
        "value not contains 123",
        "'axb' contains ",
        "'axb' not contains ",
    ] {
        assert!(Expression::compile(source).is_err(), "{source}");
    }
}

#[test]
fn all_in_one() {
    let message = [("a", "3"), ("b", "3"), ("c", "axbdc")];
    for test in ["contains", "startswith", "endswith"] {
        let source =
            format!("a not in ('4', '4', '5') and b between 3 and 10 and c not {test} 'axbc'");
        assert!(matches(&source, &message), "{source}");
    }
}

#[test]
fn quotes_in_strings() {
    let source = "TAGS is not null and TAGS='''''tag'''''";
    assert!(matches(source, &[("TAGS", "''tag''")]));
}

#[test]
fn strings_that_are_not_numbers_do_not_match() {
    assert!(!matches("a between up and low", &[("a", "3.14")]));
    assert!(!matches(
        "a between up and low",
        &[("a", "3.14"), ("up", "up"), ("low", "low")]
    ));
    assert!(!matches(
        "key is not null and key between 0 and 100",
        &[("key", "con")]
    ));
    assert!(!matches("a between 0 and 100", &[("a", "abc")]));
    assert!(matches("a=b", &[("a", "3.14"), ("b", "3.14")]));
    assert!(!matches("a<>b", &[("a", "3.14"), ("b", "3.14")]));
    assert!(matches("a<>b", &[("a", "3.14"), ("b", "3.141")]));
}

#[test]
fn numbers() {
    assert!(matches("a > 3.1E10", &[("a", "3.1415E10")]));
    assert!(matches("a > 3.14", &[("a", "3.1415")]));
    assert!(!matches("a > b", &[("a", "10"), ("b", "20")]));
    assert!(matches("a > b", &[("b", "10"), ("a", "20")]));
}

#[test]
fn null_or() {
    let source = "a is null OR a='hello'";
    assert!(matches(source, &[]));
    assert!(matches(source, &[("a", "hello")]));
    assert!(!matches(source, &[("a", "abc")]));
}

#[test]
fn booleans() {
    let source = "a=TRUE OR b=FALSE";
    assert!(matches(source, &[("a", "true"), ("b", "false")]));
    assert!(!matches(source, &[("a", "false"), ("b", "true")]));
}

#[test]
fn equal() {
    let source = "a is not null and a='hello'";
    assert!(matches(source, &[("a", "hello")]));
    assert!(!matches(source, &[]));
}

#[test]
fn and_or() {
    assert!(matches(
        AND,
        &[("a", "3"), ("b", "5"), ("c", "6"), ("d", "1")]
    ));
    assert!(!matches(
        AND,
        &[("a", "4"), ("b", "5"), ("c", "6"), ("d", "1")]
    ));
    assert!(matches(OR, &[("a", "3")]));
    assert!(matches(OR, &[("a", "4"), ("b", "5")]));
    assert!(matches(OR, &[("a", "4"), ("b", "4"), ("c", "6")]));
    assert!(matches(
        OR,
        &[("a", "4"), ("b", "4"), ("c", "3"), ("d", "2")]
    ));
    assert!(!matches(
        OR,
        &[("a", "4"), ("b", "4"), ("c", "3"), ("d", "10")]
    ));
}

#[test]
fn in_not_in() {
    for value in ["3", "4", "5"] {
        assert!(matches(IN, &[("a", value)]));
        assert!(!matches(NOT_IN, &[("a", value)]));
    }
    assert!(!matches(IN, &[("a", "8")]));
    assert!(matches(NOT_IN, &[("a", "8")]));
}

#[test]
fn between_not_between() {
    for value in ["2", "10", "3"] {
        assert!(matches(BETWEEN, &[("a", value)]));
        assert!(!matches(NOT_BETWEEN, &[("a", value)]));
    }
    for value in ["1", "11"] {
        assert!(!matches(BETWEEN, &[("a", value)]));
        assert!(matches(NOT_BETWEEN, &[("a", value)]));
    }
}

#[test]
fn is_null_is_not_null() {
    assert!(matches("a is null", &[("abc", "2")]));
    assert!(!matches("a is null", &[("a", "2")]));
    assert!(matches("a is not null", &[("a", "2")]));
    assert!(!matches("a is not null", &[("abc", "2")]));
}

#[test]
fn parser_accepts_and_refuses_what_rocketmq_does() {
    for source in [
        AND,
        "a=3  and    b<>4 And c>5 AND d<=4",
        OR,
        IN,
        "(a not in ('6', '4', '5')) or (b in ('3', '4', '5'))",
        "(a between 2 and 10) AND (b not between 6 and 9)",
        "a is null",
        "a is not null",
        "a <= now",
        "a=3 and b contains 'xxx' and c not contains 'xxx'",
    ] {
        Expression::compile(source).unwrap_or_else(|error| panic!("{source}: {error}"));
    }
    let huge_float = format!("a > 1{}.{}", "1".repeat(2048 * 51), "1".repeat(10));
    for source in [
        "a and between 2 and 10",
        "a > 100000000000000000000000",
        " a between 10 and 0",
        huge_float.as_str(),
    ] {
        assert!(
            Expression::compile(source).is_err(),
            "{}",
            &source[..source.len().min(40)]
        );
    }
}
