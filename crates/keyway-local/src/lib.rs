//! keyway-local, the embedded runtime: Kinesis, DynamoDB (with streams and TTL) and SQS in memory (`services`),
//! the event source mapping that invokes functions as Lambda does (`mapping`), the reader of a
//! SAM or CloudFormation stack (`template`), and `runtime`, which deploys a stack on the services
//! and runs it. `keyway demo` and most tests run on it. `testing` holds the ports' contract
//! suites, which every implementation (in memory, the SDK against the emulator) passes. What a run's functions would be billed
//! on AWS is metered as they run (`usage`).
//!
//! The services are emulated at the level of the narrow service APIs the adapters are written
//! against (`Table`, `KinesisApi`, `SqsApi`), not at the HTTP level of the AWS SDK. The adapters'
//! own logic — item layout, batching, retries, partial failures — therefore runs unchanged here
//! and on AWS, and the function code, generic over ports, does too; what is left out is the SDK's
//! serialization, which the emulator suite covers against ministack. Emulating at that level also
//! makes each fault land exactly where a service would return it (an unprocessed key, one failed
//! record of a PutRecords call), keeps a run deterministic under a seed, and costs microseconds.
//!
//! A function that is not of this workspace runs as its own process (`external`), behind the
//! Lambda Runtime API; its SDK reaches the same services through their AWS APIs over HTTP
//! (`aws_api`), and only it pays for the serialization.

// Functions of one step each: clippy.toml sets the threshold (tests, which read as scenarios,
// are left out).
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod aws_api;
pub mod external;
mod http;
pub mod mapping;
pub mod runtime;
pub mod services;
pub mod template;
pub mod testing;
mod usage;

pub use aws_api::AwsApi;
pub use external::{Bootstrap, ExternalFunction};
pub use mapping::{
    EventSourceMapping, MappingSettings, MappingSource, MappingStats, Spent, StartingPosition,
};
pub use runtime::{
    CrashBeforeCommit, Factory, LocalError, LocalRuntime, LocalServices, RunReport, ScheduleStats,
};
pub use services::clock::VirtualClock;
pub use services::dynamodb::{
    KeySchema, LocalDynamoDb, LocalTable, StreamRecord, StreamView, DEFAULT_TTL_DELAY,
};
pub use services::faults::{Fault, FaultCounts, FaultPlan, Faults};
pub use services::kinesis::{Data, LocalKinesis, StoredRecord};
pub use services::meter::{thread_cpu_time, Billed, Meter, MeterSnapshot};
pub use services::sqs::{LocalSqs, QueuedMessage};
pub use usage::{Latencies, Usage};
