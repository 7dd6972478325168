//! The embedded runtime: Kinesis, DynamoDB (with streams and TTL) and SQS in memory, the event
//! payloads Lambda sends, virtual time, and fault injection. `keyway demo` and most tests run on it.
//!
//! The services are emulated at the level of the narrow service APIs the adapters are written
//! against (`Table`, `KinesisApi`, `SqsApi`), not at the HTTP level of the AWS SDK. The adapters'
//! own logic — item layout, batching, retries, partial failures — therefore runs unchanged here
//! and on AWS, and the function code, generic over ports, does too; what is left out is the SDK's
//! serialization, which the emulator suite covers against ministack. Emulating at that level also
//! makes each fault land exactly where a service would return it (an unprocessed key, one failed
//! record of a PutRecords call), keeps a run deterministic under a seed, and costs microseconds.

pub mod clock;
pub mod dynamodb;
pub mod esm;
pub mod events;
pub mod faults;
pub mod kinesis;
pub mod meter;
pub mod runtime;
pub mod sqs;
pub mod template;

pub use clock::VirtualClock;
pub use dynamodb::{KeySchema, LocalDynamoDb, LocalTable, StreamRecord};
pub use esm::{EventSourceMapping, MappingSettings, MappingSource, MappingStats, StartingPosition};
pub use faults::{FaultPlan, Faults};
pub use kinesis::{LocalKinesis, StoredRecord};
pub use meter::{thread_cpu_time, Meter, MeterSnapshot};
pub use runtime::{
    CrashBeforeCommit, Factory, LocalError, LocalRuntime, LocalServices, RunReport, ScheduleStats,
};
pub use sqs::{LocalSqs, QueuedMessage};
