//! DynamoDB's expression language, as far as the embedded runtime reproduces it: condition, key
//! condition and filter expressions (comparisons, `BETWEEN`, `AND`/`OR`/`NOT`, parentheses,
//! `attribute_exists`, `attribute_not_exists`, `begins_with`), and update expressions (`SET` of
//! a value, `if_not_exists` or a sum or difference, `REMOVE`, `ADD` of a number). Paths are
//! top-level attribute names, given as themselves or as `#name` placeholders.
//!
//! Anything else (nested paths, list indexes, `size`, `contains`, `IN`, `DELETE`...) is refused
//! with the piece named, never guessed at: a function that uses it learns so on its first call.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use serde_json::Value;

use keyway::domain::{AttrValue, Item};

/// What is wrong with an expression, in words for a ValidationException.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ExpressionError(pub String);

fn refuse<T>(problem: impl Into<String>) -> Result<T, ExpressionError> {
    Err(ExpressionError(problem.into()))
}

/// The placeholders of a request: `ExpressionAttributeNames` and `ExpressionAttributeValues`.
#[derive(Debug, Default)]
pub struct Placeholders {
    /// Each `#name` placeholder and the attribute name it stands for.
    pub names: BTreeMap<String, String>,
    /// Each `:value` placeholder and the value it stands for.
    pub values: BTreeMap<String, AttrValue>,
}

impl Placeholders {
    /// Reads both maps from a request (either may be absent).
    pub fn of(request: &Value) -> Result<Self, ExpressionError> {
        let mut placeholders = Self::default();
        if let Some(names) = request["ExpressionAttributeNames"].as_object() {
            for (k, v) in names {
                let name = v.as_str().ok_or_else(|| {
                    ExpressionError(format!("ExpressionAttributeNames.{k}: not a string"))
                })?;
                placeholders.names.insert(k.clone(), name.to_owned());
            }
        }
        if let Some(values) = request["ExpressionAttributeValues"].as_object() {
            for (k, v) in values {
                let path = format!("ExpressionAttributeValues.{k}");
                let value = AttrValue::from_dynamodb_json(v, &path)
                    .map_err(|e| ExpressionError(e.to_string()))?;
                placeholders.values.insert(k.clone(), value);
            }
        }
        Ok(placeholders)
    }

    fn name(&self, token: &str) -> Result<String, ExpressionError> {
        match token.strip_prefix('#') {
            Some(_) => self.names.get(token).cloned().ok_or_else(|| {
                ExpressionError(format!("{token}: not in ExpressionAttributeNames"))
            }),
            None => Ok(token.to_owned()),
        }
    }

    fn value(&self, token: &str) -> Result<AttrValue, ExpressionError> {
        self.values
            .get(token)
            .cloned()
            .ok_or_else(|| ExpressionError(format!("{token}: not in ExpressionAttributeValues")))
    }
}

/// An operand: an attribute of the item, or a value.
#[derive(Clone, Debug, PartialEq)]
pub enum Operand {
    /// The top-level attribute of that name, placeholders resolved.
    Path(String),
    /// A `:value` placeholder's value.
    Value(AttrValue),
}

/// A comparison operator of a condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Comparator {
    /// `=`
    Eq,
    /// `<>`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

/// A condition on an item.
#[derive(Clone, Debug, PartialEq)]
pub enum Condition {
    /// `a op b`: false when either side is missing, unless `op` is `<>`.
    Compare(Operand, Comparator, Operand),
    /// `v BETWEEN low AND high`, both bounds included.
    Between(Operand, Operand, Operand),
    /// `attribute_exists(path)`.
    Exists(String),
    /// `attribute_not_exists(path)`, which also holds when there is no item.
    NotExists(String),
    /// `begins_with(v, prefix)`, of two strings or two binaries.
    BeginsWith(Operand, Operand),
    /// Both conditions hold.
    And(Box<Condition>, Box<Condition>),
    /// Either condition holds.
    Or(Box<Condition>, Box<Condition>),
    /// The condition does not hold.
    Not(Box<Condition>),
}

