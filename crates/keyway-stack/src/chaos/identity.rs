//! Identity enrichment under chaos: generated CloudTrail traffic of thirty customers (role chains
//! of up to six sessions across each customer's accounts, interleaved, one chain in twenty
//! missing its first AssumeRole), every thousandth record cut off mid-JSON, through the stack's
//! IdentityEnricherFunction and its feedback stream. The oracle traces each record's caller back
//! through the issuing calls of the trail itself: each record must come out once, resolved to
//! that actor and chain, or unresolved where the trail lacks a link, and under the output id and
//! body it has without faults.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use identity_enricher::cloudtrail::CloudTrailRecord;
use identity_enricher::identity::CustomerMap;
use identity_enricher::traffic::{Traffic, TrafficConfig};
use keyway_local::{FaultPlan, LocalError, LocalRuntime, Usage};
use serde_json::Value;

use super::{
    against_fault_free, against_oracle, deploy, sent, side_by_side, Ending, Report, Sent, Settings,
};

/// The template's buffer TTL: every record still waiting is out once it and the sweeps passed.
const BUFFER_TTL: Duration = Duration::from_secs(900);

/// What the enricher must make of a record: its original actor's ARN and its chain's keys, or
/// `None` where the trail lacks a link.
type Traced = Option<(String, Vec<String>)>;

/// The oracle: for each event id, its caller traced back through the trail's issuing calls.
fn oracle(records: &[Value]) -> BTreeMap<String, Traced> {
    let mut issuer: HashMap<&str, &Value> = HashMap::new();
    for r in records {
        if let Some(key) = r["responseElements"]["credentials"]["accessKeyId"].as_str() {
            issuer.insert(key, &r["userIdentity"]);
        }
    }
    let resolve = |caller: &Value| -> Traced {
        let mut chain = Vec::new();
        let mut caller = caller;
        while caller["type"] == "AssumedRole" {
            let key = caller["accessKeyId"].as_str()?;
            chain.push(key.to_owned());
            caller = issuer.get(key)?;
        }
        chain.reverse();
        Some((caller["arn"].as_str()?.to_owned(), chain))
    };
    records
        .iter()
        .filter_map(|r| {
            Some((
                r["eventID"].as_str()?.to_owned(),
                resolve(&r["userIdentity"]),
            ))
        })
        .collect()
}

/// What the enricher made of a record, in the oracle's terms.
fn traced(body: &Value) -> Traced {
    let e = &body["enrichment"];
    if e["status"] != "resolved" {
        return None;
    }
    let chain = e["roleChain"]
        .as_array()?
        .iter()
        .filter_map(|l| Some(l["accessKeyId"].as_str()?.to_owned()))
        .collect();
    Some((e["originalActor"]["arn"].as_str()?.to_owned(), chain))
}

/// The generated trail, and what goes on the stream.
struct Workload {
    records: Vec<Value>,
    /// (partition key, data): every record, and after every thousandth one a copy cut off
    /// mid-JSON.
    entries: Vec<(String, Vec<u8>)>,
    /// The customer map the stack is deployed with, as JSON.
    map: String,
}

fn workload(settings: &Settings) -> Result<Workload, LocalError> {
    let config = TrafficConfig {
        customers: 30,
        orphan_share: 0.05,
        seed: settings.seed,
        ..TrafficConfig::default()
    };
    let map = Traffic::customer_map_json(&config);
    let customers = CustomerMap::from_json(&map).map_err(crate::failed("the customer map"))?;
    let records: Vec<Value> = Traffic::new(config, settings.events)
        .map_err(crate::failed("the generated trail"))?
        .collect();
    let mut entries = Vec::with_capacity(records.len() + records.len() / 1000);
    for (i, r) in records.iter().enumerate() {
        let key = CloudTrailRecord::parse(r.clone())
            .map(|parsed| parsed.partition_key(&customers))
            .unwrap_or_default();
        let data = serde_json::to_vec(r).unwrap_or_default();
        if i % 1000 == 999 {
            entries.push((key.clone(), data[..data.len() / 2].to_vec()));
        }
        entries.push((key, data));
    }
    Ok(Workload {
        records,
        entries,
        map,
    })
}

