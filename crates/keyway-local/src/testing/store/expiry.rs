//! State past its TTL: it loads empty, its segments outlive it, and the head's own TTL.

use super::*;

pub(super) async fn expiry<T: Table + 'static>(
    store: &DynamoStateStore<T>,
    ns: &Namespace,
    clock: &ManualClock,
) {
    slots_expire_and_what_guards_them_stays(store, ns, clock).await;
    segments_outlive_their_state(store, ns, clock).await;
    state_without_a_ttl_and_emptied_keys(store, ns, clock).await;
}

/// Slots past their TTL load empty but keep the version, the watermarks and the outbox; the
/// replacing commit (outbox sent) sets a TTL that covers the watermarks' redeliveries.
async fn slots_expire_and_what_guards_them_stays<T: Table + 'static>(
    store: &DynamoStateStore<T>,
    ns: &Namespace,
    clock: &ManualClock,
) {
    let lineage = Origin("s/shardId-0/ttl".into());
    let mut expiring = state_with(&[("count", vec![raw("5")])]);
    let now_secs = clock.now_millis() / 1000;
    expiring.expires_at = Some(now_secs + 60);
    expiring
        .watermarks
        .advance(&lineage, &seq(5), clock.now_millis());
    expiring.outbox.push(output(5, "{\"owed\":true}".into()));
    commit_one(store, ns, "ttl", expiring)
        .await
        .expect("commit with ttl");
    assert_eq!(
        entries_of(&load_one(store, ns, "ttl").await, "count"),
        ["5"]
    );
    let head_key = DynamoStateStore::<T>::head_key(ns, "ttl");
    let head = store.table().get(&head_key).await.unwrap().unwrap();
    assert!(
        !head.contains_key(keyway::adapters::dynamodb::TTL),
        "a head holding an outbox never expires"
    );
    clock.advance(61_000);
    let loaded = load_one(store, ns, "ttl").await;
    assert!(loaded.slots.is_empty(), "expired slots are never returned");
    assert_eq!(loaded.version, 1);
    assert!(
        loaded.watermarks.has_applied(&lineage, &seq(5), None),
        "watermarks outlive the slots"
    );
    assert_eq!(loaded.outbox.len(), 1, "an outbox never expires");

    let mut replacing = loaded;
    replacing.outbox.clear();
    replacing
        .slots
        .insert("count".into(), SlotData::fresh(vec![raw("1")]));
    replacing.expires_at = Some(clock.now_millis() / 1000 + 60);
    let version = replacing.version;
    let window = Duration::from_secs(24 * 3600);
    let commit = Commit {
        key: "ttl".into(),
        expected_version: version,
        state: replacing,
        redelivery_window: window,
    };
    store
        .commit(ns, vec![commit])
        .await
        .remove(0)
        .expect("replace expired state");
    let head = store.table().get(&head_key).await.unwrap().unwrap();
    let ttl: i64 = head[keyway::adapters::dynamodb::TTL]
        .as_n()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        ttl >= now_secs + window.as_secs() as i64,
        "the head lives while its watermarks guard redeliveries: ttl {ttl}"
    );
}

/// Segments of state with a TTL outlive it, and are rewritten before they would expire under
/// state whose TTL moved on, their entries intact.
async fn segments_outlive_their_state<T: Table + 'static>(
    store: &DynamoStateStore<T>,
    ns: &Namespace,
    clock: &ManualClock,
) {
    let entry = |i: usize| raw(&format!("\"{i:05}{}\"", "z".repeat(2043)));
    let mut large = state_with(&[("buffer", (0..300).map(entry).collect())]);
    let exp = clock.now_millis() / 1000 + 60;
    large.expires_at = Some(exp);
    commit_one(store, ns, "ttl-large", large).await.unwrap();
    let pk = DynamoStateStore::<T>::head_key(ns, "ttl-large").pk;
    let segment_ttls = || async {
        let items = store.table().query_partition(&pk).await.unwrap();
        let ttls: Vec<i64> = items
            .iter()
            .filter(|i| i["sk"].as_s().is_some_and(|sk| sk.starts_with("seg#")))
            .map(|i| {
                i[keyway::adapters::dynamodb::TTL]
                    .as_n()
                    .unwrap()
                    .parse()
                    .unwrap()
            })
            .collect();
        assert!(!ttls.is_empty(), "the list lives in segments");
        ttls
    };
    let period = exp - clock.now_millis() / 1000;
    for ttl in segment_ttls().await {
        assert!(
            ttl >= exp + period,
            "a segment expires at {ttl}, not a TTL period of {period} s after its state at {exp}"
        );
    }
    clock.advance(50_000);
    let mut extended = load_one(store, ns, "ttl-large").await;
    extended.expires_at = Some(clock.now_millis() / 1000 + 600);
    let later = extended.expires_at.unwrap();
    extended
        .slots
        .get_mut("buffer")
        .unwrap()
        .entries
        .push(entry(300));
    commit_one(store, ns, "ttl-large", extended).await.unwrap();
    // The segments rewritten become garbage, which the next commit deletes.
    let again = load_one(store, ns, "ttl-large").await;
    commit_one(store, ns, "ttl-large", again).await.unwrap();
    for ttl in segment_ttls().await {
        assert!(
            ttl >= later,
            "a segment left to expire at {ttl}, before {later}"
        );
    }
    let loaded = load_one(store, ns, "ttl-large").await;
    let entries = &loaded.slots["buffer"].entries;
    assert_eq!(entries.len(), 301);
    assert!(entries
        .iter()
        .enumerate()
        .all(|(i, e)| e.get().starts_with(&format!("\"{i:05}"))));
}

/// State without a TTL has no ttl attribute; a key emptied of its state keeps its watermarks as
/// long as a redelivery can come, then goes: nothing of a deleted row stays for ever.
async fn state_without_a_ttl_and_emptied_keys<T: Table + 'static>(
    store: &DynamoStateStore<T>,
    ns: &Namespace,
    clock: &ManualClock,
) {
    commit_one(
        store,
        ns,
        "forever",
        state_with(&[("count", vec![raw("1")])]),
    )
    .await
    .unwrap();
    assert_eq!(head_ttl(store, ns, "forever").await, None);

    let mut emptied = load_one(store, ns, "forever").await;
    emptied.slots.clear();
    emptied
        .watermarks
        .advance(&Origin("s/shardId-0/e".into()), &seq(9), clock.now_millis());
    commit_one(store, ns, "forever", emptied).await.unwrap();
    let window = keyway::ports::DEFAULT_REDELIVERY_WINDOW.as_secs() as i64;
    assert_eq!(
        head_ttl(store, ns, "forever").await,
        Some(clock.now_millis() / 1000 + window + 1)
    );
}

/// The `ttl` of the head of `key`, which must exist.
pub(super) async fn head_ttl<T: Table + 'static>(
    store: &DynamoStateStore<T>,
    ns: &Namespace,
    key: &str,
) -> Option<i64> {
    let head = store
        .table()
        .get(&DynamoStateStore::<T>::head_key(ns, key))
        .await
        .unwrap()
        .expect("the head");
    head.get(keyway::adapters::dynamodb::TTL)
        .and_then(|t| t.as_n())
        .and_then(|t| t.parse().ok())
}
