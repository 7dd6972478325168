//! Typed, declared sinks (Flink's `OutputTag`): an operator names each place its outputs go as a
//! constant of the type it sends there, lists them in `KeyedOperator::sinks`, and emits through
//! them. The executor checks the list against the sinks the function wires when it is built, so a
//! sink that is declared and not wired (or wired and not declared) stops the function at start,
//! instead of blocking keys when the first output goes there.

use std::marker::PhantomData;

use crate::domain::DEAD_LETTER_SINK;

/// A sink that outputs of type `T` go to, by name: `const COUNTS: Sink<CountUpdate> =
/// Sink::new("counts");`.
pub struct Sink<T> {
    /// The sink's name, as the function wires it.
    pub name: &'static str,
    _type: PhantomData<fn(&T)>,
}

impl<T> Sink<T> {
    /// The sink named `name`.
    pub const fn new(name: &'static str) -> Self {
        Self {
            name,
            _type: PhantomData,
        }
    }

    /// What the operator lists in `sinks()` for this sink.
    pub fn descriptor(&self) -> SinkDescriptor {
        SinkDescriptor {
            name: self.name,
            type_name: std::any::type_name::<T>(),
        }
    }
}

/// What an operator declares about one of its sinks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SinkDescriptor {
    /// The sink's name, as `Sink::name`.
    pub name: &'static str,
    /// The Rust type of its outputs, for people reading errors and logs.
    pub type_name: &'static str,
}

/// An operator's declared sinks do not match the sinks its function wires.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum SinkWiringError {
    /// A declared sink is not wired.
    #[error("operator {operator}: sink {sink:?} is declared in sinks() but the function wires no sink of that name")]
    Unwired {
        /// The operator's name.
        operator: String,
        /// The sink's name.
        sink: String,
    },
    /// A wired sink is not declared.
    #[error("operator {operator}: the function wires a sink {sink:?} that the operator does not declare in sinks()")]
    Undeclared {
        /// The operator's name.
        operator: String,
        /// The sink's name.
        sink: String,
    },
    /// Two declared sinks have the same name.
    #[error("operator {operator}: sink {sink:?} is declared twice")]
    Duplicate {
        /// The operator's name.
        operator: String,
        /// The sink's name.
        sink: String,
    },
    /// The operator declares the dead-letter sink, which is every function's.
    #[error("operator {operator}: {DEAD_LETTER_SINK:?} names the dead-letter sink, which every function has; an operator cannot declare it")]
    Reserved {
        /// The operator's name.
        operator: String,
    },
}

/// Checks that `declared` and `wired` (the dead-letter sink left out) name the same sinks.
pub fn check_sinks<'a>(
    operator: &str,
    declared: &[SinkDescriptor],
    wired: impl Iterator<Item = &'a str>,
) -> Result<(), SinkWiringError> {
    let mut names = std::collections::BTreeSet::new();
    for sink in declared {
        if sink.name == DEAD_LETTER_SINK {
            return Err(SinkWiringError::Reserved {
                operator: operator.to_owned(),
            });
        }
        if !names.insert(sink.name) {
            return Err(SinkWiringError::Duplicate {
                operator: operator.to_owned(),
                sink: sink.name.to_owned(),
            });
        }
    }
    let mut wired: std::collections::BTreeSet<&str> =
        wired.filter(|name| *name != DEAD_LETTER_SINK).collect();
    for name in names {
        if !wired.remove(name) {
            return Err(SinkWiringError::Unwired {
                operator: operator.to_owned(),
                sink: name.to_owned(),
            });
        }
    }
    match wired.into_iter().next() {
        Some(extra) => Err(SinkWiringError::Undeclared {
            operator: operator.to_owned(),
            sink: extra.to_owned(),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COUNTS: Sink<u64> = Sink::new("counts");
    const ALERTS: Sink<String> = Sink::new("alerts");

    fn check(declared: &[SinkDescriptor], wired: &[&str]) -> Result<(), SinkWiringError> {
        check_sinks("op", declared, wired.iter().copied())
    }

    #[test]
    fn declared_sinks_must_be_exactly_the_wired_ones() {
        let both = [COUNTS.descriptor(), ALERTS.descriptor()];
        assert_eq!(
            check(&both, &["alerts", "counts", DEAD_LETTER_SINK]),
            Ok(())
        );
        assert_eq!(check(&[], &[DEAD_LETTER_SINK]), Ok(()));
        assert_eq!(
            check(&both, &["counts"]),
            Err(SinkWiringError::Unwired {
                operator: "op".into(),
                sink: "alerts".into()
            })
        );
        assert_eq!(
            check(&[COUNTS.descriptor()], &["counts", "alerts"]),
            Err(SinkWiringError::Undeclared {
                operator: "op".into(),
                sink: "alerts".into()
            })
        );
    }

    #[test]
    fn a_sink_declared_twice_or_as_the_dead_letter_sink_is_refused() {
        let twice = [COUNTS.descriptor(), Sink::<i32>::new("counts").descriptor()];
        assert!(matches!(
            check(&twice, &["counts"]),
            Err(SinkWiringError::Duplicate { .. })
        ));
        let reserved = [Sink::<()>::new(DEAD_LETTER_SINK).descriptor()];
        let err = check(&reserved, &[]).unwrap_err();
        assert!(err.to_string().contains("dead-letter"), "{err}");
    }

    #[test]
    fn a_descriptor_names_the_type_of_its_outputs() {
        assert_eq!(COUNTS.descriptor().type_name, "u64");
        assert_eq!(COUNTS.descriptor().name, "counts");
    }
}
