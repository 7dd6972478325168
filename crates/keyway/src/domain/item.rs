//! DynamoDB-shaped values without the SDK: the images of a DynamoDB Streams change and the items
//! the state store writes are both maps of typed attribute values.
//!
//! The sizes follow the DynamoDB Developer Guide, "Item sizes and formats", because capacity units,
//! the 400 KB item limit and the 16 MB BatchGetItem limit are all computed from them.

use std::collections::BTreeMap;

use super::invalid::InvalidInput;
use base64::Engine as _;
use serde_json::{Map, Value};

/// An item: attribute name to value. Ordered, so that its JSON form is canonical.
pub type Item = BTreeMap<String, AttrValue>;

/// A DynamoDB attribute value: one variant per type of DynamoDB's data model.
#[derive(Clone, Debug, PartialEq)]
pub enum AttrValue {
    /// A string (`S`).
    S(String),
    /// Numbers travel as decimal strings, as in DynamoDB's own wire format, so no precision is lost.
    N(String),
    /// Binary data (`B`), decoded from base64.
    B(Vec<u8>),
    /// A boolean (`BOOL`).
    Bool(bool),
    /// A null (`NULL`).
    Null,
    /// A list of values of any types (`L`).
    L(Vec<AttrValue>),
    /// A map of attribute names to values (`M`).
    M(BTreeMap<String, AttrValue>),
    /// A string set (`SS`).
    Ss(Vec<String>),
    /// A number set (`NS`), each number a decimal string.
    Ns(Vec<String>),
    /// A binary set (`BS`).
    Bs(Vec<Vec<u8>>),
}

impl AttrValue {
    /// The size DynamoDB bills for this value (without the attribute name).
    pub fn size(&self) -> usize {
        match self {
            AttrValue::S(s) => s.len(),
            AttrValue::N(n) => number_size(n),
            AttrValue::B(b) => b.len(),
            AttrValue::Bool(_) | AttrValue::Null => 1,
            AttrValue::L(items) => 3 + items.iter().map(|v| v.size() + 1).sum::<usize>(),
            AttrValue::M(map) => {
                3 + map
                    .iter()
                    .map(|(k, v)| k.len() + v.size() + 1)
                    .sum::<usize>()
            }
            AttrValue::Ss(items) => items.iter().map(String::len).sum(),
            AttrValue::Ns(items) => items.iter().map(|n| number_size(n)).sum(),
            AttrValue::Bs(items) => items.iter().map(Vec::len).sum(),
        }
    }

    /// The string, if this is an `S`.
    pub fn as_s(&self) -> Option<&str> {
        match self {
            AttrValue::S(s) => Some(s),
            _ => None,
        }
    }

    /// The number's decimal text, if this is an `N`.
    pub fn as_n(&self) -> Option<&str> {
        match self {
            AttrValue::N(n) => Some(n),
            _ => None,
        }
    }

    /// Parses DynamoDB JSON (`{"S": "x"}`, `{"N": "1"}`, ...), the form Lambda delivers stream images in.
    /// `path` names the value in errors, e.g. `dynamodb.NewImage.price`.
    pub fn from_dynamodb_json(value: &Value, path: &str) -> Result<Self, InvalidInput> {
        let obj = value.as_object().filter(|o| o.len() == 1).ok_or_else(|| {
            InvalidInput::new(
                path,
                format!("expected an object with one type key, got {value}"),
            )
        })?;
        let (tag, inner) = obj.iter().next().expect("one entry");
        let field = format!("{path}.{tag}");
        let wrong = |problem: String| InvalidInput::new(field.as_str(), problem);
        let text = |v: &Value| {
            v.as_str()
                .map(str::to_owned)
                .ok_or_else(|| wrong(format!("expected a string, got {v}")))
        };
        let bytes = |v: &Value| {
            let s = v
                .as_str()
                .ok_or_else(|| wrong("expected base64 text".to_owned()))?;
            base64::engine::general_purpose::STANDARD
                .decode(s)
                .map_err(|e| wrong(format!("invalid base64: {e}")))
        };
        let array = |v: &Value| {
            v.as_array()
                .cloned()
                .ok_or_else(|| wrong(format!("expected an array, got {v}")))
        };
        Ok(match tag.as_str() {
            "S" => AttrValue::S(text(inner)?),
            "N" => AttrValue::N(text(inner)?),
            "B" => AttrValue::B(bytes(inner)?),
            "BOOL" => AttrValue::Bool(
                inner
                    .as_bool()
                    .ok_or_else(|| wrong("expected true or false".to_owned()))?,
            ),
            "NULL" => AttrValue::Null,
            "L" => AttrValue::L(
                array(inner)?
                    .iter()
                    .enumerate()
                    .map(|(i, v)| AttrValue::from_dynamodb_json(v, &format!("{path}[{i}]")))
                    .collect::<Result<_, _>>()?,
            ),
            "M" => AttrValue::M(item_from_dynamodb_json(inner, path)?),
            "SS" => AttrValue::Ss(array(inner)?.iter().map(text).collect::<Result<_, _>>()?),
            "NS" => AttrValue::Ns(array(inner)?.iter().map(text).collect::<Result<_, _>>()?),
            "BS" => AttrValue::Bs(array(inner)?.iter().map(bytes).collect::<Result<_, _>>()?),
            other => {
                return Err(InvalidInput::new(
                    path,
                    format!("unknown DynamoDB type {other:?}"),
                ))
            }
        })
    }

