//! The adaptive hot-key registry: keyed functions report each batch's heavy keys (`HeatReport`),
//! a `HotSet` with hysteresis decides period after period which keys of the whole stream are hot,
//! and producers read the list (`AdaptivePartitioner`) to salt exactly those keys. An emerging hot
//! key is salted without a deploy, and a key that cooled goes back to its own partition key.
//!
//! # Items (on a table with key `pk` (S), `sk` (S))
//!
//! | item             | pk                            | sk                          | attributes |
//! |------------------|-------------------------------|-----------------------------|------------|
//! | a batch's report | `<scope>#heat#<period start>` | `<shard>/<first sequence>`  | `records` N, `keys` M (key to records), `ttl` |
//! | the hot list     | `<scope>#hot`                 | `hot`                       | `keys` M (key to cool periods in a row), `through` N (the last period decided), `v` |
//!
//! A report counts in the period of the time it is made. A retried batch reports under the same
//! sort key, so its report replaces the first instead of adding to it. The first report made
//! after a period ends decides that period, adding up the period's reports. It also decides any
//! periods missed since the last decision, up to as many as it takes every key to cool. The hot
//! list is written on the condition of its version: when several functions decide at once, one
//! wins and the others read its list. A report made in a period already decided (a batch that ran
//! across a period's end) is not counted. That costs the heuristic one batch, never a record: the
//! results of a salted key equal those of an unsalted one.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tracing::warn;

use super::{Expect, ItemKey, Table, PK, SK, TTL, VERSION};
use crate::domain::salt::{self, Partitioner, Salting};
use crate::domain::skew::{HeatReport, Heavy, HotSet, Hysteresis};
use crate::domain::{AttrValue, Item};
use crate::ports::{HotKeyReports, StoreError};

/// How long a batch's report is kept: long past the period it is decided in.
const REPORT_TTL_SECS: i64 = 24 * 3600;

/// The registry of one scope (the operator whose keys it judges) on a table.
#[derive(Clone)]
pub struct HotKeyRegistry {
    table: Arc<dyn Table>,
    scope: String,
    period_millis: i64,
    thresholds: Hysteresis,
    /// The last period this instance saw decided. Every batch of every shard reports: without
    /// this, each would read the hot list, one item, which would become a hot key of its own.
    /// With it, an instance reads the list once a period.
    seen_decided: Arc<AtomicI64>,
}

/// The hot list as stored.
#[derive(Debug, Default)]
struct Listing {
    cool_runs: BTreeMap<String, u32>,
    through: Option<i64>,
    version: Option<u64>,
}

impl HotKeyRegistry {
    /// The registry of `scope` on `table`, deciding once a `period` (at least a millisecond).
    pub fn new(
        table: Arc<dyn Table>,
        scope: impl Into<String>,
        period: Duration,
        thresholds: Hysteresis,
    ) -> Self {
        Self {
            table,
            scope: scope.into(),
            period_millis: (period.as_millis() as i64).max(1),
            thresholds,
            seen_decided: Arc::new(AtomicI64::new(i64::MIN)),
        }
    }

    /// The keys hot at present, in key order.
    pub async fn hot(&self) -> Result<BTreeSet<String>, StoreError> {
        Ok(self.listing().await?.cool_runs.into_keys().collect())
    }

    fn period_of(&self, millis: i64) -> i64 {
        millis.div_euclid(self.period_millis) * self.period_millis
    }

    fn list_key(&self) -> ItemKey {
        ItemKey {
            pk: format!("{}#hot", self.scope),
            sk: "hot".to_owned(),
        }
    }

    fn period_pk(&self, start: i64) -> String {
        format!("{}#heat#{start}", self.scope)
    }

    async fn listing(&self) -> Result<Listing, StoreError> {
        let Some(item) = self.table.get(&self.list_key()).await? else {
            return Ok(Listing::default());
        };
        Ok(Listing {
            cool_runs: counts_of(item.get("keys"))
                .into_iter()
                .map(|(k, n)| (k, n as u32))
                .collect(),
            through: number_of(item.get("through")),
            version: number_of(item.get(VERSION)),
        })
    }