impl Condition {
    /// Parses a condition, key condition or filter expression, its placeholders resolved.
    pub fn parse(text: &str, placeholders: &Placeholders) -> Result<Self, ExpressionError> {
        let mut parser = Parser::new(text, placeholders)?;
        let condition = parser.or()?;
        parser.end()?;
        Ok(condition)
    }

    /// Whether `item` (none: no item has the key) meets the condition.
    pub fn holds(&self, item: Option<&Item>) -> bool {
        let get = |operand: &Operand| -> Option<AttrValue> {
            match operand {
                Operand::Path(name) => item?.get(name).cloned(),
                Operand::Value(value) => Some(value.clone()),
            }
        };
        match self {
            Condition::Compare(a, op, b) => match (get(a), get(b)) {
                (Some(a), Some(b)) => compare(&a, *op, &b),
                // A missing attribute equals nothing and orders with nothing.
                _ => *op == Comparator::Ne,
            },
            Condition::Between(v, low, high) => match (get(v), get(low), get(high)) {
                (Some(v), Some(low), Some(high)) => {
                    compare(&v, Comparator::Ge, &low) && compare(&v, Comparator::Le, &high)
                }
                _ => false,
            },
            Condition::Exists(name) => item.is_some_and(|i| i.contains_key(name)),
            Condition::NotExists(name) => !item.is_some_and(|i| i.contains_key(name)),
            Condition::BeginsWith(v, prefix) => match (get(v), get(prefix)) {
                (Some(AttrValue::S(v)), Some(AttrValue::S(p))) => v.starts_with(&p),
                (Some(AttrValue::B(v)), Some(AttrValue::B(p))) => v.starts_with(&p),
                _ => false,
            },
            Condition::And(a, b) => a.holds(item) && b.holds(item),
            Condition::Or(a, b) => a.holds(item) || b.holds(item),
            Condition::Not(a) => !a.holds(item),
        }
    }

    /// The value the condition requires attribute `name` to equal, if one of its top-level
    /// conjuncts is `name = :value` (how a key condition names its partition).
    pub(crate) fn equality_on(&self, name: &str) -> Option<AttrValue> {
        match self {
            Condition::Compare(Operand::Path(p), Comparator::Eq, Operand::Value(v))
            | Condition::Compare(Operand::Value(v), Comparator::Eq, Operand::Path(p))
                if p == name =>
            {
                Some(v.clone())
            }
            Condition::And(a, b) => a.equality_on(name).or_else(|| b.equality_on(name)),
            _ => None,
        }
    }
}

/// One action of an update expression.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// `SET path = value`.
    Set(String, SetValue),
    /// `REMOVE path`.
    Remove(String),
    /// `ADD path number`: adds to the attribute's number, or sets it when it is missing.
    Add(String, AttrValue),
}

/// The right-hand side of a `SET` action.
#[derive(Clone, Debug, PartialEq)]
pub enum SetValue {
    /// An attribute's value or a placeholder's.
    Operand(Operand),
    /// `if_not_exists(path, default)`: the attribute's value, or `default` when it is missing.
    IfNotExists(String, Operand),
    /// `a + b`, of two numbers.
    Plus(Operand, Operand),
    /// `a - b`, of two numbers.
    Minus(Operand, Operand),
}

/// An update expression: its actions, applied in order.
#[derive(Clone, Debug, PartialEq)]
pub struct Update(pub Vec<Action>);

impl Update {
    /// Parses an update expression, its placeholders resolved; refuses one that names a clause
    /// twice or changes a path twice, as DynamoDB does.
    pub fn parse(text: &str, placeholders: &Placeholders) -> Result<Self, ExpressionError> {
        let mut parser = Parser::new(text, placeholders)?;
        let mut actions = Vec::new();
        let mut clauses = Vec::new();
        while let Some(clause) = parser.next_word() {
            clauses.push(clause.to_ascii_uppercase());
            match clause.to_ascii_uppercase().as_str() {
                "SET" => loop {
                    let path = parser.path()?;
                    parser.expect("=")?;
                    actions.push(Action::Set(path, parser.set_value()?));
                    if !parser.eat(",") {
                        break;
                    }
                },
                "REMOVE" => loop {
                    actions.push(Action::Remove(parser.path()?));
                    if !parser.eat(",") {
                        break;
                    }
                },
                "ADD" => loop {
                    let path = parser.path()?;
                    match parser.operand()? {
                        Operand::Value(value @ AttrValue::N(_)) => {
                            actions.push(Action::Add(path, value))
                        }
                        other => {
                            return refuse(format!(
                                "ADD {path} {other:?}: only a number is added here"
                            ))
                        }
                    }
                    if !parser.eat(",") {
                        break;
                    }
                },
                other => {
                    return refuse(format!(
                        "update clause {other}: not reproduced (SET, REMOVE and ADD are)"
                    ))
                }
            }
        }
        if actions.is_empty() {
            return refuse("the update expression has no action");
        }
        let update = Self(actions);
        update.check(&clauses)?;
        Ok(update)
    }

