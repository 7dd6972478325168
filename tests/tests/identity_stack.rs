//! The identity enricher as template.yaml wires it, on the embedded runtime: its events stream,
//! its feedback stream looped back through Kinesis, the enriched stream and the timer sweep on
//! the template's schedule. The article's chain put in reverse order comes out enriched, also
//! with records ten and a hundred times the usual size; a record whose resolution never comes
//! goes out unresolved within the buffer TTL and a minute with no further record; generated
//! chains of many customers, shuffled, on 1 to 16 shards (one with ten lanes a shard), match an
//! oracle written here. (The run under every fault is `keyway_stack::chaos`'s, in chaos.rs.)

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use identity_enricher::cloudtrail::CloudTrailRecord;
use identity_enricher::enricher::reason;
use identity_enricher::identity::CustomerMap;
use identity_enricher::traffic::{Traffic, TrafficConfig};
use keyway_local::{FaultPlan, LocalRuntime, LocalServices};
use keyway_tests::trails::{article, record, session, ACCOUNT};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde_json::Value;

/// Millions of small allocations, served with mimalloc as the `keyway` command serves them.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// 2026-01-01, when the generated traffic starts.
const EPOCH: i64 = 1_767_225_600_000;
/// The template's default buffer TTL.
const BUFFER_TTL: Duration = Duration::from_secs(900);

/// How the stack is deployed: the template's defaults, or another number of shards (for the
/// CloudTrail and the feedback stream) and a customer map, given as the template's parameters.
#[derive(Default)]
struct Deploy {
    shards: Option<usize>,
    customer_map: Option<String>,
    /// The enricher's mappings' ParallelizationFactor, instead of the template's 2.
    lanes: Option<u32>,
}

impl Deploy {
    fn stack(&self, faults: FaultPlan) -> LocalRuntime {
        let mut parameters = BTreeMap::new();
        if let Some(shards) = self.shards {
            parameters.insert("CloudTrailShards".to_owned(), shards.to_string());
            parameters.insert("FeedbackShards".to_owned(), shards.to_string());
        }
        if let Some(map) = &self.customer_map {
            parameters.insert("CustomerMap".to_owned(), map.clone());
        }
        let mut template =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../template.yaml"))
                .expect("template.yaml");
        if let Some(lanes) = self.lanes {
            let at = template
                .find("  IdentityEnricherFunction:")
                .expect("the enricher");
            let (head, rest) = template.split_at(at);
            // The enricher's resource runs to the next resource of the template.
            let end = rest
                .match_indices("\n  ")
                .map(|(i, _)| i)
                .find(|&i| rest[i + 3..].starts_with(|c: char| c.is_ascii_uppercase()))
                .unwrap_or(rest.len());
            let (enricher, tail) = rest.split_at(end);
            let factor = "ParallelizationFactor: 2\n";
            assert_eq!(enricher.matches(factor).count(), 2, "both its mappings");
            let lanes = format!("ParallelizationFactor: {lanes}\n");
            template = format!("{head}{}{tail}", enricher.replace(factor, &lanes));
        }
        let services = LocalServices::new(EPOCH, faults);
        let functions = keyway_stack::functions();
        LocalRuntime::from_template_with(&template, &parameters, services, &functions)
            .expect("the template runs")
    }
}

/// Puts `records` on the CloudTrail stream in this order, each under the partition key a
/// producer computes for it.
async fn put(runtime: &LocalRuntime, records: &[Value], customers: &CustomerMap) {
    let stream = runtime.resource("CloudTrailStream").unwrap();
    let entries: Vec<(String, Vec<u8>)> = records
        .iter()
        .map(|r| {
            let key = CloudTrailRecord::parse(r.clone())
                .unwrap()
                .partition_key(customers);
            (key, serde_json::to_vec(r).unwrap())
        })
        .collect();
    runtime
        .services
        .kinesis
        .put_in_order(&stream, &entries)
        .await
        .unwrap();
}

/// The enriched stream's records, by output id: every body sent under each id.
fn enriched(runtime: &LocalRuntime) -> HashMap<String, Vec<Value>> {
    let stream = runtime.resource("EnrichedStream").unwrap();
    let mut by_id: HashMap<String, Vec<Value>> = HashMap::new();
    for r in runtime.services.kinesis.records(&stream) {
        let body: Value = serde_json::from_slice(&r.data).unwrap();
        let id = body["enrichment"]["outputId"].as_str().unwrap().to_owned();
        by_id.entry(id).or_default().push(body);
    }
    by_id
}

