//! Which columns join, and how: `LEFT.COL=RIGHT.COL` (for example `domains.user_id=users.id`),
//! inner or left outer, of the rows a filter lets through (`filter`).

use keyway::domain::debezium::Row;
use keyway::domain::number::Number;
use serde_json::Value;

use crate::filter::Filter;

/// A column of a table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    /// The table's name, as the join's text writes it (`domains` in `domains.user_id`).
    pub table: String,
    /// The column's name in the table's rows (`user_id` in `domains.user_id`).
    pub column: String,
}

/// Which rows the join gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JoinKind {
    /// Joined rows only.
    Inner,
    /// Every left row, with its right partners or, without one, with none.
    LeftOuter,
}

/// The side of the join a table is on.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    /// The table before `=` in the spec (`domains` in `domains.user_id=users.id`).
    Left,
    /// The table after `=` in the spec (`users` in `domains.user_id=users.id`).
    Right,
}

/// What a row joins on: the join column's value, or nothing (SQL's NULL joins no row).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum JoinKey {
    /// The value as canonical JSON: `"abc"`, and a number in the one text equal numbers share
    /// (`keyway::domain::number`): `7` for 7 and 7.0 alike, while 1600000000000000001 and
    /// 1600000000000000000 stay apart.
    Value(String),
    /// No value: the column is null or missing, and the row joins no row.
    Null,
}

/// An equi-join of two tables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JoinSpec {
    /// The left table's join column: the one before `=`.
    pub left: Column,
    /// The right table's join column: the one after `=`.
    pub right: Column,
    /// Inner or left outer.
    pub kind: JoinKind,
    /// The rows that take part; every row without one.
    pub filter: Filter,
}

/// A join that cannot be read.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error("join {text:?}: {problem}")]
pub struct SpecError {
    /// The join as given.
    pub text: String,
    /// What is wrong with it.
    pub problem: String,
}

impl JoinSpec {
    /// Reads `LEFT.COL=RIGHT.COL`.
    pub fn parse(text: &str, kind: JoinKind) -> Result<Self, SpecError> {
        let problem = |problem: &str| SpecError {
            text: text.to_owned(),
            problem: problem.to_owned(),
        };
        let column = |side: &str| {
            let (table, column) = side
                .trim()
                .split_once('.')
                .ok_or_else(|| problem("expected TABLE.COLUMN on each side of '='"))?;
            if table.is_empty() || column.is_empty() {
                return Err(problem("a table or column name is empty"));
            }
            Ok(Column {
                table: table.to_owned(),
                column: column.to_owned(),
            })
        };
        let (left, right) = text
            .split_once('=')
            .ok_or_else(|| problem("expected LEFT.COLUMN=RIGHT.COLUMN"))?;
        let (left, right) = (column(left)?, column(right)?);
        if left.table == right.table {
            return Err(problem("a table joined with itself is not supported"));
        }
        Ok(Self {
            left,
            right,
            kind,
            filter: Filter::default(),
        })
    }

    /// The join of the rows `filter` lets through: refused when a condition names a table that
    /// is neither side of the join (a typo would otherwise filter nothing, silently).
    pub fn with_filter(self, filter: Filter) -> Result<Self, SpecError> {
        if let Some(stray) = filter
            .conditions
            .iter()
            .find(|c| self.side(&c.table).is_none())
        {
            return Err(SpecError {
                text: filter.expression(),
                problem: format!(
                    "the filter names {:?}, which is neither side of the join {}",
                    stray.table,
                    self.expression()
                ),
            });
        }
        Ok(Self { filter, ..self })
    }

    /// Whether `row` of `table` takes part in the join: the filter lets it through.
    pub fn takes_part(&self, table: &str, row: &Row) -> bool {
        self.filter.matches(table, row)
    }

    /// The side `table` is on, if either.
    pub fn side(&self, table: &str) -> Option<Side> {
        if table == self.left.table {
            Some(Side::Left)
        } else if table == self.right.table {
            Some(Side::Right)
        } else {
            None
        }
    }

    /// The name of the table on `side`.
    pub fn table(&self, side: Side) -> &str {
        match side {
            Side::Left => &self.left.table,
            Side::Right => &self.right.table,
        }
    }

    /// The join's columns as `parse` reads them: `domains.user_id=users.id`.
    pub fn expression(&self) -> String {
        format!(
            "{}.{}={}.{}",
            self.left.table, self.left.column, self.right.table, self.right.column
        )
    }

