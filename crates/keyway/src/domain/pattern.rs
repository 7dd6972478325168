//! Event patterns: the filter policy language of Amazon SNS message bodies, which EventBridge
//! patterns and Lambda's FilterCriteria share. A pattern is compiled once (`Pattern::parse`),
//! refusing anything malformed with the place and the problem, and then only matches: a compiled
//! pattern cannot fail on an event.
//!
//! What it matches, as the documentation states it:
//! - every key of a pattern must match (AND), any value listed for a key may (OR); `$or` at any
//!   level of the pattern takes a list of alternative patterns, one of which must match;
//! - a nested object in the pattern matches the event's object at that key;
//! - exact values: strings (case-sensitive), numbers compared exactly as numbers
//!   (`domain::number`: 5 equals 5.0, and integers that only 64 bits tell apart are not equal),
//!   `true`, `false`, `null`;
//! - `prefix` and `suffix` (optionally `{"equals-ignore-case": ...}`), `equals-ignore-case`,
//!   `anything-but` (a value, a list of strings or of numbers, or `{"prefix"|"suffix"|
//!   "equals-ignore-case": ...}`), `numeric` (=, <, <=, >, >= and a range of a lower and an upper
//!   bound), `exists` (true: the key has a value; false: it has none);
//! - an array in the event matches when any of its elements matches; an empty array, like an
//!   object where the pattern expects a value, has no value there.
//!
//! Two dialects differ in two points (`Dialect`). SNS, the language of subscriptions, compares
//! exact numbers as numbers (5 equals 5.0) and limits a policy to five keys and 150 combinations
//! of values (the product of the number of values of every key, with the alternatives of `$or`
//! added). EventBridge, whose patterns Lambda's FilterCriteria use, compares numbers as written
//! (300 is not 300.0) and has neither limit. Both keep `numeric` between -1e9 and 1e9.

use std::cmp::Ordering;
use std::fmt;

use serde_json::{Map, Value};

use super::number::Number;

/// Most value combinations an SNS filter policy may have (SNS filter policy constraints).
pub const MAX_COMBINATIONS: u64 = 150;
/// Most keys with values an SNS filter policy may have; nested objects do not count.
pub const MAX_KEYS: usize = 5;

/// Which service's rules a pattern follows where SNS and EventBridge differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// SNS filter policies: numbers equal by value, at most `MAX_KEYS` keys and
    /// `MAX_COMBINATIONS` combinations.
    Sns,
    /// EventBridge patterns and Lambda's FilterCriteria: numbers equal as written (an integer
    /// never equals a number written with a fraction or exponent), no key or combination limit.
    EventBridge,
}
/// Largest magnitude of a number in `numeric` matching.
const NUMERIC_LIMIT: f64 = 1e9;

/// A pattern refused at parse time: where (a JSON pointer into the pattern) and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("pattern at {path}: {problem}")]
pub struct PatternError {
    /// A JSON pointer to the refused part of the pattern.
    pub path: String,
    /// What is wrong with it.
    pub problem: String,
}

/// A compiled pattern.
#[derive(Clone, Debug, PartialEq)]
pub struct Pattern {
    root: Node,
}

/// One object level of a pattern: its keys, all of which must match, and its `$or` lists, each
/// of which needs one alternative to match.
#[derive(Clone, Debug, PartialEq, Default)]
struct Node {
    fields: Vec<(String, Field)>,
    any_of: Vec<Vec<Node>>,
}

#[derive(Clone, Debug, PartialEq)]
enum Field {
    Nested(Node),
    /// Any of these matches a value at the key.
    Values(Vec<Matcher>),
}

#[derive(Clone, Debug, PartialEq)]
enum Matcher {
    Exact(Scalar),
    Prefix { text: String, ignore_case: bool },
    Suffix { text: String, ignore_case: bool },
    EqualsIgnoreCase(String),
    AnythingBut(AnythingBut),
    Numeric(Vec<(Comparison, f64)>),
    Exists(bool),
}

#[derive(Clone, Debug, PartialEq)]
enum AnythingBut {
    /// None of these values.
    Values(Vec<Scalar>),
    Prefix(String),
    Suffix(String),
    /// None of these, compared ignoring case.
    IgnoreCase(Vec<String>),
}

