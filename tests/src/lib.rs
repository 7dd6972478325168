//! Helpers for the end-to-end tests: the AWS emulator harness (random resource names, readiness
//! polling, clean-up), an in-memory world for executor tests, and test operators.

pub mod cdc;
pub mod emulator;
pub mod harness;
pub mod operators;
pub mod samples;
pub mod scripted;
pub mod trails;

pub use keyway_stack::filtering::dead_letter_reasons;

/// The `id` of every event the embedded runtime's queue `queue` received since the last call, in
/// the order received.
pub fn received_ids(sqs: &keyway::local::LocalSqs, queue: &str) -> Vec<String> {
    let url = format!("{}{queue}", keyway::local::LocalSqs::URL_PREFIX);
    sqs.receive(&url, usize::MAX)
        .iter()
        .map(|m| {
            let event: serde_json::Value = serde_json::from_str(&m.body).expect("an event");
            event["id"].as_str().expect("an event id").to_owned()
        })
        .collect()
}
