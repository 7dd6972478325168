//! Contract suites for the ports, run on the in-memory adapters in `cargo test` and on the AWS
//! adapters against the emulator in the project's test command. An implementation that passes
//! its suite can stand in for the other.
//!
//! Each suite is a list of promises (`TablePromise`, `StorePromise`, `SinkPromise`), one function
//! each. The `*_contract_tests!` macros generate one test per promise for an implementation, on
//! fresh resources, so that a broken promise is named by the test that fails; the `*_contract`
//! functions run a whole suite on one resource (to compare a faulty run with a clean one).

mod sink;
mod store;
mod table;

pub use sink::{keep_sink_promise, sink_contract, Received, SinkPromise, SinkUnderTest};
pub use store::{
    keep_store_promise, orphans, state_store_contract, LosingResponses, StorePromise,
    StoreUnderTest,
};
pub use table::{keep_table_promise, table_contract, TablePromise};

use keyway::adapters::dynamodb::{ItemKey, VERSION};
use keyway::domain::{AttrValue, Item, Origin, Output, OutputId, SequenceNumber};

/// Makes the stored head of a key unreadable, as a bad write or a hand edit leaves it: the head
/// whose partition key `pk_matches` gets a document that is not JSON. Panics when there is none.
pub fn corrupt_head(table: &crate::LocalTable, pk_matches: impl Fn(&str) -> bool) {
    let mut head = table
        .items()
        .into_iter()
        .find(|i| {
            i.get("pk")
                .and_then(AttrValue::as_s)
                .is_some_and(&pk_matches)
                && i.get("sk").and_then(AttrValue::as_s) == Some("head")
        })
        .expect("a stored head for the key");
    head.insert("doc".into(), AttrValue::S("{not json".into()));
    table.put_item(head).expect("the head written back");
}

fn item(pk: &str, sk: &str, version: u64, payload: &str) -> Item {
    let mut item = ItemKey {
        pk: pk.into(),
        sk: sk.into(),
    }
    .to_item();
    item.insert(VERSION.into(), AttrValue::N(version.to_string()));
    item.insert("payload".into(), AttrValue::S(payload.into()));
    item
}

fn key(pk: &str, sk: &str) -> ItemKey {
    ItemKey {
        pk: pk.into(),
        sk: sk.into(),
    }
}

fn seq(n: u64) -> SequenceNumber {
    SequenceNumber::parse(&n.to_string()).expect("digits")
}

/// A contract output: the `i`-th of a contract run, keyed to one of three keys.
fn output(i: usize, body: String) -> Output {
    Output {
        id: OutputId::derive(
            "contract",
            "contract",
            &Origin("contract/shardId-0".into()),
            &seq(1000 + i as u64),
            0,
        ),
        sink: "contract".into(),
        partition_key: format!("key-{}", i % 3),
        body,
        settled: false,
    }
}

/// One test per promise of the `Table` contract, each on the table the async expression `$fresh`
/// makes.
#[macro_export]
macro_rules! table_contract_tests {
    ($fresh:expr) => {
        $crate::__promise_tests!(keep_table_promise, TablePromise, $fresh;
            a_put_conditional_on_absence_or_a_version_writes_only_then => ConditionalPuts,
            an_update_keeps_other_attributes_and_is_conditional_like_a_put => Updates,
            a_put_that_raises_an_attribute_never_lowers_it => RaisingPuts,
            batch_calls_and_queries_see_every_item_once_in_sort_key_order => BatchesAndQueries,
            requests_over_the_limits_are_refused_as_not_retryable => Limits,
            a_partition_reads_as_an_ordered_log_after_a_sort_key_and_from_its_end => LogQueries,
            a_scan_finds_each_item_of_a_key_prefix_once_whatever_its_page_size => Scans,
        );
    };
}

/// One test per promise of the `StateStore` contract, each on the `StoreUnderTest` the async
/// expression `$fresh` makes.
#[macro_export]
macro_rules! state_store_contract_tests {
    ($fresh:expr) => {
        $crate::__promise_tests!(keep_store_promise, StorePromise, $fresh;
            a_commit_is_conditional_on_the_version_read_and_a_load_sees_it => Basics,
            lists_far_beyond_the_item_limit_store_in_segments => LargeLists,
            state_past_its_ttl_loads_empty_and_its_segments_outlive_it => Expiry,
            an_outbox_is_stored_with_the_state_and_cleared_without_trace => Outboxes,
            a_key_fed_by_many_lineages_finds_the_watermark_of_each => ManyLineages,
            a_head_put_whose_response_is_lost_counts_as_landed => LostResponses,
            a_commit_that_loses_the_race_deletes_the_segments_it_wrote => LostRaces,
            a_commit_that_dies_before_its_head_leaves_nothing_for_good => CrashesInsideACommit,
            timers_come_due_in_time_order_until_forgotten => TimerIndex,
            the_keys_with_state_under_a_prefix_list_once_each_page_after_page => KeyListing,
        );
    };
}

/// One test per promise of the `Sink` contract, each on the `SinkUnderTest` the async expression
/// `$fresh` makes.
#[macro_export]
macro_rules! sink_contract_tests {
    ($fresh:expr) => {
        $crate::__promise_tests!(keep_sink_promise, SinkPromise, $fresh;
            every_message_of_a_call_arrives_once_with_its_id => EveryMessageOnce,
            a_keys_messages_arrive_in_order_where_the_destination_keeps_order => KeyOrder,
            a_message_the_destination_refuses_fails_alone => RefusedMessageFailsAlone,
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __promise_tests {
    ($keep:ident, $promises:ident, $fresh:expr; $($test:ident => $promise:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $test() {
                let under = $fresh.await;
                $crate::testing::$keep($crate::testing::$promises::$promise, &under).await;
            }
        )*
    };
}
