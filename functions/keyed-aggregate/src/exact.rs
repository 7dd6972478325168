//! Numbers summed exactly. A sum of doubles depends on the order of its terms, and salting
//! changes the order (partials of one key are summed in buckets, then merged): aggregates that
//! must equal an unsalted computation to the last digit cannot be doubles. `Exact` is a decimal
//! of up to 38 significant digits and 18 decimal places, read from a JSON number's text without
//! rounding; minimums and maximums of it are the same in any order.
//!
//! A sum is a `Sum`, wider than any value: a running total that passes 38 digits on the way (two
//! large values before a negative one, or a large value and a tiny fraction) would otherwise
//! fail in one order or grouping of the same values and not in another. A `Sum` holds 74 digits
//! (56 whole, 18 places), enough for 10^18 values of the largest magnitude, so no order or
//! grouping of any realistic stream overflows it.

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
    /// The text is not a JSON number.
    #[error("{0:?} is not a JSON number")]
    NotANumber(String),
    /// The number has more than 38 significant digits or more than 18 decimal places.
    #[error("{0} has more than 38 significant digits or more than 18 decimal places")]
    OutOfRange(String),
    /// A sum grew past what it can hold: 38 digits for an `Exact`, 74 for a `Sum`, a `u64` for a
    /// count.
    #[error("the sum overflows what it can hold (38 digits a value, 74 a sum)")]
    Overflow,
}

const TEN: i128 = 10;

/// One more than the largest magnitude of `units`: 38 digits.
const LIMIT: u128 = 10u128.pow(38);

impl Exact {
    /// Zero.
    pub const ZERO: Exact = Exact { units: 0, scale: 0 };

    /// The integer `n`, exactly.
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
        // Zero is zero under any exponent; and it must not reach the loop below, which would
        // strip a zero for each of an exponent's billions.
        if units == 0 {
            return Ok(Exact::ZERO);
        }
        if negative {
            units = -units;
        }
        // An exponent near i64's ends (`1e-9223372036854775808`) is out of range, not a panic.
        let scale = (fraction.len() as i64)
            .checked_sub(exponent)
            .ok_or_else(out_of_range)?;
        let value = if scale <= 0 {
            let factor = pow10(u32::try_from(-scale).map_err(|_| out_of_range())?)
                .ok_or_else(out_of_range)?;
            Exact {
                units: units.checked_mul(factor).ok_or_else(out_of_range)?,
                scale: 0,
            }
        } else {
            // 38 digits end in 37 zeros at most: a scale further past the largest stays past it
            // whatever is stripped, and stripping a zero a step would take a step each.
            let scale = u32::try_from(scale)
                .ok()
                .filter(|&s| s <= MAX_SCALE + 38)
                .ok_or_else(out_of_range)?;
            Exact { units, scale }.normalized()
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

    /// `self + other`, exactly: past 38 significant digits it is an error, never a rounding.
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

/// An exact sum of `Exact` values (see the module's notes): `hi × 10^36 + lo` units of
/// 10^-18, `|lo| < 10^36`, `hi` and `lo` never of opposite signs, so each value has one form.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Sum {
    hi: i128,
    lo: i128,
}

/// 10^36: the base of a `Sum`'s low half.
const HALF: i128 = 10i128.pow(36);

impl Sum {
    /// The empty sum.
    pub const ZERO: Sum = Sum { hi: 0, lo: 0 };

    /// `self + other`, exactly: past 74 digits (56 whole, 18 places) it is an error, never a
    /// rounding.
    pub fn checked_add(self, other: Sum) -> Result<Sum, ExactError> {
        let lo = self.lo + other.lo;
        // Past 38 digits of the high half a sum could not be read back (`parse`, 74 digits).
        let hi = self
            .hi
            .checked_add(other.hi)
            .and_then(|hi| hi.checked_add(lo / HALF))
            .filter(|hi| hi.unsigned_abs() < LIMIT)
            .ok_or(ExactError::Overflow)?;
        Ok(Sum { hi, lo: lo % HALF }.normalized())
    }

    /// `hi` and `lo` of one sign.
    fn normalized(mut self) -> Self {
        if self.hi > 0 && self.lo < 0 {
            self.hi -= 1;
            self.lo += HALF;
        } else if self.hi < 0 && self.lo > 0 {
            self.hi += 1;
            self.lo -= HALF;
        }
        self
    }

    /// The nearest double: for a mean.
    pub fn to_f64(self) -> f64 {
        self.to_string()
            .parse()
            .expect("a decimal parses as a double")
    }

