//! Typed inputs by stream (Flink's connected streams, `CoProcessFunction`): an operator that
//! reads several streams (events and a feedback stream; the two tables of a join) declares one
//! `Input<T>` for each, and the function wires each to the stream it reads. The executor marks
//! every record with the input that reads its stream, and `decode` turns it into that input's type
//! by that mark, never by guessing from the record's shape. (`tests/tests/executor.rs`, module
//! `two_inputs`, compiles and runs a whole operator of two inputs.)
//!
//! ```text
//! const EVENTS: Input<Event> = Input::json("events");
//! const FEEDBACK: Input<Resolution> = Input::json("feedback");
//!
//! fn decode(&self, record: &SourceRecord) -> Result<Enrich, InvalidInput> {
//!     record.route().input(&EVENTS, Enrich::Event).input(&FEEDBACK, Enrich::Resolved).done()
//! }
//! ```

use std::marker::PhantomData;

use serde::de::DeserializeOwned;

use super::InvalidInput;
use crate::domain::SourceRecord;

/// An input of records decoded into `T`, by name: the name the function wires a stream to.
pub struct Input<T> {
    /// The input's name, as the function wires a stream to it.
    pub name: &'static str,
    decode: fn(&SourceRecord) -> Result<T, InvalidInput>,
    _type: PhantomData<fn() -> T>,
}

impl<T> Input<T> {
    /// An input whose records `decode` turns into `T`.
    pub const fn new(
        name: &'static str,
        decode: fn(&SourceRecord) -> Result<T, InvalidInput>,
    ) -> Self {
        Self {
            name,
            decode,
            _type: PhantomData,
        }
    }

    /// What the operator lists in `inputs()` for this input.
    pub fn descriptor(&self) -> InputDescriptor {
        InputDescriptor {
            name: self.name,
            type_name: std::any::type_name::<T>(),
        }
    }
}

impl<T: DeserializeOwned> Input<T> {
    /// An input of Kinesis records whose data is JSON of `T`.
    pub const fn json(name: &'static str) -> Self {
        Self::new(name, SourceRecord::json::<T>)
    }
}

/// What an operator declares about one of its inputs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputDescriptor {
    /// The input's name, as `Input::name`.
    pub name: &'static str,
    /// The Rust type its records decode into.
    pub type_name: &'static str,
}

/// An operator's declared inputs do not match the streams its function wires to them.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum InputWiringError {
    /// A declared input has no stream wired to it.
    #[error("operator {operator}: input {input:?} is declared in inputs() but the function wires no stream to it")]
    Unwired {
        /// The operator's name.
        operator: String,
        /// The input's name.
        input: String,
    },
    /// A stream is wired to an input the operator does not declare.
    #[error("operator {operator}: the function wires stream {stream:?} to input {input:?}, which the operator does not declare in inputs()")]
    Undeclared {
        /// The operator's name.
        operator: String,
        /// The input's name.
        input: String,
        /// The stream wired to it.
        stream: String,
    },
    /// Two declared inputs have the same name.
    #[error("operator {operator}: input {input:?} is declared twice")]
    Duplicate {
        /// The operator's name.
        operator: String,
        /// The input's name.
        input: String,
    },
    /// One stream is wired to two inputs, so its records could not say which they are.
    #[error(
        "operator {operator}: stream {stream:?} is wired to two inputs; a record must have one"
    )]
    SharedStream {
        /// The operator's name.
        operator: String,
        /// The stream's name.
        stream: String,
    },
}

/// Checks that `wired` (stream, input) gives every input in `declared` a stream, names no other
/// input, and gives no stream two inputs.
pub fn check_inputs(
    operator: &str,
    declared: &[InputDescriptor],
    wired: &[(String, &'static str)],
) -> Result<(), InputWiringError> {
    let operator = || operator.to_owned();
    let mut names = std::collections::BTreeSet::new();
    for input in declared {
        if !names.insert(input.name) {
            return Err(InputWiringError::Duplicate {
                operator: operator(),
                input: input.name.to_owned(),
            });
        }
    }
    let mut streams = std::collections::BTreeSet::new();
    for (stream, input) in wired {
        if !names.contains(input) {
            return Err(InputWiringError::Undeclared {
                operator: operator(),
                input: (*input).to_owned(),
                stream: stream.clone(),
            });
        }
        if !streams.insert(stream.as_str()) {
            return Err(InputWiringError::SharedStream {
                operator: operator(),
                stream: stream.clone(),
            });
        }
    }
    match names
        .into_iter()
        .find(|name| !wired.iter().any(|(_, input)| input == name))
    {
        Some(name) => Err(InputWiringError::Unwired {
            operator: operator(),
            input: name.to_owned(),
        }),
        None => Ok(()),
    }
}

/// Decoding a record by the input it came from (see the module's example).
pub struct Route<'r, I> {
    record: &'r SourceRecord,
    decoded: Option<Result<I, InvalidInput>>,
}

impl SourceRecord {
    /// Starts decoding this record by its input.
    pub fn route<I>(&self) -> Route<'_, I> {
        Route {
            record: self,
            decoded: None,
        }
    }
}

