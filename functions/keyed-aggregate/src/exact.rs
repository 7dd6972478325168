//! Numbers summed exactly. A sum of doubles depends on the order of its terms, and salting
//! changes the order (partials of one key are summed in buckets, then merged): aggregates that
//! must equal an unsalted computation to the last digit cannot be doubles. `Exact` is a decimal
//! of up to 38 significant digits and 18 decimal places, read from a JSON number's text without
//! rounding; sums, minimums and maximums of it are the same in any order.

use std::cmp::Ordering;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The most decimal places a value keeps.
pub const MAX_SCALE: u32 = 18;

/// `units × 10^-scale`, with no trailing zero in `units` when `scale > 0`: one representation per
/// value, so that equal values are equal structs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Exact {
    units: i128,
    scale: u32,
}

/// Why a number cannot be taken exactly.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum ExactError {
    #[error("{0:?} is not a JSON number")]
    NotANumber(String),
    #[error("{0} has more than 38 significant digits or more than 18 decimal places")]
    OutOfRange(String),
    #[error("the sum overflows 38 significant digits")]
    Overflow,
}

const TEN: i128 = 10;

/// One more than the largest magnitude of `units`: 38 digits.
const LIMIT: u128 = 10u128.pow(38);

impl Exact {
    pub const ZERO: Exact = Exact { units: 0, scale: 0 };

    pub fn from_int(n: i64) -> Self {
        Exact {
            units: n as i128,
            scale: 0,
        }
    }

    /// A JSON number's text, exactly (`1.50`, `-2e3`, `12.5E-1`).
    pub fn parse(text: &str) -> Result<Self, ExactError> {
        let not_a_number = || ExactError::NotANumber(text.to_owned());
        let out_of_range = || ExactError::OutOfRange(text.to_owned());
        let (negative, rest) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let (mantissa, exponent) = match rest.find(['e', 'E']) {
            Some(at) => {
                let exponent: i64 = rest[at + 1..].parse().map_err(|_| not_a_number())?;
                (&rest[..at], exponent)
            }
            None => (rest, 0),
        };
        let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        let digits_ok = |d: &str| d.bytes().all(|b| b.is_ascii_digit());
        if whole.is_empty() || !digits_ok(whole) || !digits_ok(fraction) {
            return Err(not_a_number());
        }
        if mantissa.contains('.') && fraction.is_empty() {
            return Err(not_a_number());
        }
        let mut units: i128 = 0;
        let mut significant = 0;
        for b in whole.bytes().chain(fraction.bytes()) {
            if units != 0 || b != b'0' {
                significant += 1;
            }
            if significant > 38 {
                return Err(out_of_range());
            }
            units = units * TEN + i128::from(b - b'0');
        }
        if negative {
            units = -units;
        }
        let scale = fraction.len() as i64 - exponent;
        let value = if scale <= 0 {
            let factor = pow10(u32::try_from(-scale).map_err(|_| out_of_range())?)
                .ok_or_else(out_of_range)?;
            Exact {
                units: units.checked_mul(factor).ok_or_else(out_of_range)?,
                scale: 0,
            }
        } else {
            Exact {
                units,
                scale: u32::try_from(scale).map_err(|_| out_of_range())?,
            }
            .normalized()
        };
        if value.scale > MAX_SCALE || value.units.unsigned_abs() >= LIMIT {
            return Err(out_of_range());
        }
        Ok(value)
    }

    fn normalized(mut self) -> Self {
        while self.scale > 0 && self.units % TEN == 0 {
            self.units /= TEN;
            self.scale -= 1;
        }
        if self.units == 0 {
            self.scale = 0;
        }
        self
    }

    pub fn checked_add(self, other: Exact) -> Result<Exact, ExactError> {
        let scale = self.scale.max(other.scale);
        let a = rescale(self, scale).ok_or(ExactError::Overflow)?;
        let b = rescale(other, scale).ok_or(ExactError::Overflow)?;
        let units = a
            .checked_add(b)
            .filter(|u| u.unsigned_abs() < LIMIT)
            .ok_or(ExactError::Overflow)?;
        Ok(Exact { units, scale }.normalized())
    }

    /// The nearest double: for a mean, which is a quotient and so no longer exact.
    pub fn to_f64(self) -> f64 {
        // Through the decimal text: the nearest double to the exact value, which dividing
        // `units` by a power of ten (two roundings) is not always.
        self.to_string()
            .parse()
            .expect("a decimal parses as a double")
    }
}

/// `units` of `value` at the larger `scale`.
fn rescale(value: Exact, scale: u32) -> Option<i128> {
    value.units.checked_mul(pow10(scale - value.scale)?)
}

fn pow10(exponent: u32) -> Option<i128> {
    TEN.checked_pow(exponent)
}