    /// A decimal's text without exponent, of up to 74 digits and 18 places, as `Display` writes
    /// it; or any text `Exact` reads.
    pub fn parse(text: &str) -> Result<Self, ExactError> {
        if let Ok(value) = Exact::parse(text) {
            return Ok(value.into());
        }
        let not_a_number = || ExactError::NotANumber(text.to_owned());
        let (negative, rest) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let (whole, fraction) = rest.split_once('.').unwrap_or((rest, ""));
        let digits_ok = |d: &str| d.bytes().all(|b| b.is_ascii_digit());
        let cut = rest.contains('.') && fraction.is_empty();
        if whole.is_empty() || cut || !digits_ok(whole) || !digits_ok(fraction) {
            return Err(not_a_number());
        }
        let whole = whole.trim_start_matches('0');
        if fraction.len() > MAX_SCALE as usize || whole.len() > 74 - MAX_SCALE as usize {
            return Err(ExactError::OutOfRange(text.to_owned()));
        }
        let units = format!("{whole}{fraction:0<width$}", width = MAX_SCALE as usize);
        let split = units.len().saturating_sub(36);
        let part = |digits: &str| digits.parse::<i128>().unwrap_or(0);
        let sign = if negative { -1 } else { 1 };
        Ok(Sum {
            hi: sign * part(&units[..split]),
            lo: sign * part(&units[split..]),
        })
    }
}

impl From<Exact> for Sum {
    fn from(value: Exact) -> Self {
        // value × 10^18 = units × 10^f, split at 10^36: units = hi × 10^(36-f) + rest.
        let f = MAX_SCALE - value.scale;
        let base = pow10(36 - f).expect("36 - f ≤ 36");
        Sum {
            hi: value.units / base,
            lo: (value.units % base) * pow10(f).expect("f ≤ 18"),
        }
    }
}

impl fmt::Display for Sum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.hi < 0 || self.lo < 0 { "-" } else { "" };
        let digits = if self.hi == 0 {
            self.lo.unsigned_abs().to_string()
        } else {
            format!("{}{:036}", self.hi.unsigned_abs(), self.lo.unsigned_abs())
        };
        let scale = MAX_SCALE as usize;
        let padded = format!("{digits:0>width$}", width = scale + 1);
        let (whole, fraction) = padded.split_at(padded.len() - scale);
        let fraction = fraction.trim_end_matches('0');
        if fraction.is_empty() {
            write!(f, "{sign}{whole}")
        } else {
            write!(f, "{sign}{whole}.{fraction}")
        }
    }
}

/// Stored as its decimal text, as `Exact` is: the text of a sum within 38 digits is the text of
/// the `Exact` of that value, so a stored partial reads back whichever of the two wrote it.
impl Serialize for Sum {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Sum {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Sum::parse(&text).map_err(serde::de::Error::custom)
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

    /// A zero or a number of trailing zeros under an exponent of billions is twenty bytes of
    /// JSON: reading it takes no time proportional to the exponent (stripping one zero a step
    /// took minutes, and timed out every invocation of its lane), and zero is zero whatever its
    /// exponent.
    #[test]
    fn a_huge_exponent_is_read_at_once_and_zero_under_any_exponent_is_zero() {
        let started = std::time::Instant::now();
        for text in [
            "0e-4294967295",
            "-0.000e-4294967290",
            "0e4294967295",
            "0e39",
        ] {
            assert_eq!(exact(text), Exact::ZERO, "{text}");
        }
        for text in ["100e-4294967295", "1000000e-4294967294"] {
            assert!(
                matches!(Exact::parse(text), Err(ExactError::OutOfRange(_))),
                "{text}"
            );
        }
        assert_eq!(exact("1000e-21"), exact("1e-18"));
        assert!(
            started.elapsed() < std::time::Duration::from_secs(1),
            "took {:?}",
            started.elapsed()
        );
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

    #[test]
    fn a_sum_holds_what_no_exact_can_and_writes_it_back_in_full() {
        let max = Sum::from(exact("99999999999999999999999999999999999999"));
        let tiny = Sum::from(exact("0.000000000000000001"));
        let sum = max.checked_add(max).unwrap().checked_add(tiny).unwrap();
        let text = "199999999999999999999999999999999999998.000000000000000001";
        assert_eq!(sum.to_string(), text);
        assert_eq!(Sum::parse(text).unwrap(), sum);
        let negative = Sum::ZERO.checked_add(Sum::from(exact("-1.5"))).unwrap();
        assert_eq!(negative.to_string(), "-1.5");
        let back = sum
            .checked_add(Sum::parse(&format!("-{text}")).unwrap())
            .unwrap();
        assert_eq!(back, Sum::ZERO);
        assert_eq!(back.to_string(), "0");
        assert!(Sum::parse("1.").is_err() && Sum::parse(&format!("1{}.", "0".repeat(50))).is_err());
        let most = Sum::parse(&format!("{}.5", "9".repeat(56))).unwrap();
        assert_eq!(
            most.checked_add(most),
            Err(ExactError::Overflow),
            "past what parse reads"
        );
        assert!(matches!(
            Exact::parse("1e-9223372036854775808"),
            Err(ExactError::OutOfRange(_))
        ));
        assert!(matches!(
            Exact::parse("1.5e-9223372036854775807"),
            Err(ExactError::OutOfRange(_))
        ));
        for value in ["0", "-0.000000000000000001", "12.5", "-2e3", "1e37"] {
            let sum = Sum::from(exact(value));
            assert_eq!(sum.to_string(), exact(value).to_string(), "{value}");
            assert_eq!(
                serde_json::to_string(&sum).unwrap(),
                serde_json::to_string(&exact(value)).unwrap()
            );
        }
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
        fn a_sum_of_exact_values_is_their_exact_sum_with_either_sign(a in decimal(), b in decimal()) {
            let (x, y) = (exact(&a), exact(&b));
            if let Ok(exact_sum) = x.checked_add(y) {
                let sum = Sum::from(x).checked_add(Sum::from(y)).unwrap();
                prop_assert_eq!(sum, Sum::from(exact_sum));
                prop_assert_eq!(sum.to_string(), exact_sum.to_string());
                prop_assert_eq!(Sum::parse(&sum.to_string()).unwrap(), sum);
            }
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
