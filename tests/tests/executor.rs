//! How the executor handles the cases around its guarantees: invalid input met while processing,
//! sinks that fail, large state, state TTL and outbox redelivery.

use std::sync::Arc;
use std::time::Duration;

use keyed_counter::{CountUpdate, KeyedCounter, COUNTS};
use keyway::adapters::sqs::SqsSink;
use keyway::domain::Payload;
use keyway::operator::StateDescriptor;
use keyway::sources::kinesis::decode_event;
use keyway::{Ctx, Executor, InvalidInput, KeyedOperator, ProcessError, Sinks};
use keyway_tests::harness::{count, redelivery, run_to_completion, stored_count, Shard, World};
use keyway_tests::operators::{Buffer, FlakySink, Resolved, Waker, RESOLVED};

#[tokio::test]
async fn an_input_found_invalid_while_processing_is_dead_lettered_and_its_key_goes_on_without_it() {
    let world = World::new(&[COUNTS.name]);
    let executor = world.executor(KeyedCounter);
    let mut shard = Shard::new("in", 0);
    let event = shard.batch(&[count("a", 5), count("a", u64::MAX), count("a", 2)]);
    let report = executor
        .run(decode_event(&event.to_string()).unwrap())
        .await;
    assert_eq!(report.failed_from, None);
    assert_eq!(report.dead_lettered, 1);
    assert_eq!(
        stored_count(&world, &executor, "a").await,
        Some(7),
        "the overflowing amount is not applied"
    );
    let letter = &world.dead_letters()[0];
    assert_eq!(letter.field, "data.amount");
    assert!(letter.problem.contains("overflow"), "{}", letter.problem);
    let counts: Vec<u64> = world
        .outputs(COUNTS.name)
        .iter()
        .map(|m| serde_json::from_str::<CountUpdate>(&m.body).unwrap().count)
        .collect();
    assert_eq!(counts, [5, 7]);
}

#[tokio::test]
async fn an_output_that_cannot_be_sent_keeps_its_record_unapplied_until_a_redelivery_sends_it() {
    let world = World::new(&[]);
    let queue = world.sqs.create_queue("counts");
    let flaky = Arc::new(FlakySink::new(Arc::new(SqsSink::new(
        world.sqs.clone(),
        &queue,
    ))));
    let sinks = world.sinks().with(&COUNTS, flaky.clone());
    let executor = Executor::new(
        KeyedCounter,
        world.store.clone(),
        sinks,
        world.clock.clone(),
    )
    .unwrap();
    let mut shard = Shard::new("in", 0);
    let event = shard.batch(&[count("a", 1), count("b", 1), count("a", 1)]);

    flaky.set_down(true);
    let report = executor
        .run(decode_event(&event.to_string()).unwrap())
        .await;
    assert_eq!(
        report.failed_from.as_ref().map(|s| s.to_string()),
        event["Records"][0]["kinesis"]["sequenceNumber"]
            .as_str()
            .map(str::to_owned)
    );
    assert_eq!(
        stored_count(&world, &executor, "a").await,
        None,
        "nothing is committed for unsent outputs"
    );

    flaky.set_down(false);
    let reports = run_to_completion(
        &executor,
        &redelivery(&event, report.failed_from.as_ref().unwrap()),
        2,
    )
    .await;
    assert_eq!(
        (reports.len(), reports[0].applied, reports[0].replayed),
        (1, 3, 0),
        "the redelivery applies what the first attempt could not send, once"
    );
    assert_eq!(stored_count(&world, &executor, "a").await, Some(2));
    assert_eq!(world.sqs.messages(&queue).len(), 3, "every output arrives");
}