impl<I> Route<'_, I> {
    /// When the record came from `input`: decoded as `input`'s type, then made the operator's
    /// input by `into`.
    pub fn input<T>(mut self, input: &Input<T>, into: impl FnOnce(T) -> I) -> Self {
        if self.decoded.is_none() && self.record.input == Some(input.name) {
            self.decoded = Some((input.decode)(self.record).map(into));
        }
        self
    }

    /// The decoded input, or why the record belongs to none of the inputs routed above.
    pub fn done(self) -> Result<I, InvalidInput> {
        let stream = &self.record.stream;
        self.decoded.unwrap_or_else(|| {
            Err(InvalidInput::new(
                "eventSourceARN",
                format!("stream {stream:?} is none of the operator's inputs"),
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Origin, Payload, SequenceNumber};

    #[derive(Debug, PartialEq, serde::Deserialize)]
    struct Click {
        user: String,
    }

    const CLICKS: Input<Click> = Input::json("clicks");
    const LENGTHS: Input<usize> = Input::new("lengths", |r| match &r.payload {
        Payload::Bytes(data) => Ok(data.len()),
        _ => Err(InvalidInput::new("record", "not Kinesis")),
    });

    #[derive(Debug, PartialEq)]
    enum Either {
        Click(Click),
        Length(usize),
    }

    fn record(input: Option<&'static str>) -> SourceRecord {
        SourceRecord {
            stream: "s".into(),
            input,
            origin: Origin("s/shardId-0".into()),
            lineage: Origin("s/shardId-0/p".into()),
            sequence: SequenceNumber::parse("1").unwrap(),
            partition_key: "p".into(),
            arrival_millis: None,
            payload: Payload::Bytes(br#"{"user":"u1"}"#.to_vec().into()),
            raw: crate::domain::RawJson::from_value(&serde_json::Value::Null),
        }
    }

    fn decode(record: &SourceRecord) -> Result<Either, InvalidInput> {
        record
            .route()
            .input(&CLICKS, Either::Click)
            .input(&LENGTHS, Either::Length)
            .done()
    }

    #[test]
    fn a_record_is_decoded_as_the_input_it_was_routed_to_whatever_its_shape() {
        let clicked = decode(&record(Some("clicks"))).unwrap();
        assert_eq!(clicked, Either::Click(Click { user: "u1".into() }));
        // The same bytes from the other input's stream are that input's.
        assert_eq!(
            decode(&record(Some("lengths"))).unwrap(),
            Either::Length(13)
        );
    }

    #[test]
    fn every_declared_input_needs_its_own_stream_and_only_declared_inputs_get_one() {
        let declared = [CLICKS.descriptor(), LENGTHS.descriptor()];
        let wired = |pairs: &[(&str, &'static str)]| -> Vec<(String, &'static str)> {
            pairs.iter().map(|(s, i)| ((*s).to_owned(), *i)).collect()
        };
        let check = |pairs: &[(&str, &'static str)]| check_inputs("op", &declared, &wired(pairs));
        assert_eq!(check(&[("a", "clicks"), ("b", "lengths")]), Ok(()));
        assert_eq!(
            check(&[("a", "clicks"), ("c", "clicks"), ("b", "lengths")]),
            Ok(())
        );
        assert_eq!(
            check(&[("a", "clicks")]),
            Err(InputWiringError::Unwired {
                operator: "op".into(),
                input: "lengths".into()
            })
        );
        assert!(matches!(
            check(&[("a", "clicks"), ("b", "lengths"), ("d", "views")]),
            Err(InputWiringError::Undeclared { .. })
        ));
        assert!(matches!(
            check(&[("a", "clicks"), ("a", "lengths")]),
            Err(InputWiringError::SharedStream { .. })
        ));
        let twice = [CLICKS.descriptor(), CLICKS.descriptor()];
        assert!(matches!(
            check_inputs("op", &twice, &wired(&[("a", "clicks")])),
            Err(InputWiringError::Duplicate { .. })
        ));
        assert_eq!(check_inputs("op", &[], &[]), Ok(()));
    }

    #[test]
    fn a_record_of_no_input_is_invalid_and_names_its_stream() {
        let err = decode(&record(None)).unwrap_err();
        assert_eq!(err.field, "eventSourceARN");
        assert_eq!(err.problem, "stream \"s\" is none of the operator's inputs");
    }
}