    /// The DynamoDB JSON form of this value.
    pub fn to_dynamodb_json(&self) -> Value {
        let b64 = |b: &Vec<u8>| Value::String(base64::engine::general_purpose::STANDARD.encode(b));
        let (tag, inner) = match self {
            AttrValue::S(s) => ("S", Value::String(s.clone())),
            AttrValue::N(n) => ("N", Value::String(n.clone())),
            AttrValue::B(b) => ("B", b64(b)),
            AttrValue::Bool(b) => ("BOOL", Value::Bool(*b)),
            AttrValue::Null => ("NULL", Value::Bool(true)),
            AttrValue::L(items) => ("L", items.iter().map(AttrValue::to_dynamodb_json).collect()),
            AttrValue::M(map) => ("M", item_to_dynamodb_json(map)),
            AttrValue::Ss(items) => ("SS", items.iter().cloned().map(Value::String).collect()),
            AttrValue::Ns(items) => ("NS", items.iter().cloned().map(Value::String).collect()),
            AttrValue::Bs(items) => ("BS", items.iter().map(b64).collect()),
        };
        let mut map = Map::new();
        map.insert(tag.to_owned(), inner);
        Value::Object(map)
    }

    /// This value as plain JSON, the way a Debezium row holds its columns: a number as a JSON
    /// number (as text when JSON cannot hold it, so no digit is lost), a set as an array, binary
    /// as base64 text. Rows from a DynamoDB stream and from Debezium then join on equal values.
    pub fn to_plain_json(&self) -> Value {
        let b64 = |b: &Vec<u8>| Value::String(base64::engine::general_purpose::STANDARD.encode(b));
        let number = |n: &String| {
            n.parse::<serde_json::Number>()
                .ok()
                .filter(|_| holds_exactly(n))
                .map(Value::Number)
                .unwrap_or_else(|| Value::String(n.clone()))
        };
        match self {
            AttrValue::S(s) => Value::String(s.clone()),
            AttrValue::N(n) => number(n),
            AttrValue::B(b) => b64(b),
            AttrValue::Bool(b) => Value::Bool(*b),
            AttrValue::Null => Value::Null,
            AttrValue::L(items) => items.iter().map(AttrValue::to_plain_json).collect(),
            AttrValue::M(map) => Value::Object(item_to_plain_json(map)),
            AttrValue::Ss(items) => items.iter().cloned().map(Value::String).collect(),
            AttrValue::Ns(items) => items.iter().map(number).collect(),
            AttrValue::Bs(items) => items.iter().map(b64).collect(),
        }
    }
}

/// Whether a JSON number keeps every digit of DynamoDB's number `n` (which has up to 38): an
/// integer within 64 bits, or any number of at most 15 significant digits, which a double holds.
fn holds_exactly(n: &str) -> bool {
    let unsigned = n.strip_prefix('-').unwrap_or(n);
    if unsigned.bytes().all(|b| b.is_ascii_digit()) {
        return n.parse::<i64>().is_ok() || n.parse::<u64>().is_ok();
    }
    let mantissa = unsigned.split(['e', 'E']).next().unwrap_or_default();
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    digits.trim_start_matches('0').trim_end_matches('0').len() <= 15
}

/// An item as a plain JSON object (see `AttrValue::to_plain_json`).
pub fn item_to_plain_json(item: &Item) -> Map<String, Value> {
    item.iter()
        .map(|(k, v)| (k.clone(), v.to_plain_json()))
        .collect()
}