#[tokio::test]
async fn a_key_holding_ten_thousand_list_entries_of_two_kilobytes_works() {
    let world = World::new(&["flushed"]);
    let executor = world.executor(Buffer);
    let mut shard = Shard::new("in", 0);
    // Ten batches of 1,000 entries, as ten invocations would deliver them.
    for b in 0..10 {
        let records: Vec<(&str, Vec<u8>)> = (0..1000)
            .map(|i| {
                (
                    "k",
                    format!("{:05}{}", b * 1000 + i, "x".repeat(2043)).into_bytes(),
                )
            })
            .collect();
        let report = executor
            .run(decode_event(&shard.batch(&records).to_string()).unwrap())
            .await;
        assert_eq!((report.applied, report.failed_from), (1000, None));
    }
    assert!(
        world
            .table
            .items()
            .iter()
            .all(|i| keyway::domain::item::item_size(i) <= 400 * 1024),
        "every item fits DynamoDB"
    );
    assert!(
        world.table.len() > 40,
        "20 MB of state spans many items: {}",
        world.table.len()
    );

    let report = executor
        .run(decode_event(&shard.batch(&[("k", b"FLUSH".to_vec())]).to_string()).unwrap())
        .await;
    assert_eq!(report.failed_from, None);
    let flushed: serde_json::Value =
        serde_json::from_str(&world.outputs("flushed")[0].body).unwrap();
    assert_eq!(
        flushed,
        serde_json::json!({"count": 10_000, "in_order": true})
    );
    // The next commit deletes the segments the flush retired.
    executor
        .run(decode_event(&shard.batch(&[("k", b"00000-after".to_vec())]).to_string()).unwrap())
        .await;
    assert_eq!(world.state_items(), 1, "only the head item is left");
}

/// A counter whose state lives one hour after its last change.
struct ExpiringCounter;

impl KeyedOperator for ExpiringCounter {
    type Input = keyed_counter::CountEvent;
    fn name(&self) -> &str {
        "expiring-counter"
    }
    fn states(&self) -> Vec<StateDescriptor> {
        KeyedCounter.states()
    }
    fn sinks(&self) -> Vec<keyway::operator::SinkDescriptor> {
        KeyedCounter.sinks()
    }
    fn decode(&self, record: &keyway::domain::SourceRecord) -> Result<Self::Input, InvalidInput> {
        KeyedCounter.decode(record)
    }
    fn key(&self, input: &Self::Input) -> String {
        input.key.clone()
    }
    fn process(&self, ctx: &mut Ctx<'_>, input: Self::Input) -> Result<(), ProcessError> {
        KeyedCounter.process(ctx, input)
    }
    fn state_ttl(&self) -> Option<Duration> {
        Some(Duration::from_secs(3600))
    }
}

#[tokio::test]
async fn state_past_its_ttl_is_never_read_even_before_dynamodb_deletes_it() {
    let world = World::new(&[COUNTS.name]);
    let executor = world.executor(ExpiringCounter);
    let mut shard = Shard::new("in", 0);
    executor
        .run(decode_event(&shard.batch(&[count("a", 5)]).to_string()).unwrap())
        .await;
    world.clock.advance(3_599_000);
    executor
        .run(decode_event(&shard.batch(&[count("a", 1)]).to_string()).unwrap())
        .await;
    assert_eq!(
        stored_count(&world, &executor, "a").await,
        Some(6),
        "within the TTL the state is there, and the TTL moves"
    );
    world.clock.advance(3_601_000);
    assert_eq!(
        world.state_items(),
        1,
        "DynamoDB has not deleted the item yet"
    );
    executor
        .run(decode_event(&shard.batch(&[count("a", 1)]).to_string()).unwrap())
        .await;
    assert_eq!(
        stored_count(&world, &executor, "a").await,
        Some(1),
        "expired state counts as absent"
    );
}

