//! In-memory implementations of the narrow service ports: a DynamoDB table, Kinesis streams and
//! SQS queues that follow the services' contracts (limits, conditions, partial failures) and meter
//! what the same calls would cost on AWS.

mod meter;
mod sink;
mod table;

pub use meter::{thread_cpu_time, Meter, MeterSnapshot};
pub use sink::{
    EntryFaults, MemoryKinesis, MemorySqs, QueuedMessage, StoredRecord, FIFO_DEDUPLICATION_WINDOW,
};
pub use table::{MemoryTable, TableFaults};