    /// The join as written: `domains.user_id=users.id`, `(left outer)` when it is, and its
    /// filter after `where`.
    pub fn describe(&self) -> String {
        let mut join = self.expression();
        if self.kind == JoinKind::LeftOuter {
            join.push_str(" (left outer)");
        }
        if !self.filter.is_empty() {
            join = format!("{join} where {}", self.filter.expression());
        }
        join
    }

    /// The join column of `side`'s table.
    pub fn column(&self, side: Side) -> &str {
        match side {
            Side::Left => &self.left.column,
            Side::Right => &self.right.column,
        }
    }

    /// What `row` of `side` joins on.
    pub fn join_key(&self, side: Side, row: &Row) -> JoinKey {
        match row.get(self.column(side)) {
            None | Some(Value::Null) => JoinKey::Null,
            Some(Value::Number(n)) => JoinKey::Value(Number::of(n).canonical()),
            Some(value) => JoinKey::Value(value.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_join_reads_as_left_column_equals_right_column() {
        let spec = JoinSpec::parse("domains.user_id=users.id", JoinKind::Inner).unwrap();
        assert_eq!(spec.left.table, "domains");
        assert_eq!(spec.right.column, "id");
        assert_eq!(spec.side("users"), Some(Side::Right));
        assert_eq!(spec.side("orders"), None);
        let written = " domains.user_id = users.id ";
        let left = JoinSpec::parse(written, JoinKind::LeftOuter).unwrap();
        assert_eq!(left.expression(), "domains.user_id=users.id");
        assert_eq!(left.describe(), "domains.user_id=users.id (left outer)");
        let row = json!({"id": 1, "user_id": 7}).as_object().unwrap().clone();
        assert_eq!(spec.join_key(Side::Left, &row), JoinKey::Value("7".into()));
        let null = json!({"id": 2, "user_id": null})
            .as_object()
            .unwrap()
            .clone();
        assert_eq!(spec.join_key(Side::Left, &null), JoinKey::Null);
    }

    #[test]
    fn seven_joins_seven_point_zero_and_64_bit_ids_join_only_their_own() {
        let spec = JoinSpec::parse("domains.user_id=users.id", JoinKind::Inner).unwrap();
        let row = |text: &str| serde_json::from_str::<Row>(text).unwrap();
        let key = |text: &str| spec.join_key(Side::Left, &row(text));
        assert_eq!(key(r#"{"user_id": 7}"#), key(r#"{"user_id": 7.0}"#));
        assert_eq!(
            spec.join_key(Side::Right, &row(r#"{"id": 7}"#)),
            key(r#"{"user_id": 7e0}"#)
        );
        assert_ne!(key(r#"{"user_id": 7}"#), key(r#"{"user_id": "7"}"#));
        assert_ne!(
            key(r#"{"user_id": 1600000000000000001}"#),
            key(r#"{"user_id": 1600000000000000000}"#)
        );
        assert_ne!(
            key(r#"{"user_id": 18446744073709551615}"#),
            key(r#"{"user_id": 18446744073709551614}"#)
        );
    }

    #[test]
    fn a_filter_applies_to_the_rows_of_its_table_and_one_on_a_stranger_table_is_refused() {
        let spec = JoinSpec::parse("domains.user_id=users.id", JoinKind::Inner).unwrap();
        let filter = Filter::parse(r#"domains.status = "active""#).unwrap();
        let spec = spec.with_filter(filter).unwrap();
        let row = |status: &str| json!({"status": status}).as_object().unwrap().clone();
        assert!(spec.takes_part("domains", &row("active")));
        assert!(!spec.takes_part("domains", &row("parked")));
        assert!(spec.takes_part("users", &row("parked")));
        assert_eq!(
            spec.describe(),
            r#"domains.user_id=users.id where domains.status = "active""#
        );
        let stray = Filter::parse("orders.total > 3").unwrap();
        let e = spec.with_filter(stray).unwrap_err();
        assert!(
            e.problem.contains("\"orders\", which is neither side"),
            "{e}"
        );
    }

    #[test]
    fn a_malformed_join_is_refused_saying_why() {
        for (text, problem) in [
            ("domains.user_id", "expected LEFT.COLUMN=RIGHT.COLUMN"),
            ("domains=users.id", "expected TABLE.COLUMN"),
            ("domains.=users.id", "empty"),
            ("users.a=users.b", "itself"),
        ] {
            let e = JoinSpec::parse(text, JoinKind::Inner).unwrap_err();
            assert!(e.problem.contains(problem), "{text}: {e}");
        }
    }
}
