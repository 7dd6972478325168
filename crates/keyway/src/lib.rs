//! keyway: keyed stream processing as serverless Rust functions on AWS Lambda, Kinesis, DynamoDB,
//! DynamoDB Streams and SQS.
//!
//! Layers, innermost first: `domain` (pure model), `ports` (traits the runtime needs), `adapters`
//! (AWS SDK and in-memory implementations of the ports), `sources` (Lambda payloads to domain
//! records and batch responses back), `operator` (the API applications implement) and `executor`
//! (runs a batch through an operator with exactly-once state effects).

pub mod adapters;
pub mod domain;
pub mod executor;
pub mod lambda;
#[cfg(feature = "local")]
pub mod local;
pub mod operator;
pub mod ports;
pub mod sources;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use executor::{
    BatchReport, Executor, ExecutorConfig, Inputs, Lineage, RejectedRecord, Sinks, WiringError,
};
pub use operator::{
    Ctx, Delivery, Input, InvalidInput, KeyedOperator, ListState, MapState, ProcessError, Sink,
    ValueState,
};
