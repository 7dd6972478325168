//! JSON numbers compared exactly, as filters and joins compare them. A JSON parser keeps an
//! integer that fits 64 bits as that integer and anything else as a double, and comparing two
//! integers through doubles (as `serde_json::Number::as_f64` invites) makes 1600000000000000001
//! equal 1600000000000000000: ids that are tenant keys would reach the wrong tenant.
//!
//! What equals what:
//! - two integers (written without fraction or exponent, from -2^63 to 2^64) are equal when they
//!   are the same integer;
//! - an integer and a number written with a fraction or exponent are equal when the latter is
//!   that integer exactly and lies within ±2^53, where a double holds every integer: 7 equals
//!   7.0 and 7e0, but a double beyond 2^53 stands for several integers and equals none of them;
//! - two numbers written with a fraction or exponent are equal when their doubles are: exact for
//!   decimals of up to 15 significant digits, which is what a double holds (a filter policy's
//!   numbers are bounded more tightly still: ±1e9, five decimal places).
//!
//! Ordering follows the same rules (integers exactly, doubles by value), and `canonical` writes
//! the one text that equal numbers share, for keys.

use std::cmp::Ordering;

/// 2^53: every integer of smaller magnitude is exactly a double.
pub const EXACT_DOUBLE_LIMIT: f64 = 9_007_199_254_740_992.0;

/// A JSON number, as it compares (`equals`, `compare`); `==` is the same form and value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Number {
    /// Written as an integer that fits `i64` or `u64`.
    Int(i128),
    /// Written with a fraction or an exponent, or an integer beyond 64 bits.
    Double(f64),
}

impl Number {
    /// The number a parsed JSON number is.
    pub fn of(n: &serde_json::Number) -> Self {
        if let Some(i) = n.as_i64() {
            Number::Int(i128::from(i))
        } else if let Some(u) = n.as_u64() {
            Number::Int(i128::from(u))
        } else {
            Number::Double(n.as_f64().unwrap_or(f64::NAN))
        }
    }

    /// Whether it was written as an integer.
    pub fn is_integer(self) -> bool {
        matches!(self, Number::Int(_))
    }

    /// Why a number cannot be compared exactly, if it cannot: a double at or beyond 2^53 (or an
    /// integer past 64 bits, which is one) stands for many integers. Patterns and filters refuse
    /// such numbers where they are written; in data they equal and order against no integer.
    pub fn inexact(self) -> Option<&'static str> {
        match self {
            Number::Double(d) if !d.is_finite() || d.abs() >= EXACT_DOUBLE_LIMIT => Some(
                "cannot be matched exactly: beyond ±2^53 a number written with a fraction or \
                 exponent (or an integer beyond 64 bits) stands for many integers; write it as an \
                 integer within 64 bits",
            ),
            _ => None,
        }
    }

    /// The integer a double is exactly, within ±2^53.
    fn exact_integer(d: f64) -> Option<i128> {
        (d.fract() == 0.0 && d.abs() < EXACT_DOUBLE_LIMIT).then_some(d as i128)
    }

    /// Equality as the module's notes say.
    pub fn equals(self, other: Number) -> bool {
        match (self, other) {
            (Number::Int(a), Number::Int(b)) => a == b,
            (Number::Int(i), Number::Double(d)) | (Number::Double(d), Number::Int(i)) => {
                Self::exact_integer(d) == Some(i)
            }
            (Number::Double(a), Number::Double(b)) => a == b,
        }
    }

    /// The order of two numbers; none where a double is not a number, or where an integer meets
    /// a double it cannot be told apart from (a whole double at or beyond 2^53 that it rounds
    /// to), so that `compare` says Equal exactly when `equals` holds.
    pub fn compare(self, other: Number) -> Option<Ordering> {
        match (self, other) {
            (Number::Int(a), Number::Int(b)) => Some(a.cmp(&b)),
            (Number::Int(i), Number::Double(d)) => compare_int_double(i, d),
            (Number::Double(d), Number::Int(i)) => compare_int_double(i, d).map(Ordering::reverse),
            (Number::Double(a), Number::Double(b)) => a.partial_cmp(&b),
        }
        .filter(|order| *order != Ordering::Equal || self.equals(other))
    }

    /// The text equal numbers share: an integer's digits (a double that is exactly an integer
    /// within ±2^53 included: `7.0` is `7`), or else the double's shortest text.
    pub fn canonical(self) -> String {
        match self {
            Number::Int(i) => i.to_string(),
            Number::Double(d) => match Self::exact_integer(d) {
                Some(i) => i.to_string(),
                None => format!("{d:?}"),
            },
        }
    }
}