#[derive(Clone, Debug, PartialEq)]
enum Scalar {
    String(String),
    /// A number; `as_written` in the EventBridge dialect, where an integer never equals a
    /// number written with a fraction or exponent.
    Number {
        value: Number,
        as_written: bool,
    },
    Bool(bool),
    Null,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Comparison {
    Eq,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Pattern {
    /// A pattern that matches every event (an empty pattern `{}`).
    pub fn everything() -> Self {
        Self {
            root: Node::default(),
        }
    }

    /// Compiles an SNS filter policy, or says where and why it is not one.
    pub fn parse(pattern: &Value) -> Result<Self, PatternError> {
        Self::parse_in(pattern, Dialect::Sns)
    }

    /// Compiles `pattern` by the rules of `dialect`.
    pub fn parse_in(pattern: &Value, dialect: Dialect) -> Result<Self, PatternError> {
        let mut path = Path {
            parts: Vec::new(),
            dialect,
        };
        let root = node(pattern, &mut path)?;
        if dialect == Dialect::Sns {
            let keys = root.keys();
            if keys > MAX_KEYS {
                return path.error(format!(
                    "{keys} keys with values; a filter policy may have at most {MAX_KEYS}"
                ));
            }
            let combinations = root.combinations();
            if combinations > MAX_COMBINATIONS {
                return path.error(format!(
                    "{combinations} combinations of values; a filter policy may have at most \
                     {MAX_COMBINATIONS} (the product of the number of values of every key)"
                ));
            }
        }
        Ok(Self { root })
    }

    /// Parses the JSON text of a pattern of `dialect`.
    pub fn parse_str(text: &str, dialect: Dialect) -> Result<Self, PatternError> {
        let value: Value = serde_json::from_str(text).map_err(|e| PatternError {
            path: "/".into(),
            problem: format!("not JSON: {e}"),
        })?;
        Self::parse_in(&value, dialect)
    }

    /// Whether `event` matches.
    pub fn matches(&self, event: &Value) -> bool {
        self.root.matches(Some(event))
    }

    /// Whether this pattern matches every event.
    pub fn is_everything(&self) -> bool {
        self.root.fields.is_empty() && self.root.any_of.is_empty()
    }
}

/// Where in the pattern parsing is, as a JSON pointer, and by which rules.
struct Path {
    parts: Vec<String>,
    dialect: Dialect,
}

impl Path {
    fn error<T>(&self, problem: impl fmt::Display) -> Result<T, PatternError> {
        let mut path = String::new();
        for part in &self.parts {
            path.push('/');
            path.push_str(&part.replace('~', "~0").replace('/', "~1"));
        }
        Err(PatternError {
            path: if path.is_empty() { "/".into() } else { path },
            problem: problem.to_string(),
        })
    }

    fn within<T>(&mut self, part: impl ToString, f: impl FnOnce(&mut Self) -> T) -> T {
        self.parts.push(part.to_string());
        let out = f(self);
        self.parts.pop();
        out
    }
}

fn node(value: &Value, path: &mut Path) -> Result<Node, PatternError> {
    let Value::Object(object) = value else {
        return path.error(format!(
            "expected an object of keys, got {}",
            kind_of(value)
        ));
    };
    let mut node = Node::default();
    for (key, value) in object {
        if key == "$or" {
            let alternatives = path.within(key, |path| any_of(value, path))?;
            node.any_of.push(alternatives);
            continue;
        }
        let field = path.within(key, |path| match value {
            Value::Object(_) => node_or_empty(value, path).map(Field::Nested),
            Value::Array(values) => matchers(values, path).map(Field::Values),
            other => path.error(format!(
                "expected a list of values or a nested object, got {} (write [{other}])",
                kind_of(other)
            )),
        })?;
        node.fields.push((key.clone(), field));
    }
    Ok(node)
}

fn node_or_empty(value: &Value, path: &mut Path) -> Result<Node, PatternError> {
    if value.as_object().is_some_and(Map::is_empty) {
        return path.error("an empty object matches nothing; leave the key out instead");
    }
    node(value, path)
}

fn any_of(value: &Value, path: &mut Path) -> Result<Vec<Node>, PatternError> {
    let Value::Array(alternatives) = value else {
        return path.error(format!(
            "$or takes a list of patterns, got {}",
            kind_of(value)
        ));
    };
    if alternatives.len() < 2 {
        return path.error("$or takes at least two alternative patterns");
    }
    alternatives
        .iter()
        .enumerate()
        .map(|(i, alternative)| path.within(i, |path| node_or_empty(alternative, path)))
        .collect()
}

fn matchers(values: &[Value], path: &mut Path) -> Result<Vec<Matcher>, PatternError> {
    if values.is_empty() {
        return path.error("an empty list matches nothing; list at least one value");
    }
    values
        .iter()
        .enumerate()
        .map(|(i, value)| path.within(i, |path| matcher(value, path)))
        .collect()
}

fn matcher(value: &Value, path: &mut Path) -> Result<Matcher, PatternError> {
    let Value::Object(object) = value else {
        return scalar(value, path).map(Matcher::Exact);
    };
    let mut entries = object.iter();
    let (Some((operator, operand)), None) = (entries.next(), entries.next()) else {
        return path.error(format!(
            "a matcher is an object of exactly one operator, got {} keys",
            object.len()
        ));
    };
    path.within(operator, |path| match operator.as_str() {
        "prefix" => {
            affix(operand, path).map(|(text, ignore_case)| Matcher::Prefix { text, ignore_case })
        }
        "suffix" => {
            affix(operand, path).map(|(text, ignore_case)| Matcher::Suffix { text, ignore_case })
        }
        "equals-ignore-case" => {
            text(operand, path).map(|s| Matcher::EqualsIgnoreCase(s.to_lowercase()))
        }
        "anything-but" => anything_but(operand, path).map(Matcher::AnythingBut),
        "numeric" => numeric(operand, path).map(Matcher::Numeric),
        "exists" => match operand {
            Value::Bool(exists) => Ok(Matcher::Exists(*exists)),
            other => path.error(format!(
                "exists takes true or false, got {}",
                kind_of(other)
            )),
        },
        other => path.error(format!(
            "unknown operator {other:?}; expected one of prefix, suffix, equals-ignore-case, \
             anything-but, numeric, exists"
        )),
    })
}

fn scalar(value: &Value, path: &mut Path) -> Result<Scalar, PatternError> {
    Ok(match value {
        Value::String(s) => Scalar::String(s.clone()),
        Value::Number(n) => {
            let value = Number::of(n);
            if let Some(why) = value.inexact() {
                return path.error(format!("{n} {why}"));
            }
            Scalar::Number {
                value,
                as_written: path.dialect == Dialect::EventBridge,
            }
        }
        Value::Bool(b) => Scalar::Bool(*b),
        Value::Null => Scalar::Null,
        Value::Array(_) => return path.error("a list inside a list of values"),
        Value::Object(_) => unreachable!("objects are matchers"),
    })
}

fn number(n: &serde_json::Number, path: &mut Path) -> Result<f64, PatternError> {
    match n.as_f64() {
        Some(f) if f.is_finite() => Ok(f),
        _ => path.error(format!("{n} is not a finite number")),
    }
}

fn text(value: &Value, path: &mut Path) -> Result<String, PatternError> {
    match value {
        Value::String(s) => Ok(s.clone()),
        other => path.error(format!("expected a string, got {}", kind_of(other))),
    }
}

/// The operand of `prefix` or `suffix`: a string, or `{"equals-ignore-case": string}`.
fn affix(value: &Value, path: &mut Path) -> Result<(String, bool), PatternError> {
    match value {
        Value::String(s) => Ok((s.clone(), false)),
        Value::Object(object) if object.len() == 1 && object.contains_key("equals-ignore-case") => {
            path.within("equals-ignore-case", |path| {
                text(&object["equals-ignore-case"], path).map(|s| (s.to_lowercase(), true))
            })
        }
        other => path.error(format!(
            "expected a string or {{\"equals-ignore-case\": string}}, got {}",
            kind_of(other)
        )),
    }
}

fn anything_but(value: &Value, path: &mut Path) -> Result<AnythingBut, PatternError> {
    match value {
        Value::String(_) | Value::Number(_) => Ok(AnythingBut::Values(vec![scalar(value, path)?])),
        Value::Array(values) => {
            let strings = values.iter().all(Value::is_string);
            let numbers = values.iter().all(Value::is_number);
            if values.is_empty() || !(strings || numbers) {
                return path.error("expected a non-empty list of only strings or only numbers");
            }
            let values = values
                .iter()
                .enumerate()
                .map(|(i, v)| path.within(i, |path| scalar(v, path)))
                .collect::<Result<_, _>>()?;
            Ok(AnythingBut::Values(values))
        }
        Value::Object(object) if object.len() == 1 => {
            let (operator, operand) = object.iter().next().expect("one entry");
            path.within(operator, |path| match operator.as_str() {
                "prefix" => text(operand, path).map(AnythingBut::Prefix),
                "suffix" => text(operand, path).map(AnythingBut::Suffix),
                "equals-ignore-case" => match operand {
                    Value::Array(values) if !values.is_empty() => values
                        .iter()
                        .enumerate()
                        .map(|(i, v)| {
                            path.within(i, |path| text(v, path).map(|s| s.to_lowercase()))
                        })
                        .collect::<Result<_, _>>()
                        .map(AnythingBut::IgnoreCase),
                    other => {
                        text(other, path).map(|s| AnythingBut::IgnoreCase(vec![s.to_lowercase()]))
                    }
                },
                other => path.error(format!(
                    "unknown operator {other:?} in anything-but; expected prefix, suffix or \
                     equals-ignore-case"
                )),
            })
        }
        other => path.error(format!(
            "anything-but takes a string, a number, a list of them or one of \
             {{prefix, suffix, equals-ignore-case}}, got {}",
            kind_of(other)
        )),
    }
}

fn numeric(value: &Value, path: &mut Path) -> Result<Vec<(Comparison, f64)>, PatternError> {
    let Value::Array(parts) = value else {
        return path.error(format!(
            "numeric takes a list such as [\">\", 0, \"<=\", 5], got {}",
            kind_of(value)
        ));
    };
    if parts.is_empty() || parts.len() % 2 != 0 || parts.len() > 4 {
        return path.error("numeric takes one or two pairs of an operator and a number");
    }
    let mut conditions = Vec::new();
    for (i, pair) in parts.chunks(2).enumerate() {
        let comparison = match pair[0].as_str() {
            Some("=") => Comparison::Eq,
            Some("<") => Comparison::Lt,
            Some("<=") => Comparison::Le,
            Some(">") => Comparison::Gt,
            Some(">=") => Comparison::Ge,
            _ => {
                return path.within(2 * i, |path| {
                    path.error(format!(
                        "expected one of \"=\", \"<\", \"<=\", \">\", \">=\", got {}",
                        pair[0]
                    ))
                })
            }
        };
        let bound = path.within(2 * i + 1, |path| match &pair[1] {
            Value::Number(n) => {
                let f = number(n, path)?;
                if f.abs() > NUMERIC_LIMIT {
                    return path.error(format!(
                        "{n} is outside -1e9..1e9, the range numeric matches"
                    ));
                }
                Ok(f)
            }
            other => path.error(format!("expected a number, got {}", kind_of(other))),
        })?;
        conditions.push((comparison, bound));
    }
    if let [(lower, _), (upper, _)] = conditions[..] {
        let lower_ok = matches!(lower, Comparison::Gt | Comparison::Ge);
        let upper_ok = matches!(upper, Comparison::Lt | Comparison::Le);
        if !(lower_ok && upper_ok) {
            return path.error("a range is a lower bound (> or >=) then an upper bound (< or <=)");
        }
    }
    Ok(conditions)
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

impl Node {
    /// `event` is the event's value at this level, `None` where the event has none.
    fn matches(&self, event: Option<&Value>) -> bool {
        let object = event.and_then(Value::as_object);
        if event.is_some_and(Value::is_array) {
            // An array of objects matches when one of its objects does.
            let elements = event.and_then(Value::as_array).expect("an array");
            return elements
                .iter()
                .any(|e| e.is_object() && self.matches(Some(e)))
                || (elements.iter().all(|e| !e.is_object()) && self.matches(None));
        }
        self.fields.iter().all(|(key, field)| {
            let value = object.and_then(|o| o.get(key));
            match field {
                Field::Nested(node) => node.matches(value),
                Field::Values(matchers) => values_match(matchers, value),
            }
        }) && self
            .any_of
            .iter()
            .all(|alternatives| alternatives.iter().any(|node| node.matches(event)))
    }

    /// The keys with values, nested ones and those of `$or` alternatives included.
    fn keys(&self) -> usize {
        let fields: usize = self
            .fields
            .iter()
            .map(|(_, field)| match field {
                Field::Nested(node) => node.keys(),
                Field::Values(_) => 1,
            })
            .sum();
        let alternatives: usize = self.any_of.iter().flatten().map(Node::keys).sum();
        fields + alternatives
    }

    fn combinations(&self) -> u64 {
        let fields = self.fields.iter().fold(1u64, |product, (_, field)| {
            product.saturating_mul(match field {
                Field::Nested(node) => node.combinations(),
                Field::Values(matchers) => matchers.len() as u64,
            })
        });
        self.any_of.iter().fold(fields, |product, alternatives| {
            let sum = alternatives
                .iter()
                .fold(0u64, |sum, node| sum.saturating_add(node.combinations()));
            product.saturating_mul(sum)
        })
    }
}

/// Whether any of `matchers` matches a value at the key (`None`: the key has no value).
fn values_match(matchers: &[Matcher], value: Option<&Value>) -> bool {
    let mut leaves = Vec::new();
    if let Some(value) = value {
        collect_leaves(value, &mut leaves);
    }
    matchers.iter().any(|matcher| match matcher {
        Matcher::Exists(exists) => leaves.is_empty() != *exists,
        _ => leaves.iter().any(|leaf| matcher.matches_leaf(leaf)),
    })
}

/// The values an event holds at a key: the value itself, or the elements of an array (arrays
/// within arrays flattened); an object holds none there.
fn collect_leaves<'v>(value: &'v Value, leaves: &mut Vec<&'v Value>) {
    match value {
        Value::Array(elements) => elements.iter().for_each(|e| collect_leaves(e, leaves)),
        Value::Object(_) => {}
        leaf => leaves.push(leaf),
    }
}

impl Matcher {
    fn matches_leaf(&self, leaf: &Value) -> bool {
        match self {
            Matcher::Exact(scalar) => scalar.equals(leaf),
            Matcher::Prefix { text, ignore_case } => leaf.as_str().is_some_and(|s| {
                if *ignore_case {
                    s.to_lowercase().starts_with(text.as_str())
                } else {
                    s.starts_with(text.as_str())
                }
            }),
            Matcher::Suffix { text, ignore_case } => leaf.as_str().is_some_and(|s| {
                if *ignore_case {
                    s.to_lowercase().ends_with(text.as_str())
                } else {
                    s.ends_with(text.as_str())
                }
            }),
            Matcher::EqualsIgnoreCase(text) => {
                leaf.as_str().is_some_and(|s| s.to_lowercase() == *text)
            }
            Matcher::AnythingBut(but) => but.matches_leaf(leaf),
            Matcher::Numeric(conditions) => match leaf {
                Value::Number(n) => {
                    let n = Number::of(n);
                    conditions.iter().all(|(comparison, bound)| {
                        let Some(order) = n.compare(Number::Double(*bound)) else {
                            return false;
                        };
                        match comparison {
                            Comparison::Eq => order == Ordering::Equal,
                            Comparison::Lt => order == Ordering::Less,
                            Comparison::Le => order != Ordering::Greater,
                            Comparison::Gt => order == Ordering::Greater,
                            Comparison::Ge => order != Ordering::Less,
                        }
                    })
                }
                _ => false,
            },
            Matcher::Exists(_) => unreachable!("exists is judged on the key, not a value"),
        }
    }
}

impl AnythingBut {
    fn matches_leaf(&self, leaf: &Value) -> bool {
        match self {
            AnythingBut::Values(values) => !values.iter().any(|v| v.equals(leaf)),
            AnythingBut::Prefix(prefix) => leaf
                .as_str()
                .is_some_and(|s| !s.starts_with(prefix.as_str())),
            AnythingBut::Suffix(suffix) => {
                leaf.as_str().is_some_and(|s| !s.ends_with(suffix.as_str()))
            }
            AnythingBut::IgnoreCase(values) => leaf
                .as_str()
                .is_some_and(|s| !values.contains(&s.to_lowercase())),
        }
    }
}

impl Scalar {
    fn equals(&self, leaf: &Value) -> bool {
        match (self, leaf) {
            (Scalar::String(a), Value::String(b)) => a == b,
            (Scalar::Number { value, as_written }, Value::Number(b)) => {
                let b = Number::of(b);
                (!as_written || value.is_integer() == b.is_integer()) && value.equals(b)
            }
            (Scalar::Bool(a), Value::Bool(b)) => a == b,
            (Scalar::Null, Value::Null) => true,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn sns(pattern: Value) -> Pattern {
        Pattern::parse(&pattern).unwrap()
    }

    fn refusal(pattern: Value) -> String {
        Pattern::parse(&pattern).unwrap_err().to_string()
    }

    #[test]
    fn in_a_filter_policy_five_equals_five_point_zero_but_not_the_string_five() {
        let p = sns(json!({"size": [5]}));
        assert!(p.matches(&json!({"size": 5.0})));
        assert!(p.matches(&json!({"size": 5})));
        assert!(!p.matches(&json!({"size": "5"})));
        let written = Pattern::parse_in(&json!({"size": [5]}), Dialect::EventBridge).unwrap();
        assert!(!written.matches(&json!({"size": 5.0})));
        assert!(written.matches(&json!({"size": 5})));
    }

    #[test]
    fn ids_that_only_64_bit_integers_tell_apart_never_match_each_other() {
        let a = 1_600_000_000_000_000_001u64;
        let b = 1_600_000_000_000_000_000u64;
        for dialect in [Dialect::Sns, Dialect::EventBridge] {
            let exact = Pattern::parse_in(&json!({ "tenant": [a] }), dialect).unwrap();
            assert!(exact.matches(&json!({ "tenant": a })));
            assert!(!exact.matches(&json!({ "tenant": b })), "{dialect:?}");
            let but =
                Pattern::parse_in(&json!({"tenant": [{"anything-but": [a]}]}), dialect).unwrap();
            assert!(but.matches(&json!({ "tenant": b })), "{dialect:?}");
            assert!(!but.matches(&json!({ "tenant": a })), "{dialect:?}");
        }
        for (x, y) in [
            (json!(u64::MAX), json!(u64::MAX - 1)),
            (json!(i64::MIN), json!(i64::MIN + 1)),
            (json!(i64::MAX), json!(i64::MAX as u64 + 1)),
        ] {
            let p = sns(json!({ "id": [x.clone()] }));
            assert!(p.matches(&json!({ "id": x })));
            assert!(!p.matches(&json!({ "id": y })));
        }
    }

    #[test]
    fn numeric_ranges_place_integers_at_the_64_bit_edges_exactly() {
        let p = sns(json!({"n": [{"numeric": [">=", -1e9, "<", 1e9]}]}));
        for (n, inside) in [
            (json!(i64::MIN), false),
            (json!(u64::MAX), false),
            (json!(999_999_999), true),
            (json!(1_000_000_000), false),
            (json!(-1_000_000_000), true),
            (json!(-1_000_000_001), false),
        ] {
            assert_eq!(p.matches(&json!({ "n": n })), inside, "{n}");
        }
        let eq = sns(json!({"n": [{"numeric": ["=", 7]}]}));
        assert!(eq.matches(&json!({"n": 7})) && eq.matches(&json!({"n": 7.0})));
        assert!(!eq.matches(&json!({"n": 7.000001})));
    }

    #[test]
    fn an_exact_number_a_double_cannot_hold_is_refused_in_a_pattern() {
        for text in [r#"{"id": [1.6e18]}"#, r#"{"id": [18446744073709551616]}"#] {
            let pattern: Value = serde_json::from_str(text).unwrap();
            let e = Pattern::parse(&pattern).unwrap_err();
            assert_eq!(e.path, "/id/0", "{text}");
            assert!(e.problem.contains("cannot be matched exactly"), "{e}");
        }
    }

    #[test]
    fn a_malformed_pattern_is_refused_naming_the_place_and_the_problem() {
        for (pattern, place, problem) in [
            (json!(["a"]), "pattern at /:", "expected an object"),
            (
                json!({"a": "x"}),
                "pattern at /a:",
                "expected a list of values",
            ),
            (json!({"a": []}), "pattern at /a:", "empty list"),
            (json!({"a": {}}), "pattern at /a:", "empty object"),
            (
                json!({"a": [{"prefix": 3}]}),
                "pattern at /a/0/prefix:",
                "expected a string",
            ),
            (
                json!({"a": [{"prefix": "x", "suffix": "y"}]}),
                "pattern at /a/0:",
                "exactly one operator",
            ),
            (
                json!({"a": [{"numeric": [">", "1"]}]}),
                "pattern at /a/0/numeric/1:",
                "expected a number",
            ),
            (
                json!({"a": [{"numeric": ["<", 5, ">", 1]}]}),
                "pattern at /a/0/numeric:",
                "lower bound",
            ),
            (
                json!({"a": [{"numeric": ["~", 5]}]}),
                "pattern at /a/0/numeric/0:",
                "expected one of",
            ),
            (
                json!({"a": [{"exists": "yes"}]}),
                "pattern at /a/0/exists:",
                "true or false",
            ),
            (
                json!({"a": [{"anything-but": [1, "x"]}]}),
                "pattern at /a/0/anything-but:",
                "only strings or only numbers",
            ),
            (
                json!({"a": [{"anything-but": {"wildcard": "x*"}}]}),
                "pattern at /a/0/anything-but/wildcard:",
                "unknown operator",
            ),
            (
                json!({"a/b": {"c": [{"sufix": ".png"}]}}),
                "pattern at /a~1b/c/0/sufix:",
                "unknown operator",
            ),
            (
                json!({"$or": [{"a": ["x"]}]}),
                "pattern at /$or:",
                "at least two",
            ),
            (
                json!({"a": [["x"]]}),
                "pattern at /a/0:",
                "a list inside a list",
            ),
        ] {
            let message = refusal(pattern.clone());
            assert!(
                message.starts_with(place) && message.contains(problem),
                "{pattern}: {message}"
            );
        }
    }

    #[test]
    fn an_empty_array_or_an_object_in_the_event_holds_no_value_at_the_key() {
        let absent = sns(json!({"tags": [{"exists": false}]}));
        assert!(absent.matches(&json!({"tags": []})));
        assert!(absent.matches(&json!({"tags": {"nested": 1}})));
        assert!(!absent.matches(&json!({"tags": ["a"]})));
        assert!(!absent.matches(&json!({"tags": null})));
    }

    #[test]
    fn a_nested_pattern_matches_when_one_object_of_an_event_array_does() {
        let p = sns(json!({"rows": {"state": ["open"], "n": [{"numeric": [">", 2]}]}}));
        assert!(
            p.matches(&json!({"rows": [{"state": "closed", "n": 9}, {"state": "open", "n": 3}]}))
        );
        assert!(
            !p.matches(&json!({"rows": [{"state": "closed", "n": 9}, {"state": "open", "n": 1}]}))
        );
        assert!(!p.matches(&json!({"rows": "open"})));
    }

    #[test]
    fn or_at_a_nested_level_combines_with_the_keys_beside_it() {
        let p = sns(json!({
            "detail": {"kind": ["row"], "$or": [{"op": ["created"]}, {"size": [{"numeric": [">=", 10]}]}]}
        }));
        assert!(p.matches(&json!({"detail": {"kind": "row", "op": "created"}})));
        assert!(p.matches(&json!({"detail": {"kind": "row", "op": "deleted", "size": 10}})));
        assert!(!p.matches(&json!({"detail": {"kind": "cell", "op": "created"}})));
        assert!(!p.matches(&json!({"detail": {"kind": "row", "op": "deleted", "size": 9}})));
    }

    #[test]
    fn the_empty_pattern_matches_everything() {
        let p = sns(json!({}));
        assert!(p.is_everything() && p.matches(&json!({"a": 1})) && p.matches(&json!(null)));
        assert_eq!(p, Pattern::everything());
    }
}