    /// `item` with the actions applied. Every action reads the item as it was before the
    /// update, as DynamoDB evaluates them: `SET a = b, b = a` swaps.
    pub fn apply(&self, before: Item) -> Result<Item, ExpressionError> {
        let mut after = before.clone();
        for action in &self.0 {
            match action {
                Action::Set(path, value) => {
                    after.insert(path.clone(), set_value(&before, value)?);
                }
                Action::Remove(path) => {
                    after.remove(path);
                }
                Action::Add(path, AttrValue::N(n)) => {
                    let sum = match before.get(path) {
                        None => AttrValue::N(n.clone()),
                        Some(current) => arithmetic(current, &AttrValue::N(n.clone()), 1)?,
                    };
                    after.insert(path.clone(), sum);
                }
                Action::Add(path, _) => return refuse(format!("ADD {path}: not a number")),
            }
        }
        Ok(after)
    }

    /// DynamoDB refuses an expression that names a clause twice or changes one path twice.
    fn check(&self, clauses: &[String]) -> Result<(), ExpressionError> {
        let mut seen = std::collections::BTreeSet::new();
        if let Some(twice) = clauses.iter().find(|c| !seen.insert(c.as_str())) {
            return refuse(format!(
                "The {twice} section can only be used once in an update expression"
            ));
        }
        let mut paths = std::collections::BTreeSet::new();
        for action in &self.0 {
            let (Action::Set(path, _) | Action::Remove(path) | Action::Add(path, _)) = action;
            if !paths.insert(path.as_str()) {
                return refuse(format!(
                    "Two document paths overlap with each other: [{path}] and [{path}]"
                ));
            }
        }
        Ok(())
    }
}

fn set_value(item: &Item, value: &SetValue) -> Result<AttrValue, ExpressionError> {
    let get = |operand: &Operand| {
        match operand {
        Operand::Path(name) => item.get(name).cloned().ok_or_else(|| {
            ExpressionError(format!(
                "The provided expression refers to an attribute that does not exist in the item: {name}"
            ))
        }),
        Operand::Value(value) => Ok(value.clone()),
    }
    };
    match value {
        SetValue::Operand(operand) => get(operand),
        SetValue::IfNotExists(path, default) => match item.get(path) {
            Some(existing) => Ok(existing.clone()),
            None => get(default),
        },
        SetValue::Plus(a, b) => arithmetic(&get(a)?, &get(b)?, 1),
        SetValue::Minus(a, b) => arithmetic(&get(a)?, &get(b)?, -1),
    }
}

/// `a + sign * b` of two numbers: exact for integers (DynamoDB keeps 38 digits), in floating
/// point otherwise.
fn arithmetic(a: &AttrValue, b: &AttrValue, sign: i8) -> Result<AttrValue, ExpressionError> {
    let (Some(a), Some(b)) = (a.as_n(), b.as_n()) else {
        return refuse("An operand in the update expression has an incorrect data type");
    };
    if let (Ok(a), Ok(b)) = (a.parse::<i128>(), b.parse::<i128>()) {
        let sum = a.checked_add(i128::from(sign) * b);
        return sum
            .map(|n| AttrValue::N(n.to_string()))
            .ok_or_else(|| ExpressionError("Number overflow".into()));
    }
    match (a.parse::<f64>(), b.parse::<f64>()) {
        (Ok(a), Ok(b)) => Ok(AttrValue::N((a + f64::from(sign) * b).to_string())),
        _ => refuse("An operand in the update expression is not a number"),
    }
}

