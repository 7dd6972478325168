//! keyway: keyed stream processing as serverless Rust functions on AWS Lambda, Kinesis, DynamoDB,
//! DynamoDB Streams and SQS.
//!
//! Layers, innermost first: `domain` (the pure model: records, keys, state, outputs), `ports`
//! (the narrow traits the runtime needs), `operator` (the API applications implement), `executor`
//! (runs a batch through an operator with exactly-once state effects), `sources` (Lambda payloads
//! to domain records) and `adapters` (the AWS SDK implementations of the ports), `lambda` (the
//! handlers and the platform wiring a function's `main` calls). Each layer uses only the layers
//! before it. The embedded runtime that runs them in memory is the `keyway-local` crate, which no
//! function binary links.

// Functions of one step each: clippy.toml sets the threshold (tests, which read as scenarios,
// are left out).
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod adapters;
pub mod domain;
pub mod executor;
pub mod lambda;
pub mod operator;
pub mod ports;
pub mod sources;

pub use domain::RejectedRecord;
pub use executor::{BatchReport, Executor, ExecutorConfig, Inputs, Lineage, Sinks, WiringError};
pub use operator::{
    Ctx, Delivery, Input, InvalidInput, KeyedOperator, ListState, MapState, ProcessError, Sink,
    ValueState,
};
