//! Implementations of the ports on the AWS SDK (`dynamodb`, `kinesis`, `sqs`). Each adapter is
//! split into a narrow service API (one trait, the few operations used) and the logic on top of it
//! (batching, retries, item layout), so that the same logic runs on AWS and on the in-memory
//! services of the embedded runtime (the `keyway-local` crate).

pub mod dynamodb;
pub mod kinesis;
pub mod permissions;
pub mod retry;
pub(crate) mod sdk_error;
pub mod sqs;
