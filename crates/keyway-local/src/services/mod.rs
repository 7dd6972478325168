//! The AWS services the embedded runtime emulates, in memory: DynamoDB with streams and TTL,
//! Kinesis and SQS, with fault injection (`faults`), metering (`meter`) and virtual time
//! (`clock`). Each answers the narrow service API its adapter is written against.

pub mod clock;
pub mod dynamodb;
pub mod faults;
pub mod kinesis;
pub mod meter;
pub mod shards;
pub mod sqs;
