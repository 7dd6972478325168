//! Helpers for the end-to-end tests: the AWS emulator harness (random resource names, readiness
//! polling, clean-up), an in-memory world for executor tests, and test operators.

pub mod emulator;
pub mod harness;
pub mod operators;
pub mod samples;
pub mod scripted;
pub mod trails;

/// The reasons of the dead letters a queue of the embedded runtime holds (taking them), each as
/// "field: problem", sorted.
pub fn dead_letter_reasons(sqs: &keyway::local::LocalSqs, url: &str) -> Vec<String> {
    let mut reasons: Vec<String> = sqs
        .receive(url, usize::MAX)
        .iter()
        .map(|m| {
            let letter: serde_json::Value = serde_json::from_str(&m.body).expect("a dead letter");
            let text = |name: &str| letter[name].as_str().unwrap_or_default().to_owned();
            format!("{}: {}", text("field"), text("problem"))
        })
        .collect();
    reasons.sort();
    reasons
}

/// The `id` of every event the embedded runtime's queue `queue` received since the last call, in
/// the order received.
pub fn received_ids(sqs: &keyway::local::LocalSqs, queue: &str) -> Vec<String> {
    let url = format!("https://sqs.us-east-1.amazonaws.com/000000000000/{queue}");
    sqs.receive(&url, usize::MAX)
        .iter()
        .map(|m| {
            let event: serde_json::Value = serde_json::from_str(&m.body).expect("an event");
            event["id"].as_str().expect("an event id").to_owned()
        })
        .collect()
}