/// One run: the enriched stream by output id, what else it left, and the minutes past the
/// buffer TTL and a minute the last record waited to go out.
async fn run_once(
    settings: &Settings,
    workload: &Workload,
    faults: FaultPlan,
) -> Result<(Sent, Ending, u64), LocalError> {
    let parameters = BTreeMap::from([
        ("CloudTrailShards".to_owned(), settings.shards.to_string()),
        ("FeedbackShards".to_owned(), settings.shards.to_string()),
        ("CustomerMap".to_owned(), workload.map.clone()),
    ]);
    let lanes = [("IdentityEnricherFunction", settings.lanes)];
    let mut runtime = deploy(&[], &lanes, &parameters, faults, settings)?;
    let stream = runtime.resource("CloudTrailStream").expect("the stream");
    runtime
        .services
        .kinesis
        .put_in_order(&stream, &workload.entries)
        .await
        .map_err(crate::failed("the CloudTrail stream"))?;
    runtime.run_until_idle(Duration::from_secs(3_600)).await?;
    // A record waiting for its caller's identity goes out on its key's timer, within the TTL
    // and a minute of the sweep. Under faults a sweep dies (a crash at each key's commit) and
    // leaves the rest of its timers to the next: the run goes on a minute at a time until every
    // record is out, for at most two hours, and says how long past the TTL and a minute it took.
    runtime.run_for(BUFFER_TTL + Duration::from_secs(60)).await;
    let mut late = 0;
    let mut sent = enriched(&runtime);
    while sent.len() < workload.records.len() && late < 120 {
        runtime.run_for(Duration::from_secs(60)).await;
        late += 1;
        sent = enriched(&runtime);
    }
    Ok((sent, Ending::of(&runtime), late))
}

/// The enriched stream's records by output id.
fn enriched(runtime: &LocalRuntime) -> Sent {
    let stream = runtime.resource("EnrichedStream").expect("the stream");
    sent(runtime.services.kinesis.records(&stream).iter().map(|r| {
        let body: Value = serde_json::from_slice(&r.data).unwrap_or_default();
        let id = body["enrichment"]["outputId"].as_str().unwrap_or_default();
        (id.to_owned(), String::from_utf8_lossy(&r.data).into_owned())
    }))
}

/// What the functions of the fault-free run were billed for.
pub(super) async fn usage(settings: &Settings) -> Result<Usage, LocalError> {
    let workload = workload(settings)?;
    let (_, ending, _) = run_once(settings, &workload, FaultPlan::default()).await?;
    Ok(ending.usage)
}

pub(super) fn run(settings: &Settings) -> Result<Report, LocalError> {
    let workload = workload(settings)?;
    let ((clean, _, _), (faulty, ending, late)) = side_by_side(
        || run_once(settings, &workload, FaultPlan::default()),
        || run_once(settings, &workload, settings.faults()),
    )?;
    let mut report = Report {
        unit: "records enriched",
        bad_records: (workload.entries.len() - workload.records.len()) as u64,
        ..Report::default()
    };
    // Each record once, under one output id: a record sent under two is applied twice.
    let mut got: BTreeMap<String, (Traced, usize)> = BTreeMap::new();
    for bodies in faulty.values() {
        let Ok(body) = serde_json::from_str::<Value>(&bodies[0]) else {
            continue;
        };
        let id = body["eventID"].as_str().unwrap_or_default().to_owned();
        got.entry(id).or_insert((traced(&body), 0)).1 += 1;
    }
    let want: BTreeMap<String, (Traced, usize)> = oracle(&workload.records)
        .into_iter()
        .map(|(id, traced)| (id, (traced, 1)))
        .collect();
    against_oracle(&mut report, &got, &want, |got, want| got.1 > want.1);
    against_fault_free(&mut report, &faulty, &clean);
    report.take_ending(&ending);
    report.notes.push(format!(
        "every waiting record out within the buffer TTL, a minute and {late} minutes more"
    ));
    Ok(report)
}
