//! What a function needs to run on Lambda and on the embedded runtime alike: the platform its
//! wiring asks for ports (`platform`; on AWS, `aws`), its environment (`env`), and the handler the
//! event source mapping invokes (`handler`).
//!
//! A function crate exposes `handler(platform, env)`; its `main` calls it with the AWS platform
//! and the process environment and hands it to `serve`, the embedded runtime with its in-memory services and the
//! environment template.yaml gives the function. One invocation, followed through: `main` hands
//! the event to `StreamHandler::handle` (here), which decodes it (`sources`), runs the batch
//! (`executor`) and answers the partial batch response (here).

pub mod aws;
mod env;
mod handler;
mod platform;
mod reach;
mod serve;

pub use aws::AwsClients;
pub use env::{
    check_mapping, env_of, executor_config, hot_key_registry, observed, read_table_from, required,
    sink_from, state_store_from, table_from, whole_number, ConfigError, Env, SetupError,
    HOT_KEYS_PERIOD, HOT_KEYS_TABLE, LINEAGE, REDELIVERY_WINDOW,
};
pub use handler::{
    dynamodb_response, is_scheduled, kinesis_response, run_dynamodb, run_kinesis, FunctionError,
    Handler, Invocation, Response, SourceError, StreamHandler,
};
pub use platform::{Platform, PortError, SinkMaker, SinkTarget, TableAccess};
pub use reach::{Reach, Recording};
pub use serve::{run, serve};
