//! `keyway bench`: each benchmark against a baseline measured in the same run, as a table or as
//! JSON (`--json`). Ratios, not absolute figures: the machine may be shared and noisy.

mod cdc;
mod cost;
mod filter;
mod identity;
mod local;
mod package;
mod runtime;
mod skew;

use crate::error::CliError;

#[derive(clap::Subcommand)]
pub(crate) enum BenchCommand {
    /// The batch executor against a naive GetItem + PutItem per event design, in one run.
    Runtime(runtime::Args),
    /// Events per second through the embedded runtime, with a no-op function and with the keyed
    /// counter, in one run.
    Local(local::Args),
    /// The identity enricher against partitioning by customer (skew on 8 shards) and against a
    /// naive lookup-and-write per record (DynamoDB capacity, CPU), and `keyway enrich` over a
    /// million records, in one run.
    Identity(identity::Args),
    /// The CDC join against a design that keeps the whole joined row set of a join key in one
    /// item (DynamoDB capacity units per 1,000 changes, changes per second per core), in one run.
    Cdc(cdc::Args),
    /// The dynamic filter against the per-event lookup design it replaces (DynamoDB capacity,
    /// CPU, SQS calls) and the monthly cost against the article's brute force, in one run.
    Filter(filter::Args),
    /// Salting against its targets: shard loads of 8 shards with 99% of the events on one key,
    /// unsalted and over 32 buckets; the adaptive strategy's time to salt a key turned hot; and
    /// the events through keyed aggregation, whose counts must equal the oracle's.
    Skew(skew::Args),
    /// Each function's Lambda zip, as `cargo lambda build --release` or `sam build` left it,
    /// its architecture, and its cold start on the embedded runtime where this machine runs it.
    Package(package::Args),
    /// Each application's cost in dollars per million events on AWS, from a metered run on the
    /// embedded runtime, beside Managed Service for Apache Flink at the KPUs the same rate needs;
    /// prices are inputs, AWS's us-east-1 list prices by default.
    Cost(cost::Args),
}

pub(crate) fn run(which: BenchCommand) -> Result<(), CliError> {
    match which {
        BenchCommand::Runtime(args) => runtime::run(args),
        BenchCommand::Local(args) => local::run(args),
        BenchCommand::Identity(args) => identity::run(args),
        BenchCommand::Cdc(args) => cdc::run(args),
        BenchCommand::Filter(args) => filter::run(args),
        BenchCommand::Skew(args) => skew::run(args),
        BenchCommand::Package(options) => package::run(options),
        BenchCommand::Cost(args) => cost::run(args),
    }
}
