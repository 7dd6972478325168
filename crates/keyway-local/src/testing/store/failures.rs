//! Commits that fail part way: lost responses, lost races, crashes inside a commit, and the
//! segments nothing would ever free.

use super::*;

/// Segment items under a key that its head neither references nor lists as garbage or pending:
/// storage nothing would ever free.
pub async fn orphans<T: Table + 'static>(
    store: &DynamoStateStore<T>,
    ns: &Namespace,
    key: &str,
) -> Vec<String> {
    let head_key = DynamoStateStore::<T>::head_key(ns, key);
    let items = store
        .table()
        .query_partition(&head_key.pk)
        .await
        .expect("query");
    let Some(head) = items.iter().find(|i| i["sk"].as_s() == Some("head")) else {
        return items
            .iter()
            .filter_map(|i| i["sk"].as_s().map(str::to_owned))
            .collect();
    };
    let accounted = DynamoStateStore::<T>::accounted_for(head, &ns.dictionaries);
    items
        .iter()
        .filter_map(|i| i["sk"].as_s())
        .filter(|sk| *sk != "head" && !sk.starts_with("wm#") && !accounted.contains(*sk))
        .map(str::to_owned)
        .collect()
}

pub(super) async fn crashes_inside_a_commit<T: Table + 'static>(
    store: &DynamoStateStore<T>,
    ns: &Namespace,
    clock: &ManualClock,
) {
    use futures::FutureExt as _;
    let crashing = DynamoStateStore::new(
        Arc::new(CrashingAfterSegments(store.table().clone())),
        ManualClock::at(clock.now_millis()) as Arc<dyn Clock>,
    );
    let entry = |i: usize| raw(&format!("\"{i:05}{}\"", "z".repeat(2043)));
    let list = |n: usize| -> Vec<Box<RawValue>> { (0..n).map(entry).collect() };
    // A key whose first commit writes segments, and one whose later commit does: both die
    // between their segments and their head.
    commit_one(
        store,
        ns,
        "crashed-later",
        state_with(&[("buffer", list(20))]),
    )
    .await
    .expect("a first commit");
    for key in ["crashed-first", "crashed-later"] {
        let mut state = load_one(store, ns, key).await;
        state
            .slots
            .insert("buffer".into(), SlotData::fresh(list(100)));
        let crashed = std::panic::AssertUnwindSafe(commit_one(&crashing, ns, key, state))
            .catch_unwind()
            .await;
        assert!(crashed.is_err(), "{key}: the commit died");
        assert!(
            !stored_items(store, ns, key).await.is_empty(),
            "{key}: its segments were written"
        );
        assert_eq!(
            orphans(store, ns, key).await,
            Vec::<String>::new(),
            "{key}: listed as pending"
        );
        // The redelivery commits again; the segments of the commit that died become garbage,
        // and the commit after collects them.
        let mut again = load_one(store, ns, key).await;
        again
            .slots
            .insert("buffer".into(), SlotData::fresh(list(3)));
        commit_one(store, ns, key, again)
            .await
            .expect("the redelivery commits");
        assert_eq!(
            orphans(store, ns, key).await,
            Vec::<String>::new(),
            "{key}: listed as garbage"
        );
        let after = load_one(store, ns, key).await;
        assert_eq!(after.slots["buffer"].entries.len(), 3);
        commit_one(store, ns, key, after)
            .await
            .expect("a commit that collects them");
        assert_eq!(
            stored_items(store, ns, key).await,
            Vec::<String>::new(),
            "{key}: nothing is left of the commit that died"
        );
    }
}

