//! Which source rows take part in the join: conditions on columns of either table, for example
//! `domains.status = "active" AND users.tier >= 2`, the `WHERE` of the join.
//!
//! The re-key applies it to each step alone: a delete goes on when the row it retracts matched,
//! an insert when the row it adds matches. An update that makes a row stop matching retracts it,
//! one that makes it match adds it, and a row that never matched leaves nothing downstream: the
//! join's state and the view hold matching rows only, and no phantom row stays behind (Flink's
//! FLINK-38579, where a filter on a non-key column met updates after the join's state had
//! dropped the row).
//!
//! Values are JSON literals (`"active"`, `2`, `true`, `null`); a string may also be written in
//! SQL's single quotes. `=` and `!=` compare JSON values (numbers by value); `<`, `<=`, `>`, `>=`
//! compare two numbers or two strings and are false for anything else. A missing column reads as
//! `null`: `col = null` holds for it and `col != null` does not.

use std::cmp::Ordering;

use keyway::domain::debezium::Row;
use keyway::domain::number::Number;
use serde_json::Value;

/// How a condition compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compare {
    /// `=`: equal JSON values, numbers by value.
    Eq,
    /// `!=` or `<>`: not equal.
    Ne,
    /// `<`: less than.
    Lt,
    /// `<=`: less than or equal.
    Le,
    /// `>`: greater than.
    Gt,
    /// `>=`: greater than or equal.
    Ge,
}

/// One condition: `TABLE.COLUMN OP VALUE`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Condition {
    /// The table whose rows the condition applies to, by its name in the join.
    pub table: String,
    /// The column compared; a missing one reads as `null`.
    pub column: String,
    /// How the column compares with `value`.
    pub compare: Compare,
    /// The JSON literal the column is compared with.
    pub value: Value,
}

/// Conditions that must all hold; none lets every row through.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    /// The conditions, in the order written.
    pub conditions: Vec<Condition>,
}

/// A filter that cannot be read.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error("filter {text:?}: {problem}")]
pub struct FilterError {
    /// The filter as given.
    pub text: String,
    /// What is wrong with it, naming the condition.
    pub problem: String,
}

/// The operators, longest first so that `<=` is not read as `<`.
const OPERATORS: [(&str, Compare); 7] = [
    ("!=", Compare::Ne),
    ("<>", Compare::Ne),
    ("<=", Compare::Le),
    (">=", Compare::Ge),
    ("=", Compare::Eq),
    ("<", Compare::Lt),
    (">", Compare::Gt),
];

impl Filter {
    /// The columns the conditions on `table` read.
    pub fn columns_of<'a>(&'a self, table: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.conditions
            .iter()
            .filter(move |c| c.table == table)
            .map(|c| c.column.as_str())
    }

    /// Reads conditions joined by `AND`; empty text is no filter.
    pub fn parse(text: &str) -> Result<Self, FilterError> {
        let mut conditions = Vec::new();
        for part in split_and(text) {
            conditions.push(Condition::parse(part, text)?);
        }
        Ok(Self { conditions })
    }

    /// Whether the filter has no condition, and so lets every row through.
    pub fn is_empty(&self) -> bool {
        self.conditions.is_empty()
    }

    /// Whether `row` of `table` takes part: every condition on that table holds for it.
    pub fn matches(&self, table: &str, row: &Row) -> bool {
        self.conditions
            .iter()
            .filter(|c| c.table == table)
            .all(|c| c.holds(row))
    }

    /// The filter as `parse` reads it back.
    pub fn expression(&self) -> String {
        let parts: Vec<String> = self.conditions.iter().map(Condition::expression).collect();
        parts.join(" AND ")
    }
}