#[tokio::test]
async fn an_outbox_that_could_not_be_sent_is_sent_again_by_the_redelivery_with_the_same_ids() {
    let world = World::new(&[]);
    let queue = world.sqs.create_queue("resolved");
    let flaky = Arc::new(FlakySink::new(Arc::new(SqsSink::new(
        world.sqs.clone(),
        &queue,
    ))));
    let sinks = Sinks::new(Arc::new(SqsSink::new(
        world.sqs.clone(),
        &world.dead_letter_url,
    )))
    .with(&RESOLVED, flaky.clone());
    let executor = Executor::new(Waker, world.store.clone(), sinks, world.clock.clone()).unwrap();
    let mut shard = Shard::new("mixed", 0);
    let event = shard.batch(&[
        ("k", br#"{"key":"k","event":"e1"}"#.to_vec()),
        ("k", br#"{"key":"k","actor":"alice"}"#.to_vec()),
        ("k", br#"{"key":"k","event":"e2"}"#.to_vec()),
    ]);
    flaky.set_down(true);
    let report = executor
        .run(decode_event(&event.to_string()).unwrap())
        .await;
    assert_eq!(report.commits, 1, "the state and its outbox are committed");
    assert!(
        report.failed_from.is_some(),
        "but the batch is not done until the outbox is sent"
    );

    flaky.set_down(false);
    let reports = run_to_completion(
        &executor,
        &redelivery(&event, report.failed_from.as_ref().unwrap()),
        2,
    )
    .await;
    assert_eq!(
        reports[0].replayed, 3,
        "the redelivery applies nothing again"
    );
    let sent: Vec<Resolved> = world
        .sqs
        .messages(&queue)
        .iter()
        .map(|m| serde_json::from_str(&m.body).unwrap())
        .collect();
    assert_eq!(
        sent,
        [
            Resolved {
                event: "e1".into(),
                actor: "alice".into()
            },
            Resolved {
                event: "e2".into(),
                actor: "alice".into()
            }
        ]
    );
}

#[tokio::test]
async fn a_dynamodb_streams_batch_runs_through_the_same_executor() {
    use keyway::domain::{AttrValue, ChangeKind, Item};
    use keyway_local::mapping::events::{dynamodb_event, DynamoDbEventRecord};

    /// Counts changes per table.
    struct ChangeCounter;
    impl KeyedOperator for ChangeCounter {
        type Input = String;
        fn name(&self) -> &str {
            "change-counter"
        }
        fn states(&self) -> Vec<StateDescriptor> {
            KeyedCounter.states()
        }
        fn decode(&self, record: &keyway::domain::SourceRecord) -> Result<String, InvalidInput> {
            match &record.payload {
                Payload::Change(change) => Ok(change.table.clone().unwrap_or_default()),
                _ => Err(InvalidInput::new("record", "expected a DynamoDB change")),
            }
        }
        fn key(&self, table: &String) -> String {
            table.clone()
        }
        fn process(&self, ctx: &mut Ctx<'_>, _: String) -> Result<(), ProcessError> {
            let mut count = ctx.value(&keyed_counter::COUNT)?;
            let next = count.get().copied().unwrap_or(0) + 1;
            count.set(next);
            Ok(())
        }
    }

    let world = World::new(&[]);
    let executor = world.executor(ChangeCounter);
    let keys: Vec<Item> = (0..3)
        .map(|i| Item::from([("id".to_owned(), AttrValue::S(format!("item-{i}")))]))
        .collect();
    let event = dynamodb_event(
        "arn:aws:dynamodb:us-east-1:123456789012:table/orders/stream/2026-01-01T00:00:00.000",
        keys.iter().enumerate().map(|(i, k)| DynamoDbEventRecord {
            kind: ChangeKind::Insert,
            keys: k,
            view: keyway_local::StreamView::NewAndOldImages,
            old_image: None,
            new_image: Some(k),
            sequence_number: ["100", "200", "300"][i],
            created_secs: 1_767_225_600,
            ttl_deletion: false,
        }),
    );
    let report = keyway::lambda::run_dynamodb(&executor, &event.to_string(), None)
        .await
        .unwrap();
    assert!(report.batch_item_failures.is_empty());
    // Redelivered, the three changes are recognised per item and not counted again.
    keyway::lambda::run_dynamodb(&executor, &event.to_string(), None)
        .await
        .unwrap();
    assert_eq!(stored_count(&world, &executor, "orders").await, Some(3));
}

#[tokio::test]
async fn an_output_the_sink_refuses_for_good_is_dead_lettered_instead_of_blocking_its_key() {
    /// Emits a body larger than any SQS message.
    struct Oversized;
    const BIG: keyway::Sink<String> = keyway::Sink::new("big");
    impl KeyedOperator for Oversized {
        type Input = keyed_counter::CountEvent;
        fn name(&self) -> &str {
            "oversized"
        }
        fn states(&self) -> Vec<StateDescriptor> {
            KeyedCounter.states()
        }
        fn sinks(&self) -> Vec<keyway::operator::SinkDescriptor> {
            vec![COUNTS.descriptor(), BIG.descriptor()]
        }
        fn decode(
            &self,
            record: &keyway::domain::SourceRecord,
        ) -> Result<Self::Input, InvalidInput> {
            KeyedCounter.decode(record)
        }
        fn key(&self, input: &Self::Input) -> String {
            input.key.clone()
        }
        fn process(&self, ctx: &mut Ctx<'_>, input: Self::Input) -> Result<(), ProcessError> {
            KeyedCounter.process(ctx, input)?;
            // Bypasses Ctx's size check, as an outbox written under a larger limit would.
            ctx.emit_json(&BIG, "k", "x".repeat(1200 * 1024))
        }
    }

    let world = World::new(&[COUNTS.name]);
    let queue = world.sqs.create_queue("big");
    /// An SQS sink that claims a larger limit than SQS has.
    struct Lenient(SqsSink<keyway_local::LocalSqs>);
    #[async_trait::async_trait]
    impl keyway::ports::Sink for Lenient {
        async fn send(
            &self,
            messages: &[keyway::domain::Output],
            deadline: keyway::ports::Deadline,
        ) -> Vec<(usize, keyway::ports::SinkError)> {
            self.0.send(messages, deadline).await
        }
        fn max_message_bytes(&self) -> usize {
            2 * 1024 * 1024
        }
    }
    let sinks = world.sinks().with(
        &BIG,
        Arc::new(Lenient(SqsSink::new(world.sqs.clone(), &queue))),
    );
    let executor =
        Executor::new(Oversized, world.store.clone(), sinks, world.clock.clone()).unwrap();
    let mut shard = Shard::new("in", 0);
    let report = executor
        .run(decode_event(&shard.batch(&[count("k", 1), count("k", 1)]).to_string()).unwrap())
        .await;
    assert_eq!(report.failed_from, None, "the key is not blocked");
    assert_eq!(stored_count(&world, &executor, "k").await, Some(2));
    let letters = world.dead_letters();
    assert_eq!(letters.len(), 2);
    assert_eq!(letters[0].field, "output.big");
    assert!(
        letters[0].problem.contains("at most"),
        "{}",
        letters[0].problem
    );
    assert!(
        letters[0].payload_truncated,
        "a 1.2 MB output is cut to fit the dead-letter queue"
    );
}

/// Why an executor of `operator` on every sink of `world` does not start.
fn refused<O: KeyedOperator>(
    operator: O,
    inputs: keyway::Inputs,
    world: &World,
) -> keyway::WiringError {
    Executor::with_inputs(
        operator,
        inputs,
        world.store.clone(),
        world.sinks(),
        world.clock.clone(),
    )
    .err()
    .expect("refused")
}

#[test]
fn an_operator_whose_declared_sinks_are_not_the_wired_ones_does_not_start() {
    use keyway::operator::SinkWiringError;
    use keyway::WiringError;
    let refusal = |world: World| refused(KeyedCounter, keyway::Inputs::new(), &world);
    assert_eq!(
        refusal(World::new(&[])),
        WiringError::Sinks(SinkWiringError::Unwired {
            operator: "keyed-counter".into(),
            sink: "counts".into()
        })
    );
    assert_eq!(
        refusal(World::new(&[COUNTS.name, "alerts"])),
        WiringError::Sinks(SinkWiringError::Undeclared {
            operator: "keyed-counter".into(),
            sink: "alerts".into()
        })
    );
}

/// Two inputs of the same shape, told apart only by their streams: names set a key's name,
/// greetings are emitted with it.
// Its items are `pub` as in an operator's own crate: the operator guide quotes them.
#[allow(unreachable_pub)]
mod two_inputs {
    use keyway::domain::SourceRecord;
    use keyway::operator::{InputDescriptor, SinkDescriptor};
    use keyway::{Input, Inputs, ValueState};
    use serde::{Deserialize, Serialize};

    use super::*;

    #[derive(Debug, Deserialize)]
    pub struct Said {
        pub key: String,
        pub text: String,
    }

    pub enum Heard {
        Name(Said),
        Greeting(Said),
    }

    pub const NAMES: Input<Said> = Input::json("names");
    pub const GREETINGS: Input<Said> = Input::json("greetings");
    const NAME: ValueState<String> = ValueState::new("name");
    pub const GREETED: keyway::Sink<String> = keyway::Sink::new("greeted");

    pub struct Greeter;

    impl KeyedOperator for Greeter {
        type Input = Heard;
        fn name(&self) -> &str {
            "greeter"
        }
        fn states(&self) -> Vec<StateDescriptor> {
            vec![NAME.descriptor()]
        }
        fn inputs(&self) -> Vec<InputDescriptor> {
            vec![NAMES.descriptor(), GREETINGS.descriptor()]
        }
        fn sinks(&self) -> Vec<SinkDescriptor> {
            vec![GREETED.descriptor()]
        }
        fn decode(&self, record: &SourceRecord) -> Result<Heard, InvalidInput> {
            record
                .route()
                .input(&NAMES, Heard::Name)
                .input(&GREETINGS, Heard::Greeting)
                .done()
        }
        fn key(&self, input: &Heard) -> String {
            match input {
                Heard::Name(said) | Heard::Greeting(said) => said.key.clone(),
            }
        }
        fn process(&self, ctx: &mut Ctx<'_>, input: Heard) -> Result<(), ProcessError> {
            match input {
                Heard::Name(said) => ctx.value(&NAME)?.set(said.text),
                Heard::Greeting(said) => {
                    let name = ctx.value(&NAME)?.get().cloned().unwrap_or_default();
                    ctx.emit(&GREETED, said.key, &format!("{}, {name}", said.text))?;
                }
            }
            Ok(())
        }
    }

    #[derive(Serialize)]
    struct Line<'a> {
        key: &'a str,
        text: &'a str,
    }

    pub fn said(key: &'static str, text: &str) -> (&'static str, Vec<u8>) {
        (key, serde_json::to_vec(&Line { key, text }).unwrap())
    }

    pub fn inputs() -> Inputs {
        Inputs::new()
            .with(&NAMES, "names-stream")
            .with(&GREETINGS, "greetings-stream")
    }
}

#[tokio::test]
async fn an_operator_of_two_inputs_gets_each_record_as_the_input_its_stream_is_wired_to() {
    use two_inputs::{inputs, said, Greeter, GREETED};
    let world = World::new(&[GREETED.name]);
    let sinks = world.sinks();
    let executor = Executor::with_inputs(
        Greeter,
        inputs(),
        world.store.clone(),
        sinks,
        world.clock.clone(),
    )
    .unwrap();
    let mut names = Shard::new("names-stream", 0);
    let mut greetings = Shard::new("greetings-stream", 0);
    let mut elsewhere = Shard::new("elsewhere", 0);
    let run = |event: serde_json::Value| executor.run(decode_event(&event.to_string()).unwrap());
    assert_eq!(run(names.batch(&[said("k", "Ada")])).await.applied, 1);
    let report = run(greetings.batch(&[said("k", "hello"), said("k", "bye")])).await;
    assert_eq!((report.applied, report.failed_from), (2, None));
    let greeted: Vec<String> = world
        .outputs(GREETED.name)
        .iter()
        .map(|m| serde_json::from_str(&m.body).unwrap())
        .collect();
    assert_eq!(greeted, ["hello, Ada", "bye, Ada"]);
    // A stream no input reads: dead-lettered with why, and the batch goes on.
    let report = run(elsewhere.batch(&[said("k", "Bob")])).await;
    assert_eq!((report.dead_lettered, report.failed_from), (1, None));
    let letters = world.dead_letters();
    assert_eq!(letters[0].field, "eventSourceARN");
    assert!(letters[0].problem.contains("\"elsewhere\""), "{letters:?}");
}

#[test]
fn an_operator_of_two_inputs_does_not_start_without_a_stream_for_each() {
    use keyway::operator::InputWiringError;
    use keyway::{Inputs, WiringError};
    use two_inputs::{Greeter, GREETED, NAMES};
    let world = World::new(&[GREETED.name]);
    let refusal = |inputs: Inputs| refused(Greeter, inputs, &world);
    assert_eq!(
        refusal(Inputs::new()),
        WiringError::Inputs(InputWiringError::Unwired {
            operator: "greeter".into(),
            input: "greetings".into()
        })
    );
    assert!(matches!(
        refusal(Inputs::new().with(&NAMES, "names-stream")),
        WiringError::Inputs(InputWiringError::Unwired { .. })
    ));
}

/// Templates often hand a function its streams' ARNs (`!GetAtt Stream.Arn`), not their names: an
/// input wired by ARN reads the same records as one wired by name.
#[tokio::test]
async fn an_input_wired_by_its_streams_arn_gets_that_streams_records() {
    use keyway::Inputs;
    use two_inputs::{said, Greeter, GREETED, GREETINGS, NAMES};
    let world = World::new(&[GREETED.name]);
    let inputs = Inputs::new()
        .with(
            &NAMES,
            "arn:aws:kinesis:us-east-1:123456789012:stream/names-stream",
        )
        .with(
            &GREETINGS,
            "arn:aws:dynamodb:us-east-1:123456789012:table/greetings-stream/stream/2026-01-01T00:00:00.000",
        );
    let executor = Executor::with_inputs(
        Greeter,
        inputs,
        world.store.clone(),
        world.sinks(),
        world.clock.clone(),
    )
    .unwrap();
    let mut names = Shard::new("names-stream", 0);
    let report = executor
        .run(decode_event(&names.batch(&[said("k", "Ada")]).to_string()).unwrap())
        .await;
    assert_eq!((report.applied, report.dead_lettered), (1, 0));
}

/// The shape of dynamic filtering: rules on one stream are broadcast state, written by records
/// keyed to `BROADCAST_KEY`; messages on another are keyed by user and read the rules.
// Its items are `pub` as in an operator's own crate: the operator guide quotes them.
#[allow(unreachable_pub)]
mod broadcast {
    use std::cell::Cell;
    use std::collections::BTreeSet;

    use keyway::domain::SourceRecord;
    use keyway::operator::{BroadcastState, InputDescriptor, SinkDescriptor, BROADCAST_KEY};
    use keyway::{Input, Inputs};
    use serde::{Deserialize, Deserializer, Serialize};

    use super::two_inputs::Said;
    use super::*;

    thread_local! {
        /// How often a `Words` was decoded on this test's thread.
        pub static DECODES: Cell<usize> = const { Cell::new(0) };
    }

    pub fn decodes() -> usize {
        DECODES.with(Cell::get)
    }

    #[derive(Default, Serialize)]
    pub struct Words(BTreeSet<String>);

    impl<'de> Deserialize<'de> for Words {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            DECODES.with(|d| d.set(d.get() + 1));
            BTreeSet::deserialize(d).map(Words)
        }
    }

    pub enum Heard {
        Rule(Said),
        Message(Said),
    }

    pub const RULES: Input<Said> = Input::json("rules");
    pub const MESSAGES: Input<Said> = Input::json("messages");
    pub const BLOCKED: BroadcastState<Words> = BroadcastState::new("blocked");
    pub const PASSED: keyway::Sink<String> = keyway::Sink::new("passed");

    /// Passes on each message whose text no rule blocks; a message starting with `!` tries to
    /// block its text itself, which only rules may.
    pub struct Moderator;

    impl KeyedOperator for Moderator {
        type Input = Heard;
        fn name(&self) -> &str {
            "moderator"
        }
        fn states(&self) -> Vec<StateDescriptor> {
            vec![BLOCKED.descriptor()]
        }
        fn inputs(&self) -> Vec<InputDescriptor> {
            vec![RULES.descriptor(), MESSAGES.descriptor()]
        }
        fn sinks(&self) -> Vec<SinkDescriptor> {
            vec![PASSED.descriptor()]
        }
        fn decode(&self, record: &SourceRecord) -> Result<Heard, InvalidInput> {
            record
                .route()
                .input(&RULES, Heard::Rule)
                .input(&MESSAGES, Heard::Message)
                .done()
        }
        fn key(&self, input: &Heard) -> String {
            match input {
                Heard::Rule(_) => BROADCAST_KEY.to_owned(),
                Heard::Message(said) => said.key.clone(),
            }
        }
        fn process(&self, ctx: &mut Ctx<'_>, input: Heard) -> Result<(), ProcessError> {
            match input {
                Heard::Message(said) if said.text.starts_with('!') => {
                    ctx.broadcast_mut(&BLOCKED)?.set(Words::default());
                }
                Heard::Rule(said) => {
                    let mut blocked = ctx.broadcast_mut(&BLOCKED)?;
                    blocked
                        .get_or_insert_with(Words::default)
                        .0
                        .insert(said.text);
                }
                Heard::Message(said) => {
                    let blocked = ctx.broadcast(&BLOCKED)?;
                    if !blocked.is_some_and(|b| b.0.contains(&said.text)) {
                        ctx.emit(&PASSED, said.key, &said.text)?;
                    }
                }
            }
            Ok(())
        }
    }

    pub fn inputs() -> Inputs {
        Inputs::new()
            .with(&RULES, "rules-stream")
            .with(&MESSAGES, "messages-stream")
    }
}

#[tokio::test]
async fn broadcast_state_written_by_its_input_is_read_by_every_key_and_decoded_once_a_version() {
    use broadcast::{decodes, inputs, Moderator, PASSED};
    use two_inputs::said;
    let world = World::new(&[PASSED.name]);
    let executor = Executor::with_inputs(
        Moderator,
        inputs(),
        world.store.clone(),
        world.sinks(),
        world.clock.clone(),
    )
    .unwrap();
    let mut rules = Shard::new("rules-stream", 0);
    let mut messages = Shard::new("messages-stream", 0);
    let run = |event: serde_json::Value| executor.run(decode_event(&event.to_string()).unwrap());
    let passed = || -> Vec<String> {
        world
            .outputs(PASSED.name)
            .iter()
            .map(|m| serde_json::from_str(&m.body).unwrap())
            .collect()
    };
    let report = run(messages.batch(&[said("ann", "spam"), said("bob", "hi")])).await;
    assert_eq!((report.applied, report.failed_from), (2, None));
    assert_eq!(passed(), ["spam", "hi"], "no rule yet");

    let first_rules = rules.batch(&[said("r", "spam"), said("r", "junk")]);
    assert_eq!(run(first_rules.clone()).await.applied, 2);
    let before = decodes();
    run(messages.batch(&[said("ann", "spam"), said("bob", "junk")])).await;
    run(messages.batch(&[said("cy", "spam"), said("ann", "hello")])).await;
    assert_eq!(
        passed(),
        ["spam", "hi", "hello"],
        "every key reads the rules"
    );
    assert_eq!(
        decodes() - before,
        1,
        "one version, decoded once for both batches"
    );

    // A redelivered rule batch is applied once: the version does not move.
    let again = run(first_rules).await;
    assert_eq!((again.applied, again.replayed), (0, 2));
    run(messages.batch(&[said("bob", "junk")])).await;
    assert_eq!(decodes() - before, 1);

    run(rules.batch(&[said("r", "hello")])).await;
    run(messages.batch(&[said("ann", "hello"), said("bob", "ok")])).await;
    assert_eq!(
        passed(),
        ["spam", "hi", "hello", "ok"],
        "a new rule reaches the next batch"
    );
}

#[tokio::test]
async fn a_keyed_record_that_writes_broadcast_state_is_dead_lettered_naming_it_and_the_others_go_on(
) {
    use broadcast::{inputs, Moderator, PASSED};
    use two_inputs::said;
    let world = World::new(&[PASSED.name]);
    let executor = Executor::with_inputs(
        Moderator,
        inputs(),
        world.store.clone(),
        world.sinks(),
        world.clock.clone(),
    )
    .unwrap();
    let mut messages = Shard::new("messages-stream", 0);
    let batch = decode_event(
        &messages
            .batch(&[said("ann", "!mine"), said("bob", "hi")])
            .to_string(),
    )
    .unwrap();
    let report = executor.run(batch).await;
    assert_eq!(report.applied, 1, "bob's message goes on");
    // A programming error that no retry fixes: the record goes to the dead-letter sink, where
    // it waits for a fixed version, and holds neither its key nor the shard.
    assert_eq!((report.dead_lettered, report.failed_from), (1, None));
    let letter = &world.dead_letters()[0];
    assert!(letter.field.starts_with("state."), "{}", letter.field);
    assert!(
        letter
            .problem
            .contains("written only by records keyed to BROADCAST_KEY"),
        "{}",
        letter.problem
    );
}