    /// Decides every period that ended since the last decision, as of `now`.
    async fn decide(&self, now: i64) -> Result<(), StoreError> {
        let last_ended = self.period_of(now) - self.period_millis;
        if self.seen_decided.load(Ordering::Relaxed) >= last_ended {
            return Ok(());
        }
        let listing = self.listing().await?;
        if listing.through.is_some_and(|t| t >= last_ended) {
            self.seen_decided.fetch_max(last_ended, Ordering::Relaxed);
            return Ok(());
        }
        // Beyond the cool periods every key has cooled: older periods change nothing.
        let earliest =
            last_ended - self.period_millis * i64::from(self.thresholds.cool_periods.max(1));
        let mut period = listing
            .through
            .map_or(last_ended, |t| t + self.period_millis)
            .max(earliest);
        let mut set = HotSet::restore(self.thresholds, listing.cool_runs);
        while period <= last_ended {
            let (heavy, total) = self.heat_of(period).await?;
            set.observe(&heavy, total);
            period += self.period_millis;
        }
        let mut item = self.list_key().to_item();
        let keys = set
            .cool_runs()
            .iter()
            .map(|(k, n)| (k.clone(), AttrValue::N(n.to_string())))
            .collect();
        item.insert("keys".into(), AttrValue::M(keys));
        item.insert("through".into(), AttrValue::N(last_ended.to_string()));
        let version = listing.version.unwrap_or(0);
        item.insert(VERSION.into(), AttrValue::N((version + 1).to_string()));
        let expect = match listing.version {
            Some(v) => Expect::Version(v),
            None => Expect::Absent,
        };
        match self.table.put(&item, &expect).await {
            // Another function decided first: its list stands. (Had it decided fewer periods,
            // the next period's first report catches up.)
            Ok(()) | Err(StoreError::Conflict) => {
                self.seen_decided.fetch_max(last_ended, Ordering::Relaxed);
                Ok(())
            }
            Err(err) => Err(err),
        }
    }

    /// A period's reports added up: each key's records, and all records.
    async fn heat_of(&self, period: i64) -> Result<(Vec<Heavy<String>>, u64), StoreError> {
        let mut keys: BTreeMap<String, u64> = BTreeMap::new();
        let mut total = 0;
        for item in self.table.query_partition(&self.period_pk(period)).await? {
            total += number_of::<u64>(item.get("records")).unwrap_or(0);
            for (key, n) in counts_of(item.get("keys")) {
                *keys.entry(key).or_default() += n;
            }
        }
        let heavy = keys
            .into_iter()
            .map(|(key, count)| Heavy {
                key,
                count,
                error: 0,
            })
            .collect();
        Ok((heavy, total))
    }
}

#[async_trait]
impl HotKeyReports for HotKeyRegistry {
    async fn report(&self, report: &HeatReport) -> Result<(), StoreError> {
        if report.records > 0 {
            let mut item = Item::new();
            let period = self.period_of(report.at_millis);
            item.insert(PK.into(), AttrValue::S(self.period_pk(period)));
            item.insert(SK.into(), AttrValue::S(report.batch.clone()));
            item.insert("records".into(), AttrValue::N(report.records.to_string()));
            // A key no producer can salt would only grow the report and the list, each one
            // item: a few hot keys of a hundred KB would pass DynamoDB's 400 KB.
            let keys = report
                .keys
                .iter()
                .filter(|(k, _)| salt::can_salt(k))
                .map(|(k, n)| (k.clone(), AttrValue::N(n.to_string())))
                .collect();
            item.insert("keys".into(), AttrValue::M(keys));
            let expires = report.at_millis / 1000 + REPORT_TTL_SECS;
            item.insert(TTL.into(), AttrValue::N(expires.to_string()));
            self.table.put(&item, &Expect::Anything).await?;
        }
        self.decide(report.at_millis).await
    }

    fn floor_share(&self) -> f64 {
        self.thresholds.cool_share
    }
}

fn number_of<T: std::str::FromStr>(value: Option<&AttrValue>) -> Option<T> {
    value?.as_n()?.parse().ok()
}

/// A map of numbers, as reports and the hot list keep them; entries of another type are skipped.
fn counts_of(value: Option<&AttrValue>) -> Vec<(String, u64)> {
    match value {
        Some(AttrValue::M(map)) => map
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), number_of(Some(v))?)))
            .collect(),
        _ => Vec::new(),
    }
}

/// A producer's partitioner that salts the keys the registry names, reading its list again once
/// `refresh` has passed. A failed read keeps the list it had: the records still go somewhere, and
/// their results are the same whichever keys are salted.
pub struct AdaptivePartitioner {
    registry: HotKeyRegistry,
    buckets: u32,
    refresh_millis: i64,
    partitioner: Partitioner,
    next_read: i64,
}