/// The order of two numbers: exact for integers, in floating point otherwise.
fn number_order(a: &str, b: &str) -> Option<Ordering> {
    if let (Ok(a), Ok(b)) = (a.parse::<i128>(), b.parse::<i128>()) {
        return Some(a.cmp(&b));
    }
    a.parse::<f64>().ok()?.partial_cmp(&b.parse::<f64>().ok()?)
}

/// DynamoDB's comparison: numbers by value, strings and binaries by their bytes; values of
/// different types are never ordered and only unequal.
pub fn compare(a: &AttrValue, op: Comparator, b: &AttrValue) -> bool {
    match (op, order(a, b)) {
        (Comparator::Eq, Some(o)) => o == Ordering::Equal,
        (Comparator::Eq, None) => a == b,
        (Comparator::Ne, Some(o)) => o != Ordering::Equal,
        (Comparator::Ne, None) => a != b,
        (Comparator::Lt, Some(o)) => o == Ordering::Less,
        (Comparator::Le, Some(o)) => o != Ordering::Greater,
        (Comparator::Gt, Some(o)) => o == Ordering::Greater,
        (Comparator::Ge, Some(o)) => o != Ordering::Less,
        (_, None) => false,
    }
}

/// DynamoDB's order of two values: numbers by value, strings and binaries by their bytes; none
/// between values of different types (or of types without an order).
pub fn order(a: &AttrValue, b: &AttrValue) -> Option<Ordering> {
    match (a, b) {
        (AttrValue::N(a), AttrValue::N(b)) => number_order(a, b),
        (AttrValue::S(a), AttrValue::S(b)) => Some(a.as_bytes().cmp(b.as_bytes())),
        (AttrValue::B(a), AttrValue::B(b)) => Some(a.cmp(b)),
        _ => None,
    }
}

/// A recursive-descent parser over the expression's tokens.
struct Parser<'a> {
    tokens: Vec<String>,
    at: usize,
    placeholders: &'a Placeholders,
}

impl<'a> Parser<'a> {
    fn new(text: &str, placeholders: &'a Placeholders) -> Result<Self, ExpressionError> {
        Ok(Self {
            tokens: tokenize(text)?,
            at: 0,
            placeholders,
        })
    }

    fn peek(&self) -> Option<&str> {
        self.tokens.get(self.at).map(String::as_str)
    }

    fn next_word(&mut self) -> Option<String> {
        let token = self.tokens.get(self.at).cloned();
        self.at += usize::from(token.is_some());
        token
    }

    fn eat(&mut self, token: &str) -> bool {
        let matches = self.peek().is_some_and(|t| t.eq_ignore_ascii_case(token));
        self.at += usize::from(matches);
        matches
    }

    fn expect(&mut self, token: &str) -> Result<(), ExpressionError> {
        match self.eat(token) {
            true => Ok(()),
            false => refuse(format!(
                "expected {token:?} at {:?}",
                self.peek().unwrap_or("the end")
            )),
        }
    }

    fn end(&self) -> Result<(), ExpressionError> {
        match self.peek() {
            None => Ok(()),
            Some(token) => refuse(format!("unexpected {token:?}: not reproduced here")),
        }
    }