/// One body per event id, checking that every id came with one body only.
fn by_event(outputs: &HashMap<String, Vec<Value>>) -> BTreeMap<String, Value> {
    outputs
        .values()
        .map(|bodies| {
            assert!(bodies.iter().all(|b| b == &bodies[0]), "one body an id");
            let body = bodies[0].clone();
            (body["eventID"].as_str().unwrap().to_owned(), body)
        })
        .collect()
}

fn dead_letters(runtime: &LocalRuntime) -> usize {
    let queue = runtime.resource("DeadLetterQueue").unwrap();
    runtime.services.sqs.messages(&queue).len()
}

/// Puts the article's `records` on the stack in reverse order and runs it until idle: each comes
/// out once, resolved, traced to Alice, none dead-lettered. Returns them by event id.
async fn traced_in_reverse(mut records: Vec<Value>) -> BTreeMap<String, Value> {
    let mut runtime = Deploy::default().stack(FaultPlan::default());
    records.reverse();
    put(&runtime, &records, &CustomerMap::default()).await;
    runtime
        .run_until_idle(Duration::from_secs(600))
        .await
        .unwrap();
    let out = by_event(&enriched(&runtime));
    assert_eq!(out.len(), 4, "{:?}", out.keys().collect::<Vec<_>>());
    let alice = format!("arn:aws:iam::{ACCOUNT}:user/alice");
    for (id, body) in &out {
        assert_eq!(body["enrichment"]["status"], "resolved", "{id}");
        assert_eq!(body["enrichment"]["originalActor"]["arn"], alice, "{id}");
    }
    assert_eq!(dead_letters(&runtime), 0);
    out
}

#[tokio::test(start_paused = true)]
async fn the_articles_chain_put_in_reverse_order_comes_out_traced_to_alice() {
    let out = traced_in_reverse(article()).await;
    let chain: Vec<&str> = out["4-snapshot-with-asia2"]["enrichment"]["roleChain"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["accessKeyId"].as_str().unwrap())
        .collect();
    assert_eq!(chain, ["ASIA1", "ASIA2"]);
}

#[tokio::test(start_paused = true)]
async fn a_record_whose_resolution_never_comes_goes_out_unresolved_within_the_ttl_and_a_minute() {
    let mut runtime = Deploy::default().stack(FaultPlan::default());
    let orphan = record("orphan", session("ASIA9", "role-9"), "ListBuckets", None);
    put(&runtime, &[orphan], &CustomerMap::default()).await;
    runtime.run_for(BUFFER_TTL - Duration::from_secs(1)).await;
    assert!(enriched(&runtime).is_empty(), "it waits out the TTL");
    // The record started waiting a batching window (1 s) after the start: its deadline is the
    // TTL, a minute and that second later.
    runtime.run_for(Duration::from_secs(62)).await;
    let out = by_event(&enriched(&runtime));
    assert_eq!(out.len(), 1, "out within the TTL and a minute: {out:#?}");
    assert_eq!(out["orphan"]["enrichment"]["status"], "unresolved");
    assert_eq!(out["orphan"]["enrichment"]["reason"], reason::BUFFER_TTL);
    let (name, sweeps) = &runtime.schedules()[0];
    assert_eq!(name, "IdentityEnricherFunction/SweepTimers");
    assert!(sweeps.invocations >= 16 && sweeps.errors == 0, "{sweeps:?}");
}

/// What the enricher must make of `records`, worked out from the records alone: for each event
/// id, the original actor's ARN and the chain's keys, or `None` for a record that cannot
/// resolve (a key whose issuing call is not in the trail, or issued by such a key).
fn oracle(records: &[Value]) -> BTreeMap<String, Option<(String, Vec<String>)>> {
    // Issued key -> the key (or user) that issued it.
    let mut issuer: HashMap<&str, &Value> = HashMap::new();
    for r in records {
        if let Some(key) = r["responseElements"]["credentials"]["accessKeyId"].as_str() {
            issuer.insert(key, &r["userIdentity"]);
        }
    }
    let resolve = |caller: &Value| -> Option<(String, Vec<String>)> {
        let mut chain = Vec::new();
        let mut caller = caller;
        while caller["type"] == "AssumedRole" {
            let key = caller["accessKeyId"].as_str().unwrap();
            chain.push(key.to_owned());
            caller = issuer.get(key)?;
        }
        chain.reverse();
        Some((caller["arn"].as_str().unwrap().to_owned(), chain))
    };
    records
        .iter()
        .map(|r| {
            let id = r["eventID"].as_str().unwrap().to_owned();
            (id, resolve(&r["userIdentity"]))
        })
        .collect()
}

