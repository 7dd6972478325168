//! What to aggregate: where a record holds its key, its value and its event time (JSON
//! pointers), which aggregates to report, and the windows, if any. `Spec::read` takes a record's
//! data apart without building the document (`keyway::domain::pointer`), and says which field is
//! wrong and why when it cannot.

use std::time::Duration;

use keyway::domain::pointer::{string_of, Pointer, PointerError};
use keyway::InvalidInput;

use crate::aggregate::Aggregate;
use crate::exact::Exact;

/// Tumbling event-time windows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Windows {
    /// How long each window lasts, in milliseconds: windows start at its multiples from the epoch.
    pub size_millis: i64,
    /// How long after its end a window still takes records, on the runtime's clock; a record
    /// that comes later is late: dead-lettered with the reason, never counted.
    pub lateness_millis: i64,
    /// Where a record holds its event time: epoch milliseconds, or an RFC 3339 string.
    pub time: Pointer,
    /// How far ahead of the runtime's clock a record's time may be: a producer's clock running
    /// further ahead is wrong, and every window a key's records open waits in its state, with a
    /// timer, until it closes. A record further ahead is dead-lettered, naming its time.
    pub ahead_millis: i64,
}

impl Windows {
    /// How far ahead of the clock a record's time may be unless configured: an hour.
    pub const AHEAD_MILLIS: i64 = 3_600_000;
}

/// The aggregation a function runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spec {
    /// Where a record holds its key: a string or a number.
    pub key: Pointer,
    /// Where a record holds its value; none when only counting.
    pub value: Option<Pointer>,
    /// The aggregates each result reports.
    pub aggregates: Vec<Aggregate>,
    /// The tumbling windows to aggregate in; none for running totals.
    pub windows: Option<Windows>,
    /// How long a key's running total (without windows) waits before it goes to the merge:
    /// results lag the stream by about this much, and the merge hears from each key at most once
    /// in it however hot the key.
    pub flush: Duration,
}

/// A specification that cannot run.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    /// A key, value or time pointer that is not a JSON pointer.
    #[error(transparent)]
    Pointer(#[from] PointerError),
    /// The named aggregate needs values, and no value pointer is given.
    #[error("{0} needs the records' values: give a value pointer")]
    NoValue(&'static str),
    /// No aggregate is named.
    #[error("no aggregate to report")]
    NoAggregate,
    /// A window shorter than a millisecond, a negative lateness, or a negative bound ahead.
    #[error(
        "a window must last at least a millisecond, and neither lateness nor how far ahead of the \
         clock a time may be can be negative"
    )]
    Window,
}

/// What aggregation reads of one record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reading {
    /// The record's key: a string's text, or a number as written.
    pub key: String,
    /// The record's value, exactly; none when only counting.
    pub value: Option<Exact>,
    /// Event time, epoch milliseconds, when aggregating in windows.
    pub time: Option<i64>,
}

impl Spec {
    /// A specification, checked: every aggregate but the count needs a value pointer.
    pub fn new(
        key: &str,
        value: Option<&str>,
        aggregates: Vec<Aggregate>,
        windows: Option<Windows>,
        flush: Duration,
    ) -> Result<Self, SpecError> {
        if aggregates.is_empty() {
            return Err(SpecError::NoAggregate);
        }
        if value.is_none() {
            if let Some(needs) = aggregates.iter().find(|a| a.needs_values()) {
                return Err(SpecError::NoValue(needs.name()));
            }
        }
        if let Some(w) = &windows {
            if w.size_millis < 1 || w.lateness_millis < 0 || w.ahead_millis < 0 {
                return Err(SpecError::Window);
            }
        }
        Ok(Self {
            key: Pointer::parse(key)?,
            value: value.map(Pointer::parse).transpose()?,
            aggregates,
            windows,
            flush,
        })
    }

    /// The key, value and time of a record's data.
    pub fn read(&self, data: &[u8]) -> Result<Reading, InvalidInput> {
        let key = match self.find(&self.key, data)? {
            raw if raw.first() == Some(&b'"') => {
                string_of(raw).expect("a found string decodes").into_owned()
            }
            raw if is_number(raw) => String::from_utf8_lossy(raw).into_owned(),
            _ => return Err(invalid(&self.key, "expected a string or a number")),
        };
        if key.is_empty() {
            return Err(invalid(&self.key, "must not be empty"));
        }
        let value = match &self.value {
            Some(pointer) => {
                let raw = self.find(pointer, data)?;
                if !is_number(raw) {
                    return Err(invalid(pointer, "expected a number"));
                }
                let text = std::str::from_utf8(raw).expect("a number is ASCII");
                Some(Exact::parse(text).map_err(|e| invalid(pointer, &e.to_string()))?)
            }
            None => None,
        };
        let time = match &self.windows {
            Some(windows) => Some(event_time(&windows.time, self.find(&windows.time, data)?)?),
            None => None,
        };
        Ok(Reading { key, value, time })
    }