    fn or(&mut self) -> Result<Condition, ExpressionError> {
        let mut left = self.and()?;
        while self.eat("OR") {
            left = Condition::Or(Box::new(left), Box::new(self.and()?));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Condition, ExpressionError> {
        let mut left = self.not()?;
        while self.eat("AND") {
            left = Condition::And(Box::new(left), Box::new(self.not()?));
        }
        Ok(left)
    }

    fn not(&mut self) -> Result<Condition, ExpressionError> {
        if self.eat("NOT") {
            return Ok(Condition::Not(Box::new(self.not()?)));
        }
        self.primary()
    }

    fn primary(&mut self) -> Result<Condition, ExpressionError> {
        if self.eat("(") {
            let inner = self.or()?;
            self.expect(")")?;
            return Ok(inner);
        }
        let token = self.peek().unwrap_or("").to_owned();
        if self.tokens.get(self.at + 1).map(String::as_str) == Some("(") {
            self.at += 2;
            let condition = match token.as_str() {
                "attribute_exists" => Condition::Exists(self.path()?),
                "attribute_not_exists" => Condition::NotExists(self.path()?),
                "begins_with" => {
                    let value = self.operand()?;
                    self.expect(",")?;
                    Condition::BeginsWith(value, self.operand()?)
                }
                other => return refuse(format!("function {other}: not reproduced here")),
            };
            self.expect(")")?;
            return Ok(condition);
        }
        let left = self.operand()?;
        if self.eat("BETWEEN") {
            let low = self.operand()?;
            self.expect("AND")?;
            return Ok(Condition::Between(left, low, self.operand()?));
        }
        let op = match self.next_word().as_deref() {
            Some("=") => Comparator::Eq,
            Some("<>") => Comparator::Ne,
            Some("<") => Comparator::Lt,
            Some("<=") => Comparator::Le,
            Some(">") => Comparator::Gt,
            Some(">=") => Comparator::Ge,
            other => return refuse(format!("expected a comparison, got {other:?}")),
        };
        Ok(Condition::Compare(left, op, self.operand()?))
    }

    fn set_value(&mut self) -> Result<SetValue, ExpressionError> {
        if self.peek() == Some("if_not_exists") {
            self.at += 1;
            self.expect("(")?;
            let path = self.path()?;
            self.expect(",")?;
            let default = self.operand()?;
            self.expect(")")?;
            return Ok(SetValue::IfNotExists(path, default));
        }
        let left = self.operand()?;
        if self.eat("+") {
            return Ok(SetValue::Plus(left, self.operand()?));
        }
        if self.eat("-") {
            return Ok(SetValue::Minus(left, self.operand()?));
        }
        Ok(SetValue::Operand(left))
    }

    fn operand(&mut self) -> Result<Operand, ExpressionError> {
        match self.peek() {
            Some(token) if token.starts_with(':') => {
                let value = self.placeholders.value(token)?;
                self.at += 1;
                Ok(Operand::Value(value))
            }
            _ => Ok(Operand::Path(self.path()?)),
        }
    }

    fn path(&mut self) -> Result<String, ExpressionError> {
        let token = self.next_word().unwrap_or_default();
        let plain =
            token.starts_with('#') || token.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if token.is_empty() || !plain {
            return refuse(format!("expected an attribute name, got {token:?}"));
        }
        if matches!(self.peek(), Some(".") | Some("[")) {
            return refuse(format!("{token}: nested paths are not reproduced here"));
        }
        self.placeholders.name(&token)
    }
}

/// Words, placeholders and the punctuation of the grammar.
fn tokenize(text: &str) -> Result<Vec<String>, ExpressionError> {
    let mut tokens = Vec::new();
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_alphanumeric() || matches!(c, '_' | '#' | ':') {
            let start = i;
            while i < chars.len()
                && (chars[i].is_alphanumeric() || matches!(chars[i], '_' | '#' | ':' | '-'))
            {
                i += 1;
            }
            tokens.push(chars[start..i].iter().collect());
        } else if matches!(c, '<' | '>')
            && chars
                .get(i + 1)
                .is_some_and(|n| *n == '=' || (c == '<' && *n == '>'))
        {
            tokens.push(chars[i..i + 2].iter().collect());
            i += 2;
        } else if "=<>(),+-.[]".contains(c) {
            tokens.push(c.to_string());
            i += 1;
        } else {
            return refuse(format!("unexpected character {c:?}"));
        }
    }
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placeholders() -> Placeholders {
        let mut p = Placeholders::default();
        p.names.insert("#v".into(), "v".into());
        p.names.insert("#pk".into(), "pk".into());
        p.values.insert(":v".into(), AttrValue::N("3".into()));
        p.values.insert(":s".into(), AttrValue::S("b".into()));
        p.values.insert(":one".into(), AttrValue::N("1".into()));
        p
    }

    fn item(pairs: &[(&str, AttrValue)]) -> Item {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    #[test]
    fn the_conditions_the_state_store_sends_hold_as_dynamodb_decides_them() {
        let p = placeholders();
        let absent = Condition::parse("attribute_not_exists(#v)", &p).unwrap();
        let version = Condition::parse("#v = :v", &p).unwrap();
        let raise = Condition::parse("attribute_not_exists(pk) OR sk < :s", &p).unwrap();
        let at3 = item(&[
            ("pk", AttrValue::S("a".into())),
            ("v", AttrValue::N("3".into())),
            ("sk", AttrValue::S("a".into())),
        ]);
        assert!(absent.holds(None));
        assert!(!absent.holds(Some(&at3)));
        assert!(version.holds(Some(&at3)));
        assert!(!version.holds(None));
        assert!(raise.holds(None) && raise.holds(Some(&at3)));
        let at_b = item(&[
            ("pk", AttrValue::S("a".into())),
            ("sk", AttrValue::S("b".into())),
        ]);
        assert!(!raise.holds(Some(&at_b)));
    }

    #[test]
    fn numbers_compare_by_value_and_strings_by_their_bytes() {
        let p = placeholders();
        let ten = item(&[
            ("n", AttrValue::N("10".into())),
            ("s", AttrValue::S("a".into())),
        ]);
        assert!(Condition::parse("n > :v AND s < :s", &p)
            .unwrap()
            .holds(Some(&ten)));
        let ten_is_between = Condition::parse("n BETWEEN :one AND :v", &p).unwrap();
        assert!(!ten_is_between.holds(Some(&ten)));
        assert!(Condition::parse("NOT (n = :v) AND begins_with(s, s)", &p)
            .unwrap()
            .holds(Some(&ten)));
    }

    #[test]
    fn an_update_reads_the_item_as_it_was_before_any_of_its_actions() {
        let p = placeholders();
        let update = Update::parse(
            "SET c = if_not_exists(c, :v), d = n + :one, n = d REMOVE gone ADD e :one",
            &p,
        )
        .unwrap();
        let before = item(&[
            ("gone", AttrValue::Bool(true)),
            ("n", AttrValue::N("1".into())),
            ("d", AttrValue::N("5".into())),
        ]);
        let after = update.apply(before).unwrap();
        assert_eq!(after.get("c"), Some(&AttrValue::N("3".into())));
        assert_eq!(
            after.get("d"),
            Some(&AttrValue::N("2".into())),
            "n + 1 of before"
        );
        assert_eq!(
            after.get("n"),
            Some(&AttrValue::N("5".into())),
            "d of before"
        );
        assert_eq!(after.get("e"), Some(&AttrValue::N("1".into())));
        assert!(!after.contains_key("gone"));
        let err = Update::parse("SET a = :v SET b = :v", &p).unwrap_err();
        assert!(err.0.contains("SET section can only be used once"), "{err}");
        let err = Update::parse("SET a = :v REMOVE a", &p).unwrap_err();
        assert!(err.0.contains("overlap"), "{err}");
    }

    #[test]
    fn a_missing_attribute_is_unequal_to_anything_and_ordered_with_nothing() {
        let p = placeholders();
        let empty = item(&[]);
        assert!(Condition::parse("status <> :s", &p)
            .unwrap()
            .holds(Some(&empty)));
        assert!(Condition::parse("status <> :s", &p).unwrap().holds(None));
        for op in ["=", "<", "<=", ">", ">="] {
            let condition = Condition::parse(&format!("status {op} :s"), &p).unwrap();
            assert!(!condition.holds(Some(&empty)), "{op}");
        }
    }

    #[test]
    fn what_is_not_reproduced_is_refused_by_name() {
        let p = placeholders();
        let err = Condition::parse("contains(s, :s)", &p).unwrap_err();
        assert!(err.0.contains("contains"), "{err}");
        let err = Condition::parse("a.b = :s", &p).unwrap_err();
        assert!(err.0.contains("nested"), "{err}");
        let err = Update::parse("DELETE tags :s", &p).unwrap_err();
        assert!(err.0.contains("DELETE"), "{err}");
        let err = Condition::parse("#missing = :s", &p).unwrap_err();
        assert!(err.0.contains("#missing"), "{err}");
    }
}