/// Runs `records` through the stack until every record is out, its last timers swept. Under
/// faults a sweep can fail and leave its timers to the next one: ten minutes of sweeps more.
async fn enrich(
    records: &[Value],
    deploy: &Deploy,
    faults: FaultPlan,
) -> (HashMap<String, Vec<Value>>, LocalRuntime) {
    let mut runtime = deploy.stack(faults);
    let customers = deploy
        .customer_map
        .as_deref()
        .map(|m| CustomerMap::from_json(m).unwrap())
        .unwrap_or_default();
    put(&runtime, records, &customers).await;
    runtime
        .run_until_idle(Duration::from_secs(3_600))
        .await
        .unwrap();
    runtime.run_for(BUFFER_TTL + Duration::from_secs(600)).await;
    (enriched(&runtime), runtime)
}

/// Generated traffic of thirty customers, and the customer map to deploy with.
fn traffic(records: usize, seed: u64) -> (Vec<Value>, String) {
    let config = TrafficConfig {
        customers: 30,
        orphan_share: 0.05,
        seed,
        ..TrafficConfig::default()
    };
    let map = Traffic::customer_map_json(&config);
    (Traffic::new(config, records).unwrap().collect(), map)
}

#[tokio::test(start_paused = true)]
async fn generated_chains_shuffled_on_one_to_sixteen_shards_and_ten_lanes_resolve_as_the_oracle_says(
) {
    // Ten lanes a shard: many invocations at once on the keys of one shard.
    for (shards, lanes, seed) in [(1, 2, 11), (3, 10, 12), (16, 2, 13)] {
        let (mut records, customer_map) = traffic(3_000, seed);
        records.shuffle(&mut StdRng::seed_from_u64(seed));
        let deploy = Deploy {
            shards: Some(shards),
            customer_map: Some(customer_map),
            lanes: Some(lanes),
        };
        let (outputs, _) = enrich(&records, &deploy, FaultPlan::default()).await;
        let out = by_event(&outputs);
        let expected = oracle(&records);
        assert_eq!(
            out.len(),
            records.len(),
            "{shards} shards: every record once"
        );
        let mut unresolved = 0;
        for (id, want) in &expected {
            let e = &out[id]["enrichment"];
            match want {
                Some((actor, chain)) => {
                    assert_eq!(e["status"], "resolved", "{shards} shards, {id}: {e}");
                    assert_eq!(e["originalActor"]["arn"], actor.as_str(), "{id}");
                    let got: Vec<&str> = e["roleChain"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|l| l["accessKeyId"].as_str().unwrap())
                        .collect();
                    assert_eq!(got, *chain, "{shards} shards, {id}");
                }
                None => {
                    unresolved += 1;
                    assert_eq!(e["status"], "unresolved", "{shards} shards, {id}: {e}");
                    assert_eq!(e["reason"], reason::BUFFER_TTL, "{id}");
                }
            }
        }
        assert!(unresolved > 0, "the orphan chains were generated");
    }
}

#[tokio::test(start_paused = true)]
async fn records_ten_and_a_hundred_times_the_usual_size_wait_and_come_out_enriched() {
    let mut records = article();
    // CloudTrail records are a kilobyte or two; a call with large request parameters (a policy
    // document, a batch of tags) makes one far larger. Both wait for their key's resolution.
    for (id, size) in [
        ("2-action-with-asia1", 20_000),
        ("4-snapshot-with-asia2", 200_000),
    ] {
        let record = records.iter_mut().find(|r| r["eventID"] == id).unwrap();
        record["requestParameters"] = serde_json::json!({ "policy": "x".repeat(size) });
    }
    let out = traced_in_reverse(records).await;
    assert_eq!(
        out["4-snapshot-with-asia2"]["requestParameters"]["policy"]
            .as_str()
            .map(str::len),
        Some(200_000)
    );
}