/// The parts of `text` between `AND`s (any case, a word of its own), trimmed; none for blank
/// text. `AND` inside a quoted value does not split it.
fn split_and(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut quote) = (0, None);
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match quote {
            Some(q) if b == b'\\' && q == b'"' => i += 1,
            Some(q) if b == q => quote = None,
            Some(_) => {}
            None if b == b'"' || b == b'\'' => quote = Some(b),
            None if b.is_ascii_whitespace()
                && bytes.len() >= i + 4
                && bytes[i + 1..i + 4].eq_ignore_ascii_case(b"and")
                && bytes.get(i + 4).is_none_or(u8::is_ascii_whitespace) =>
            {
                parts.push(text[start..i].trim());
                start = (i + 4).min(text.len());
                i += 3;
            }
            None => {}
        }
        i += 1;
    }
    parts.push(text[start..].trim());
    if parts.len() == 1 && parts[0].is_empty() {
        parts.clear();
    }
    parts
}

impl Condition {
    /// One condition, `text`, of the filter `filter`.
    fn parse(text: &str, filter: &str) -> Result<Self, FilterError> {
        let problem = |problem: String| FilterError {
            text: filter.to_owned(),
            problem: format!("{text:?}: {problem}"),
        };
        let (at, op, compare) = OPERATORS
            .iter()
            .filter_map(|(op, compare)| text.find(op).map(|at| (at, *op, *compare)))
            .min_by_key(|(at, op, _)| (*at, std::cmp::Reverse(op.len())))
            .ok_or_else(|| {
                problem("expected TABLE.COLUMN OP VALUE, OP one of = != < <= > >=".into())
            })?;
        let (column, value) = (text[..at].trim(), text[at + op.len()..].trim());
        let (table, column) = column
            .split_once('.')
            .filter(|(t, c)| !t.is_empty() && !c.is_empty())
            .ok_or_else(|| problem(format!("expected TABLE.COLUMN before {op:?}")))?;
        Ok(Self {
            table: table.to_owned(),
            column: column.to_owned(),
            compare,
            value: literal(value, problem)?,
        })
    }

    fn expression(&self) -> String {
        let op = OPERATORS
            .iter()
            .find(|(_, c)| *c == self.compare)
            .map_or("=", |(op, _)| op);
        format!("{}.{} {op} {}", self.table, self.column, self.value)
    }

    fn holds(&self, row: &Row) -> bool {
        let found = row.get(&self.column).unwrap_or(&Value::Null);
        match self.compare {
            Compare::Eq => same(found, &self.value),
            Compare::Ne => !same(found, &self.value),
            Compare::Lt => order(found, &self.value) == Some(Ordering::Less),
            Compare::Le => matches!(
                order(found, &self.value),
                Some(Ordering::Less | Ordering::Equal)
            ),
            Compare::Gt => order(found, &self.value) == Some(Ordering::Greater),
            Compare::Ge => matches!(
                order(found, &self.value),
                Some(Ordering::Greater | Ordering::Equal)
            ),
        }
    }
}

/// A value as written: a JSON literal, or a string in single quotes; what is wrong with it goes
/// to `problem`, which says where it is.
fn literal(text: &str, problem: impl Fn(String) -> FilterError) -> Result<Value, FilterError> {
    if let Some(inner) = text
        .strip_prefix('\'')
        .and_then(|t| t.strip_suffix('\''))
        .filter(|_| text.len() >= 2)
    {
        return Ok(Value::String(inner.replace("''", "'")));
    }
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Array(_) | Value::Object(_)) => Err(problem(
            "a value is a number, a string, true, false or null".into(),
        )),
        Ok(Value::Number(n)) if Number::of(&n).inexact().is_some() => {
            let why = Number::of(&n).inexact().unwrap_or_default();
            Err(problem(format!("{text} {why}")))
        }
        Ok(value) => Ok(value),
        Err(_) if text.is_empty() => Err(problem("the value is missing".into())),
        Err(_) => Err(problem(format!(
            "{text} is not a value: quote a string (\"{text}\" or '{text}')"
        ))),
    }
}

/// JSON equality, numbers exactly by value (`1` equals `1.0`; `keyway::domain::number`).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => Number::of(x).equals(Number::of(y)),
        _ => a == b,
    }
}