impl Ord for Exact {
    fn cmp(&self, other: &Self) -> Ordering {
        // Whole parts first (they always fit), then the fractions at a common scale, which fit
        // too: at most 18 places.
        let whole = |v: &Exact| v.units / pow10(v.scale).expect("scale ≤ 18");
        let fraction = |v: &Exact| {
            (v.units % pow10(v.scale).expect("scale ≤ 18"))
                * pow10(MAX_SCALE - v.scale).expect("scale ≤ 18")
        };
        whole(self)
            .cmp(&whole(other))
            .then_with(|| fraction(self).cmp(&fraction(other)))
    }
}

impl PartialOrd for Exact {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Exact {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.scale == 0 {
            return write!(f, "{}", self.units);
        }
        let sign = if self.units < 0 { "-" } else { "" };
        let digits = self.units.unsigned_abs().to_string();
        let scale = self.scale as usize;
        let padded = format!("{digits:0>width$}", width = scale + 1);
        let (whole, fraction) = padded.split_at(padded.len() - scale);
        write!(f, "{sign}{whole}.{fraction}")
    }
}

/// Stored as its decimal text: a JSON number would go through a double on the way back.
impl Serialize for Exact {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Exact {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Exact::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn exact(text: &str) -> Exact {
        Exact::parse(text).unwrap()
    }

    #[test]
    fn json_numbers_are_read_without_rounding_and_written_back_in_their_shortest_form() {
        for (text, shown) in [
            ("0", "0"),
            ("-0", "0"),
            ("1.50", "1.5"),
            ("-2e3", "-2000"),
            ("12.5E-1", "1.25"),
            ("0.1", "0.1"),
            ("-0.000000000000000001", "-0.000000000000000001"),
            (
                "99999999999999999999999999999999999999",
                "99999999999999999999999999999999999999",
            ),
        ] {
            assert_eq!(exact(text).to_string(), shown, "{text}");
        }
        assert_eq!(exact("1.50"), exact("15e-1"));
    }

    #[test]
    fn numbers_beyond_38_digits_or_18_places_and_text_that_is_no_number_are_refused() {
        for text in [
            "1e38",
            "1e39",
            "0.0000000000000000001",
            "123456789012345678901234567890123456789",
        ] {
            assert!(
                matches!(Exact::parse(text), Err(ExactError::OutOfRange(_))),
                "{text}"
            );
        }
        for text in ["", "-", "1.", ".5", "1e", "abc", "1.2.3", "+1"] {
            assert!(
                matches!(Exact::parse(text), Err(ExactError::NotANumber(_))),
                "{text}"
            );
        }
        let big = exact("99999999999999999999999999999999999999");
        assert_eq!(big.checked_add(exact("1")), Err(ExactError::Overflow));
    }

    #[test]
    fn a_tenth_added_ten_times_is_one() {
        let tenth = exact("0.1");
        let sum = (0..10)
            .try_fold(Exact::ZERO, |s, _| s.checked_add(tenth))
            .unwrap();
        assert_eq!(sum, exact("1"));
        assert_eq!(sum.to_f64(), 1.0);
    }

    #[test]
    fn values_are_stored_as_their_decimal_text() {
        let value = exact("-12.345");
        let json = serde_json::to_string(&value).unwrap();
        assert_eq!(json, r#""-12.345""#);
        assert_eq!(serde_json::from_str::<Exact>(&json).unwrap(), value);
    }

    fn decimal() -> impl Strategy<Value = String> {
        (any::<i64>(), 0u32..8).prop_map(|(units, places)| {
            let value = Exact {
                units: units as i128,
                scale: places,
            }
            .normalized();
            value.to_string()
        })
    }

    proptest! {
        #[test]
        fn sums_do_not_depend_on_the_order_of_their_terms(terms in prop::collection::vec(decimal(), 1..30), seed in any::<u64>()) {
            let values: Vec<Exact> = terms.iter().map(|t| exact(t)).collect();
            let forward = values.iter().try_fold(Exact::ZERO, |s, v| s.checked_add(*v)).unwrap();
            let mut shuffled = values.clone();
            shuffled.sort_by_key(|v| (v.units as u64).wrapping_mul(seed | 1));
            let backward = shuffled.iter().try_fold(Exact::ZERO, |s, v| s.checked_add(*v)).unwrap();
            prop_assert_eq!(forward, backward);
        }

        #[test]
        fn order_is_the_order_of_the_values(a in decimal(), b in decimal()) {
            let (x, y) = (exact(&a), exact(&b));
            let as_doubles = a.parse::<f64>().unwrap().partial_cmp(&b.parse::<f64>().unwrap()).unwrap();
            if as_doubles != Ordering::Equal {
                prop_assert_eq!(x.cmp(&y), as_doubles);
            }
            prop_assert_eq!(x.cmp(&y) == Ordering::Equal, x == y);
        }
    }
}