pub(super) async fn lost_responses<T: Table + 'static>(
    store: &DynamoStateStore<T>,
    ns: &Namespace,
    clock: &ManualClock,
) {
    // A head put whose response is lost landed: the commit reports success, not a conflict, and
    // the segments the head references stay.
    let losing = Arc::new(LosingResponses::new(store.table().clone()));
    let lossy = DynamoStateStore::new(losing.clone(), ManualClock::at(clock.now_millis()));
    let entry = |i: usize| raw(&format!("\"{i:05}{}\"", "y".repeat(2043)));
    let list: Vec<Box<RawValue>> = (0..200).map(entry).collect();
    losing.lose_next(1);
    let committed = commit_one(&lossy, ns, "lost", state_with(&[("buffer", list)]))
        .await
        .expect("a commit whose response was lost still commits");
    assert_eq!(committed.version, 1);
    let loaded = load_one(store, ns, "lost").await;
    assert_eq!(loaded.version, 1);
    assert_eq!(
        loaded.slots["buffer"].entries.len(),
        200,
        "its segments are all there"
    );
    // And once more on a key that exists.
    let mut next = loaded;
    next.slots
        .get_mut("buffer")
        .unwrap()
        .entries
        .push(entry(200));
    losing.lose_next(1);
    commit_one(&lossy, ns, "lost", next)
        .await
        .expect("again, on a later version");
    assert_eq!(
        load_one(store, ns, "lost").await.slots["buffer"]
            .entries
            .len(),
        201
    );
    // And when another writer commits the key after the put landed, before its writer reads the
    // head back: the head still remembers the lost commit's token, so it is not taken for a
    // conflict (which would send the key's records round again and delete the segments the
    // other writer's head now references).
    let mut third = load_one(store, ns, "lost").await;
    third
        .slots
        .get_mut("buffer")
        .unwrap()
        .entries
        .push(entry(201));
    let other = DynamoStateStore::new(store.table().clone(), ManualClock::at(clock.now_millis()));
    let (other_ns, entry_202) = (ns.clone(), entry(202));
    losing.lose_next_while(Box::pin(async move {
        let mut state = load_one(&other, &other_ns, "lost").await;
        let buffer = state.slots.get_mut("buffer").unwrap();
        assert_eq!(buffer.entries.len(), 202, "the lost put landed");
        buffer.entries.push(entry_202);
        commit_one(&other, &other_ns, "lost", state)
            .await
            .expect("the other writer commits on top");
    }));
    let settled = commit_one(&lossy, ns, "lost", third)
        .await
        .expect("the lost commit is recognised after a later one");
    assert_eq!(settled.version, 3);
    let loaded = load_one(store, ns, "lost").await;
    assert_eq!(loaded.version, 4);
    assert_eq!(loaded.slots["buffer"].entries.len(), 203);
    // A head keeps the tokens of its last few commits, not of every commit.
    for _ in 0..TOKENS_KEPT + 2 {
        let state = load_one(store, ns, "lost").await;
        commit_one(store, ns, "lost", state).await.unwrap();
    }
    let head_key = DynamoStateStore::<T>::head_key(ns, "lost");
    let head = store.table().get(&head_key).await.unwrap().unwrap();
    let text =
        keyway::adapters::dynamodb::stored_text::read(&head, "doc", "{}", "doc", &ns.dictionaries);
    let doc: serde_json::Value = serde_json::from_str(&text.unwrap()).expect("the head's doc");
    assert_eq!(doc["tk"].as_array().map(Vec::len), Some(TOKENS_KEPT));
}

/// A commit that loses the race for its key after writing its segments deletes them at once: the
/// head that won never references them.
pub(super) async fn lost_races<T: Table + 'static>(
    store: &DynamoStateStore<T>,
    ns: &Namespace,
    clock: &ManualClock,
) {
    let racing = Arc::new(LosingResponses::new(store.table().clone()));
    let loser = DynamoStateStore::new(racing.clone(), ManualClock::at(clock.now_millis()));
    commit_one(store, ns, "race", state_with(&[("buffer", vec![raw("1")])]))
        .await
        .unwrap();
    let mut large = load_one(store, ns, "race").await;
    let entry = |i: usize| raw(&format!("\"{i:05}{}\"", "r".repeat(2043)));
    large.slots.get_mut("buffer").unwrap().entries = (0..200).map(entry).collect();
    let winner = DynamoStateStore::new(store.table().clone(), ManualClock::at(clock.now_millis()));
    let other_ns = ns.clone();
    racing.before_next_put(Box::pin(async move {
        let mut state = load_one(&winner, &other_ns, "race").await;
        state
            .slots
            .get_mut("buffer")
            .unwrap()
            .entries
            .push(raw("2"));
        commit_one(&winner, &other_ns, "race", state)
            .await
            .expect("the other writer commits first");
    }));
    let lost = commit_one(&loser, ns, "race", large).await;
    assert!(matches!(lost, Err(StoreError::Conflict)), "{lost:?}");
    let segments: Vec<String> = stored_items(store, ns, "race")
        .await
        .into_iter()
        .filter(|sk| sk.starts_with("seg#"))
        .collect();
    assert_eq!(
        segments,
        Vec::<String>::new(),
        "the loser's segments are gone"
    );
    assert_eq!(
        entries_of(&load_one(store, ns, "race").await, "buffer"),
        ["1", "2"]
    );
}
