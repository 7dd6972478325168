//! What a commit carries besides state: an outbox, stored with it and cleared without a trace,
//! and the watermarks of a key fed by many lineages.

use super::*;

pub(super) async fn outboxes<T: Table + 'static>(
    store: &DynamoStateStore<T>,
    ns: &Namespace,
    clock: &ManualClock,
) {
    // An outbox larger than a head spills like a list, and clearing it leaves no trace.
    let mut state = state_with(&[("count", vec![raw("1")])]);
    state.watermarks.advance(
        &Origin("s/shardId-0/ob".into()),
        &seq(1),
        clock.now_millis(),
    );
    state.outbox = (0..300)
        .map(|i| output(i, format!("{{\"pad\":\"{}\"}}", "p".repeat(2000))))
        .collect();
    let committed = commit_one(store, ns, "ob", state)
        .await
        .expect("a 600 KB outbox");
    let loaded = load_one(store, ns, "ob").await;
    assert_eq!(loaded.outbox.len(), 300);
    assert!(loaded
        .outbox
        .iter()
        .enumerate()
        .all(|(i, o)| o.id == output(i, String::new()).id));
    assert!(
        !stored_items(store, ns, "ob").await.is_empty(),
        "it spilled"
    );

    let cleared = store.clear_outbox(ns, vec![committed]).await;
    assert!(cleared.iter().all(Result::is_ok), "{cleared:?}");
    // Its segments stay a while for loads that read the head before, then go by TTL, even if
    // the key never commits again.
    let pk = DynamoStateStore::<T>::head_key(ns, "ob").pk;
    let segments: Vec<Item> = store
        .table()
        .query_partition(&pk)
        .await
        .expect("query")
        .into_iter()
        .filter(|i| i["sk"].as_s() != Some("head"))
        .collect();
    assert!(!segments.is_empty());
    let now = clock.now_millis() / 1000;
    for segment in &segments {
        let ttl = segment
            .get(keyway::adapters::dynamodb::TTL)
            .and_then(|t| t.as_n())
            .and_then(|t| t.parse::<i64>().ok());
        assert!(
            ttl.is_some_and(|t| t > now && t <= now + 3600),
            "{:?} expires within the hour: {ttl:?}",
            segment["sk"]
        );
    }
    let loaded = load_one(store, ns, "ob").await;
    assert!(loaded.outbox.is_empty(), "a cleared outbox is gone");
    assert_eq!(loaded.version, 1, "clearing does not move the version");
    assert_eq!(entries_of(&loaded, "count"), ["1"]);
    // A writer that read the key before the clear still commits, at the same version.
    let mut next = loaded;
    next.outbox.push(output(1, "{}".into()));
    let committed = commit_one(store, ns, "ob", next)
        .await
        .expect("commit after a clear");
    assert_eq!(
        stored_items(store, ns, "ob").await,
        Vec::<String>::new(),
        "the spilled outbox was collected"
    );

    // A clear that comes after another commit leaves that commit alone.
    let mut later = load_one(store, ns, "ob").await;
    later.outbox.clear();
    later.outbox.push(output(2, "{\"later\":1}".into()));
    commit_one(store, ns, "ob", later)
        .await
        .expect("a later commit");
    store
        .clear_outbox(ns, vec![committed])
        .await
        .remove(0)
        .expect("a stale clear is no error");
    assert_eq!(
        load_one(store, ns, "ob").await.outbox.len(),
        1,
        "the later outbox stays"
    );
}

pub(super) async fn many_lineages<T: Table + 'static>(
    store: &DynamoStateStore<T>,
    ns: &Namespace,
    clock: &ManualClock,
) {
    // A key fed by many lineages: the head holds the most recent, items the rest, and a load
    // finds each lineage it is asked for.
    let limits = store.limits();
    let total = limits.lineages_per_commit * 3;
    let lineage = |i: usize| Origin(format!("items@label/{i:06}"));
    for round in 0..3 {
        let mut state = load_one(store, ns, "fan-in").await;
        assert_eq!(state.version, round as u64);
        let base = round * limits.lineages_per_commit;
        for i in base..base + limits.lineages_per_commit {
            let mark = watermark_at(clock.now_millis() + i as i64);
            state.watermarks.insert(lineage(i), mark(i as u64 + 1));
        }
        state.slots.insert(
            "count".into(),
            SlotData::fresh(vec![raw(&round.to_string())]),
        );
        commit_one(store, ns, "fan-in", state)
            .await
            .expect("a commit of new lineages");
    }
    let head = store
        .table()
        .get(&DynamoStateStore::<T>::head_key(ns, "fan-in"))
        .await
        .unwrap()
        .unwrap();
    assert!(
        keyway::domain::item::item_size(&head) < 64 * 1024,
        "the head stays small: {} bytes",
        keyway::domain::item::item_size(&head)
    );
    let wanted: Vec<Origin> = (0..total).step_by(7).map(lineage).collect();
    let loaded = store
        .load_keys(
            ns,
            &[LoadKey {
                key: "fan-in",
                lineages: wanted.iter().collect(),
            }],
        )
        .await
        .expect("load with lineages")
        .remove("fan-in")
        .unwrap();
    for l in &wanted {
        let i: usize = l.as_str().rsplit('/').next().unwrap().parse().unwrap();
        assert!(
            loaded.watermarks.has_applied(l, &seq(i as u64 + 1), None),
            "lineage {l} is known"
        );
        assert!(!loaded.watermarks.has_applied(l, &seq(i as u64 + 2), None));
    }
}