/// The order of two numbers or two strings; none for anything else.
fn order(a: &Value, b: &Value) -> Option<Ordering> {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => Number::of(x).compare(Number::of(y)),
        (Value::String(x), Value::String(y)) => Some(x.cmp(y)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn row(value: Value) -> Row {
        value.as_object().unwrap().clone()
    }

    #[test]
    fn conditions_joined_by_and_must_all_hold_for_the_rows_of_their_table() {
        let filter = Filter::parse(
            r#"domains.status = "active" and domains.rank >= 2 AND users.tier != 'free'"#,
        )
        .unwrap();
        assert_eq!(filter.conditions.len(), 3);
        let domain = |status: &str, rank: f64| row(json!({"status": status, "rank": rank}));
        assert!(filter.matches("domains", &domain("active", 2.0)));
        assert!(!filter.matches("domains", &domain("active", 1.5)));
        assert!(!filter.matches("domains", &domain("parked", 3.0)));
        assert!(filter.matches("users", &row(json!({"tier": "pro"}))));
        assert!(!filter.matches("users", &row(json!({"tier": "free"}))));
        assert!(
            filter.matches("orders", &row(json!({}))),
            "no condition on orders"
        );
        assert_eq!(Filter::parse(&filter.expression()).unwrap(), filter);
    }

    #[test]
    fn a_missing_column_reads_as_null_and_orders_against_nothing() {
        let filter = Filter::parse("t.gone = null").unwrap();
        assert!(filter.matches("t", &row(json!({"id": 1}))));
        assert!(filter.matches("t", &row(json!({"gone": null}))));
        assert!(!Filter::parse("t.gone != null")
            .unwrap()
            .matches("t", &row(json!({}))));
        let less = Filter::parse("t.n < 3").unwrap();
        assert!(!less.matches("t", &row(json!({}))));
        assert!(
            !less.matches("t", &row(json!({"n": "2"}))),
            "a string is no number"
        );
        assert!(less.matches("t", &row(json!({"n": 2}))));
        assert!(Filter::parse("t.n = 1")
            .unwrap()
            .matches("t", &row(json!({"n": 1.0}))));
    }

    #[test]
    fn ids_that_only_64_bit_integers_tell_apart_are_neither_equal_nor_unordered() {
        let id = Filter::parse("t.tenant = 1600000000000000001").unwrap();
        assert!(id.matches("t", &row(json!({"tenant": 1_600_000_000_000_000_001u64}))));
        assert!(!id.matches("t", &row(json!({"tenant": 1_600_000_000_000_000_000u64}))));
        let above = Filter::parse("t.tenant > 1600000000000000000").unwrap();
        assert!(above.matches("t", &row(json!({"tenant": 1_600_000_000_000_000_001u64}))));
        assert!(!above.matches("t", &row(json!({"tenant": 1_600_000_000_000_000_000u64}))));
        let max = Filter::parse(&format!("t.n = {}", u64::MAX)).unwrap();
        assert!(!max.matches("t", &row(json!({"n": u64::MAX - 1}))));
        let e = Filter::parse("t.id = 1e18").unwrap_err();
        assert!(e.problem.contains("cannot be matched exactly"), "{e}");
        let min = Filter::parse(&format!("t.n < {}", i64::MIN + 1)).unwrap();
        assert!(min.matches("t", &row(json!({"n": i64::MIN}))));
    }

    #[test]
    fn and_inside_a_quoted_value_does_not_split_it_and_blank_text_is_no_filter() {
        let filter =
            Filter::parse(r#"t.name = "salt and pepper" AND t.x = 'rock and roll'"#).unwrap();
        assert_eq!(filter.conditions[0].value, json!("salt and pepper"));
        assert_eq!(filter.conditions[1].value, json!("rock and roll"));
        assert!(Filter::parse("  ").unwrap().is_empty());
    }

    #[test]
    fn a_malformed_condition_is_refused_naming_it_and_the_problem() {
        for (text, problem) in [
            ("domains.status", "expected TABLE.COLUMN OP VALUE"),
            ("status = 1", "expected TABLE.COLUMN before"),
            ("t.status = active", "quote a string"),
            ("t.status = ", "the value is missing"),
            ("t.tags = [1]", "a value is a number"),
            ("t.a = 1 AND", "expected TABLE.COLUMN OP VALUE"),
        ] {
            let e = Filter::parse(text).unwrap_err();
            assert!(e.problem.contains(problem), "{text}: {e}");
        }
    }
}
