//! `InvalidInput`: what is wrong with a piece of input, and where.

use thiserror::Error;

/// Input that can never be processed: the field and what is wrong with it. A record rejected so
/// goes to the dead-letter sink with this reason, the two parts kept apart; the batch goes on.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("{field}: {problem}")]
pub struct InvalidInput {
    /// Where the problem is: a field or a path into the input, e.g. `dynamodb.NewImage`.
    pub field: String,
    /// What is wrong with it.
    pub problem: String,
}

impl InvalidInput {
    /// Input whose `field` has `problem`.
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            problem: problem.into(),
        }
    }
}
