//! The embedded runtime: what runs keyway functions on a laptop, in tests and in `keyway demo`,
//! without AWS. For now it builds the Lambda event payloads the event source mapping would send;
//! the in-memory services live in `adapters::memory`.

pub mod events;
