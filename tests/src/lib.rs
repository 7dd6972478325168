//! Helpers for the end-to-end tests: the AWS emulator harness (random resource names, readiness
//! polling, clean-up), an in-memory world for executor tests, and test operators.

pub mod cdc;
pub mod emulator;
pub mod excerpts;
pub mod harness;
pub mod operators;
pub mod samples;
pub mod scripted;
pub mod trails;

pub use keyway_stack::filtering::dead_letter_reasons;

/// The `id` of every event the embedded runtime's queue `queue` received since the last call, in
/// the order received.
pub fn received_ids(sqs: &keyway_local::LocalSqs, queue: &str) -> Vec<String> {
    let url = format!("{}{queue}", keyway_local::LocalSqs::URL_PREFIX);
    sqs.receive(&url, usize::MAX)
        .iter()
        .map(|m| {
            let event: serde_json::Value = serde_json::from_str(&m.body).expect("an event");
            event["id"].as_str().expect("an event id").to_owned()
        })
        .collect()
}

/// The dead letters the embedded runtime's queue at `url` holds (kept there).
pub fn dead_letters_on(sqs: &keyway_local::LocalSqs, url: &str) -> Vec<keyway::domain::DeadLetter> {
    sqs.messages(url)
        .iter()
        .map(|m| serde_json::from_str(&m.body).expect("a dead letter"))
        .collect()
}

/// The keyed counter's function on `services`, wired as the stack wires it (a state table, a
/// counts queue, a dead-letter queue), and its dead-letter queue's URL.
pub fn keyed_counter_on(
    services: &keyway_local::LocalServices,
) -> (
    keyway::lambda::StreamHandler<keyed_counter::KeyedCounter>,
    String,
) {
    services.dynamodb.create_table(
        "state",
        keyway_local::KeySchema::state_table(),
        Some(keyway::adapters::dynamodb::TTL.into()),
        None,
    );
    let counts = services.sqs.create_queue("counts");
    let dead = services.sqs.create_queue("dead");
    let env = keyway::lambda::env_of(&[
        ("STATE_TABLE", "state"),
        ("COUNTS_SINK", &format!("sqs:{counts}")),
        ("DEAD_LETTER_SINK", &format!("sqs:{dead}")),
    ]);
    let handler = keyed_counter::handler(services, &env).expect("the keyed counter wires");
    (handler, dead)
}