impl AdaptivePartitioner {
    /// Salts the registry's hot keys over `buckets` buckets.
    pub fn new(registry: HotKeyRegistry, buckets: u32, refresh: Duration) -> Self {
        Self {
            registry,
            buckets,
            refresh_millis: refresh.as_millis() as i64,
            partitioner: Partitioner::new(Salting::None),
            next_read: i64::MIN,
        }
    }

    /// The partition key of the next record of `key` at `now`, and the explicit hash key of its
    /// bucket when it is salted (`Partitioner::route`).
    pub async fn route(&mut self, key: &str, now: i64) -> (String, Option<u128>) {
        if now >= self.next_read {
            self.next_read = now.saturating_add(self.refresh_millis);
            match self.registry.hot().await {
                Ok(hot) => self.partitioner.set_salting(Salting::Listed {
                    hot,
                    buckets: self.buckets,
                }),
                Err(err) => {
                    warn!(error = %err, "the hot-key list could not be read; keeping the last")
                }
            }
        }
        self.partitioner.route(key)
    }

    /// The keys salted at present.
    pub fn salted(&self) -> BTreeSet<String> {
        match self.partitioner.salting() {
            Salting::Listed { hot, .. } => hot.clone(),
            _ => BTreeSet::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::dynamodb::MemoryTable;

    const PERIOD: i64 = 10_000;

    fn registry(table: &Arc<MemoryTable>) -> HotKeyRegistry {
        let thresholds = Hysteresis {
            heat_share: 0.2,
            cool_share: 0.05,
            cool_periods: 2,
        };
        HotKeyRegistry::new(
            table.clone(),
            "agg",
            Duration::from_millis(PERIOD as u64),
            thresholds,
        )
    }

    fn report(at: i64, batch: &str, counts: &[(&str, u64)]) -> HeatReport {
        let records = counts.iter().map(|(_, n)| n).sum();
        let counts = counts.iter().map(|(k, n)| (k.to_string(), *n));
        HeatReport::new(at, batch.to_owned(), records, counts, 0.05)
    }

    fn keys(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|k| k.to_string()).collect()
    }

    #[tokio::test]
    async fn a_key_hot_across_shards_is_listed_once_its_period_ends_and_not_before() {
        let table = Arc::new(MemoryTable::new());
        let registry = registry(&table);
        // 30 of 100 records on `a`, split over two shards where neither alone is decisive.
        registry
            .report(&report(1_000, "s1/1", &[("a", 15), ("b", 35)]))
            .await
            .unwrap();
        registry
            .report(&report(2_000, "s2/1", &[("a", 15), ("c", 35)]))
            .await
            .unwrap();
        assert!(registry.hot().await.unwrap().is_empty(), "the period runs");
        registry
            .report(&report(PERIOD + 1, "s1/9", &[("b", 1)]))
            .await
            .unwrap();
        assert_eq!(registry.hot().await.unwrap(), keys(&["a", "b", "c"]));
    }

    /// A key the producer cannot salt (its buckets' partition keys would pass Kinesis's 256
    /// characters) is left out of reports: four hot keys of 120 KB made a report, and a hot
    /// list, past DynamoDB's item, and no key was listed hot or cool again.
    #[tokio::test]
    async fn keys_too_long_to_salt_are_left_out_so_that_reports_and_the_list_stay_small() {
        let table = Arc::new(MemoryTable::new());
        let registry = registry(&table);
        let long: Vec<String> = (0..4)
            .map(|i| format!("{i}{}", "k".repeat(120_000)))
            .collect();
        let counts: Vec<(&str, u64)> = long.iter().map(|k| (k.as_str(), 25)).collect();
        registry
            .report(&report(1_000, "s1/1", &counts))
            .await
            .unwrap();
        let longest = "k".repeat(251);
        registry
            .report(&report(PERIOD + 1, "s1/2", &[("a", 60), (&longest, 40)]))
            .await
            .unwrap();
        registry.report(&report(2 * PERIOD, "", &[])).await.unwrap();
        assert_eq!(registry.hot().await.unwrap(), keys(&["a", &longest]));
        let names_past_one = "k".repeat(252);
        assert!(!salt::can_salt(&names_past_one) && salt::can_salt(&longest));
    }

    #[tokio::test]
    async fn a_retried_batch_replaces_its_report_instead_of_adding_to_it() {
        let table = Arc::new(MemoryTable::new());
        let registry = registry(&table);
        for _ in 0..3 {
            let retried = report(1_000, "s1/1", &[("a", 30), ("b", 70)]);
            registry.report(&retried).await.unwrap();
        }
        registry
            .report(&report(1_500, "s2/1", &[("c", 120)]))
            .await
            .unwrap();
        registry.report(&report(PERIOD, "", &[])).await.unwrap();
        // Counted once, `a` has 30 of 220 records, under the heat share; thrice, 90 of 420.
        assert_eq!(registry.hot().await.unwrap(), keys(&["b", "c"]));
    }

    #[tokio::test]
    async fn a_hot_key_cools_after_its_cool_periods_even_when_the_stream_went_quiet() {
        let table = Arc::new(MemoryTable::new());
        let registry = registry(&table);
        registry
            .report(&report(0, "s1/1", &[("a", 90), ("b", 10)]))
            .await
            .unwrap();
        registry
            .report(&report(PERIOD, "s1/2", &[("a", 1), ("b", 99)]))
            .await
            .unwrap();
        assert_eq!(registry.hot().await.unwrap(), keys(&["a"]));
        // One cool period decided: `a` stays hot (hysteresis).
        registry.report(&report(2 * PERIOD, "", &[])).await.unwrap();
        assert_eq!(registry.hot().await.unwrap(), keys(&["a", "b"]));
        // Nothing for a long while: the periods missed are cool, for every key.
        registry.report(&report(9 * PERIOD, "", &[])).await.unwrap();
        assert!(registry.hot().await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_period_is_decided_once_however_many_functions_report_after_it_ends() {
        let table = Arc::new(MemoryTable::new());
        let first = registry(&table);
        let second = registry(&table);
        first
            .report(&report(0, "s1/1", &[("a", 90), ("b", 10)]))
            .await
            .unwrap();
        let after = report(PERIOD, "", &[]);
        let (one, two) = tokio::join!(first.report(&after), second.report(&after));
        one.unwrap();
        two.unwrap();
        assert_eq!(second.hot().await.unwrap(), keys(&["a"]));
        let list = table.get(&first.list_key()).await.unwrap().unwrap();
        // The period before the first report, then the first period: once each.
        assert_eq!(number_of::<u64>(list.get(VERSION)), Some(2));
    }

    #[tokio::test]
    async fn a_function_reads_the_hot_list_once_a_period_however_many_batches_it_runs() {
        let table = Arc::new(MemoryTable::new());
        let registry = registry(&table);
        let gets = || table.usage().calls.get("GetItem").copied();
        for i in 0..200 {
            let batch = format!("s1/{i}");
            registry
                .report(&report(PERIOD + i, &batch, &[("a", 9), ("b", 1)]))
                .await
                .unwrap();
        }
        assert_eq!(gets(), Some(1), "the first period's decision, once");
        for i in 0..200 {
            let batch = format!("s1/{}", 200 + i);
            registry
                .report(&report(2 * PERIOD + i, &batch, &[("a", 9)]))
                .await
                .unwrap();
        }
        assert_eq!(gets(), Some(2), "and once for the next");
        // The first period: `a` carried 90% of it, `b` 10%, under the heat share.
        assert_eq!(registry.hot().await.unwrap(), keys(&["a"]));
    }

    #[tokio::test]
    async fn a_producer_salts_the_listed_keys_from_its_next_read_and_stops_when_they_cool() {
        let table = Arc::new(MemoryTable::new());
        let registry = registry(&table);
        let mut producer =
            AdaptivePartitioner::new(registry.clone(), 4, Duration::from_millis(PERIOD as u64));
        assert_eq!(producer.route("a", 0).await, ("a".to_owned(), None));
        registry
            .report(&report(0, "s1/1", &[("a", 90), ("b", 10)]))
            .await
            .unwrap();
        registry.report(&report(PERIOD, "", &[])).await.unwrap();
        assert_eq!(
            producer.route("a", PERIOD - 1).await.0,
            "a",
            "read again only after the refresh"
        );
        let (partition_key, hash_key) = producer.route("a", PERIOD).await;
        assert_eq!(partition_key, "a#0");
        assert!(hash_key.is_some());
        assert_eq!(producer.route("a", PERIOD + 1).await.0, "a#1");
        assert_eq!(producer.salted(), keys(&["a"]));
        registry.report(&report(9 * PERIOD, "", &[])).await.unwrap();
        assert_eq!(
            producer.route("a", 9 * PERIOD).await,
            ("a".to_owned(), None)
        );
    }
}