/// The order of integer `i` (from 64 bits) against double `d`, exactly: a double compares by its
/// value, so one beyond every 64-bit integer (or within and not whole) is placed by its integral
/// part.
fn compare_int_double(i: i128, d: f64) -> Option<Ordering> {
    if d.is_nan() {
        return None;
    }
    // Past 1.7e38 (below i128's bounds) the double is past every 64-bit integer; within, its
    // floor is an exact i128.
    if d >= 1.7e38 {
        return Some(Ordering::Less);
    }
    if d <= -1.7e38 {
        return Some(Ordering::Greater);
    }
    let floor = d.floor();
    let whole = floor as i128;
    Some(match i.cmp(&whole) {
        Ordering::Equal if d > floor => Ordering::Less,
        order => order,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn n(value: serde_json::Value) -> Number {
        match value {
            serde_json::Value::Number(n) => Number::of(&n),
            other => panic!("{other} is no number"),
        }
    }

    #[test]
    fn integers_that_only_64_bits_tell_apart_are_not_equal() {
        let a = n(json!(1_600_000_000_000_000_001u64));
        let b = n(json!(1_600_000_000_000_000_000u64));
        assert!(!a.equals(b));
        assert_eq!(a.compare(b), Some(Ordering::Greater));
        for (x, y) in [
            (json!(u64::MAX), json!(u64::MAX - 1)),
            (json!(i64::MIN), json!(i64::MIN + 1)),
            (json!(i64::MAX), json!(i64::MAX as u64 + 1)),
        ] {
            assert!(!n(x.clone()).equals(n(y.clone())), "{x} {y}");
            assert!(n(x.clone()).equals(n(x)));
        }
    }

    #[test]
    fn seven_equals_seven_point_zero_but_a_double_beyond_2_to_the_53_equals_no_integer() {
        let seven: serde_json::Value = serde_json::from_str("7.0").unwrap();
        assert!(n(json!(7)).equals(n(seven.clone())));
        assert_eq!(n(seven).canonical(), "7");
        let e: serde_json::Value = serde_json::from_str("7e0").unwrap();
        assert!(n(json!(7)).equals(n(e)));
        assert!(!n(json!(7)).equals(n(json!(7.5))));
        let big: serde_json::Value = serde_json::from_str("1600000000000000000.0").unwrap();
        assert!(!n(json!(1_600_000_000_000_000_000u64)).equals(n(big.clone())));
        assert!(!n(json!(1_600_000_000_000_000_001u64)).equals(n(big)));
        let beyond: serde_json::Value = serde_json::from_str("18446744073709551616").unwrap();
        assert!(
            !n(json!(u64::MAX)).equals(n(beyond.clone())),
            "2^64 is a double"
        );
        assert_eq!(n(json!(u64::MAX)).compare(n(beyond)), Some(Ordering::Less));
    }

    #[test]
    fn integers_and_doubles_order_exactly_at_the_edges() {
        assert_eq!(
            n(json!(9_007_199_254_740_993u64)).compare(n(json!(9_007_199_254_740_992.0))),
            Some(Ordering::Greater),
            "2^53 + 1 against the double 2^53"
        );
        assert_eq!(n(json!(5)).compare(n(json!(5.5))), Some(Ordering::Less));
        assert_eq!(n(json!(6)).compare(n(json!(5.5))), Some(Ordering::Greater));
        assert_eq!(n(json!(-6)).compare(n(json!(-5.5))), Some(Ordering::Less));
        assert_eq!(
            n(json!(i64::MIN)).compare(n(json!(-1e300))),
            Some(Ordering::Greater)
        );
        assert_eq!(
            n(json!(u64::MAX)).compare(n(json!(1e300))),
            Some(Ordering::Less)
        );
        assert_eq!(n(json!(5)).compare(n(json!(5.0))), Some(Ordering::Equal));
        // A whole double beyond 2^53 stands for many integers: neither equal nor ordered.
        let e18: serde_json::Value = serde_json::from_str("1e18").unwrap();
        assert_eq!(
            n(json!(1_000_000_000_000_000_000u64)).compare(n(e18.clone())),
            None
        );
        assert!(n(e18).inexact().is_some());
        assert!(n(json!(7.5)).inexact().is_none() && n(json!(u64::MAX)).inexact().is_none());
    }

    #[test]
    fn equal_numbers_share_one_canonical_text() {
        assert_eq!(n(json!(0.5)).canonical(), "0.5");
        assert_eq!(n(json!(-0.0)).canonical(), "0");
        assert_eq!(n(json!(u64::MAX)).canonical(), "18446744073709551615");
        assert_eq!(n(json!(1e300)).canonical(), "1e300");
    }
}