/// Parses a DynamoDB JSON item (`{"id": {"S": "1"}}`).
pub fn item_from_dynamodb_json(value: &Value, path: &str) -> Result<Item, InvalidInput> {
    let obj = value.as_object().ok_or_else(|| {
        InvalidInput::new(
            path,
            format!("expected an object of attributes, got {value}"),
        )
    })?;
    obj.iter()
        .map(|(k, v)| {
            Ok((
                k.clone(),
                AttrValue::from_dynamodb_json(v, &format!("{path}.{k}"))?,
            ))
        })
        .collect()
}

/// An item as DynamoDB JSON (`{"id": {"S": "1"}}`).
pub fn item_to_dynamodb_json(item: &Item) -> Value {
    Value::Object(
        item.iter()
            .map(|(k, v)| (k.clone(), v.to_dynamodb_json()))
            .collect(),
    )
}

/// The size DynamoDB bills for an item: attribute names plus values.
pub fn item_size(item: &Item) -> usize {
    item.iter().map(|(k, v)| k.len() + v.size()).sum()
}

/// DynamoDB stores numbers in a variable-length decimal form: about one byte per two significant
/// digits plus one byte; leading and trailing zeros do not count.
fn number_size(text: &str) -> usize {
    let digits: String = text.chars().filter(char::is_ascii_digit).collect();
    let significant = digits
        .trim_start_matches('0')
        .trim_end_matches('0')
        .len()
        .max(1);
    significant.div_ceil(2) + 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_item_as_plain_json_holds_numbers_as_numbers_and_sets_as_arrays() {
        let image = json!({
            "id": {"N": "1001"}, "price": {"N": "12.5"}, "huge": {"N": "1e400"},
            "name": {"S": "a"}, "b": {"B": "AAEC"}, "ok": {"BOOL": true}, "none": {"NULL": true},
            "tags": {"SS": ["x"]}, "ns": {"NS": ["1", "2"]},
            "m": {"M": {"l": {"L": [{"N": "3"}, {"S": "c"}]}}}
        });
        let item = item_from_dynamodb_json(&image, "image").unwrap();
        assert_eq!(
            Value::Object(item_to_plain_json(&item)),
            json!({
                "id": 1001, "price": 12.5, "huge": "1e400", "name": "a", "b": "AAEC", "ok": true,
                "none": null, "tags": ["x"], "ns": [1, 2], "m": {"l": [3, "c"]}
            })
        );
    }

    #[test]
    fn a_dynamodb_number_that_json_would_round_stays_text_with_every_digit() {
        let plain = |n: &str| AttrValue::N(n.into()).to_plain_json();
        assert_eq!(plain("18446744073709551615"), json!(u64::MAX));
        assert_eq!(plain("-9223372036854775808"), json!(i64::MIN));
        assert_eq!(plain("0.000123456789012345"), json!(0.000123456789012345));
        for digits in [
            "18446744073709551616",
            "12345678901234567890123456789012345678",
            "1.600000000000000001",
        ] {
            assert_eq!(plain(digits), json!(digits), "{digits}");
        }
    }

    #[test]
    fn every_dynamodb_json_type_round_trips() {
        let image = json!({
            "s": {"S": "text"}, "n": {"N": "123.45"}, "b": {"B": "AAEC"}, "t": {"BOOL": true},
            "z": {"NULL": true}, "l": {"L": [{"S": "a"}, {"N": "1"}]},
            "m": {"M": {"inner": {"SS": ["x", "y"]}}}, "ns": {"NS": ["1", "2"]}, "bs": {"BS": ["AAEC"]}
        });
        let item = item_from_dynamodb_json(&image, "NewImage").unwrap();
        assert_eq!(item["b"], AttrValue::B(vec![0, 1, 2]));
        assert_eq!(item_to_dynamodb_json(&item), image);
    }

    #[test]
    fn an_unknown_type_is_rejected_naming_the_attribute() {
        let err = item_from_dynamodb_json(&json!({"price": {"X": "1"}}), "NewImage").unwrap_err();
        assert_eq!(err.field, "NewImage.price");
        assert!(err.problem.contains("\"X\""), "{err}");
    }

    #[test]
    fn sizes_follow_the_developer_guide_rules() {
        let mut item = Item::new();
        item.insert("pk".into(), AttrValue::S("abc".into())); // 2 + 3
        item.insert("v".into(), AttrValue::N("1200".into())); // 1 + (2 significant digits -> 2)
        item.insert("ok".into(), AttrValue::Bool(true)); // 2 + 1
        assert_eq!(item_size(&item), 5 + 3 + 3);
        let list = AttrValue::L(vec![AttrValue::S("ab".into()), AttrValue::Null]);
        assert_eq!(list.size(), 3 + (2 + 1) + (1 + 1));
    }
}