    fn find<'a>(&self, pointer: &Pointer, data: &'a [u8]) -> Result<&'a [u8], InvalidInput> {
        match pointer.find(data) {
            Ok(Some(raw)) => Ok(raw),
            Ok(None) => Err(invalid(pointer, "missing")),
            Err(e) => Err(InvalidInput::new("data", format!("expected JSON: {e}"))),
        }
    }
}

/// Event time as epoch milliseconds: a whole number, or an RFC 3339 string.
fn event_time(pointer: &Pointer, raw: &[u8]) -> Result<i64, InvalidInput> {
    let expected = "expected epoch milliseconds or an RFC 3339 time";
    if raw.first() == Some(&b'"') {
        let text = string_of(raw).expect("a found string decodes");
        return chrono::DateTime::parse_from_rfc3339(&text)
            .map(|t| t.timestamp_millis())
            .map_err(|e| invalid(pointer, &format!("{expected}: {e}")));
    }
    std::str::from_utf8(raw)
        .ok()
        .and_then(|text| text.parse::<i64>().ok())
        .ok_or_else(|| invalid(pointer, expected))
}

fn is_number(raw: &[u8]) -> bool {
    matches!(raw.first(), Some(b'-' | b'0'..=b'9'))
}

fn invalid(pointer: &Pointer, problem: &str) -> InvalidInput {
    InvalidInput::new(format!("data{}", pointer.as_str()), problem)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn windowed() -> Spec {
        let windows = Windows {
            size_millis: 60_000,
            lateness_millis: 5_000,
            time: Pointer::parse("/at").unwrap(),
            ahead_millis: Windows::AHEAD_MILLIS,
        };
        Spec::new(
            "/user/id",
            Some("/amount"),
            vec![Aggregate::Sum],
            Some(windows),
            Duration::from_secs(60),
        )
        .unwrap()
    }

    #[test]
    fn a_record_gives_its_key_value_and_time_from_their_pointers() {
        let spec = windowed();
        let reading = spec
            .read(
                br#"{"user": {"id": "u\u00e9"}, "amount": 12.50, "at": 1767225600123, "pad": "x"}"#,
            )
            .unwrap();
        assert_eq!(reading.key, "u\u{e9}");
        assert_eq!(reading.value, Some(Exact::parse("12.5").unwrap()));
        assert_eq!(reading.time, Some(1_767_225_600_123));
        let reading = spec
            .read(br#"{"user": {"id": 42}, "amount": -1, "at": "2026-01-01T00:00:00.5Z"}"#)
            .unwrap();
        assert_eq!(
            (reading.key.as_str(), reading.time),
            ("42", Some(1_767_225_600_500))
        );
    }

    #[test]
    fn a_record_that_cannot_be_read_names_the_field_and_the_problem() {
        let spec = windowed();
        for (data, field, problem) in [
            (
                &br#"{"user": {"id": "a"}, "amount": 1"#[..],
                "data",
                "expected JSON",
            ),
            (
                br#"{"user": {}, "amount": 1, "at": 0}"#,
                "data/user/id",
                "missing",
            ),
            (
                br#"{"user": {"id": true}, "amount": 1, "at": 0}"#,
                "data/user/id",
                "expected a string",
            ),
            (
                br#"{"user": {"id": ""}, "amount": 1, "at": 0}"#,
                "data/user/id",
                "must not be empty",
            ),
            (
                br#"{"user": {"id": "a"}, "amount": "1", "at": 0}"#,
                "data/amount",
                "expected a number",
            ),
            (
                br#"{"user": {"id": "a"}, "amount": 1e40, "at": 0}"#,
                "data/amount",
                "more than 38",
            ),
            (
                br#"{"user": {"id": "a"}, "amount": 1, "at": 1.5}"#,
                "data/at",
                "epoch milliseconds",
            ),
            (
                br#"{"user": {"id": "a"}, "amount": 1, "at": "yesterday"}"#,
                "data/at",
                "RFC 3339",
            ),
        ] {
            let error = spec.read(data).unwrap_err();
            assert_eq!(error.field, field, "{}", String::from_utf8_lossy(data));
            assert!(error.problem.contains(problem), "{error:?}");
        }
    }

    #[test]
    fn a_specification_without_what_its_aggregates_need_is_refused() {
        let flush = Duration::from_secs(1);
        assert_eq!(
            Spec::new(
                "/k",
                None,
                vec![Aggregate::Count, Aggregate::Mean],
                None,
                flush
            ),
            Err(SpecError::NoValue("mean"))
        );
        assert_eq!(
            Spec::new("/k", None, vec![], None, flush),
            Err(SpecError::NoAggregate)
        );
        assert!(matches!(
            Spec::new("k", None, vec![Aggregate::Count], None, flush),
            Err(SpecError::Pointer(_))
        ));
        assert!(Spec::new("/k", None, vec![Aggregate::Count], None, flush).is_ok());
    }
}
