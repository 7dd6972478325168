//! What a store keeps: commits conditional on the version read, lists far beyond an item in
//! segments, and the keys it lists.

use super::*;

pub(super) async fn key_listing<T: Table + 'static>(store: &DynamoStateStore<T>) {
    // A namespace of its own: the listing sees every key of it. Its heads are deflated with a
    // dictionary, as the contract's are.
    let ns = Namespace::new("listing", "0123456789abcdef")
        .with_dictionaries([Dictionary::new(super::CONTRACT_DICTIONARY)]);
    let long = format!("rows#{}", "x".repeat(1_500));
    let mut keys: Vec<String> = (0..25).map(|n| format!("rows#{n:02}")).collect();
    keys.push(long);
    for key in keys
        .iter()
        .chain([&"other#1".to_owned(), &"rows#gone".to_owned()])
    {
        commit_one(store, &ns, key, state_with(&[("row", vec![raw("1")])]))
            .await
            .expect("commit");
    }
    // A key whose state went (a deleted row keeps its head for its watermarks) is not listed.
    let mut gone = load_one(store, &ns, "rows#gone").await;
    gone.slots.clear();
    commit_one(store, &ns, "rows#gone", gone)
        .await
        .expect("commit");
    // Another namespace's keys stay out.
    let other = Namespace::new("listing2", ns.signature.clone());
    commit_one(
        store,
        &other,
        "rows#99",
        state_with(&[("row", vec![raw("1")])]),
    )
    .await
    .expect("commit");
    let (mut found, mut cursor, mut pages) = (Vec::new(), None::<String>, 0);
    loop {
        let page = store
            .list_keys(&ns, "rows#", cursor.as_deref())
            .await
            .expect("list keys");
        found.extend(page.keys);
        pages += 1;
        assert!(pages < 10_000, "the listing never ends");
        match page.next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    found.sort();
    keys.sort();
    assert_eq!(
        found, keys,
        "each key with state under the prefix once, long ones too"
    );
}

pub(super) async fn basics<T: Table + 'static>(
    store: &DynamoStateStore<T>,
    ns: &Namespace,
    clock: &ManualClock,
) {
    // An absent key loads empty at version 0.
    let k1 = load_one(store, ns, "k1").await;
    assert_eq!(k1.version, 0);
    assert!(k1.slots.is_empty());

    // A commit stores slots, watermarks and outbox, and bumps the version.
    let lineage = Origin("s/shardId-0/k1".into());
    let mut state = state_with(&[
        ("count", vec![raw("41")]),
        ("seen", vec![raw(r#"["a",1]"#), raw(r#"["b",2]"#)]),
    ]);
    state
        .watermarks
        .advance(&lineage, &seq(17), clock.now_millis());
    state.outbox.push(output(17, "{\"n\":41}".into()));
    let committed = commit_one(store, ns, "k1", state.clone())
        .await
        .expect("first commit");
    assert_eq!(committed.version, 1);
    let k1 = load_one(store, ns, "k1").await;
    assert_eq!(k1.version, 1);
    assert_eq!(entries_of(&k1, "count"), ["41"]);
    assert_eq!(entries_of(&k1, "seen"), [r#"["a",1]"#, r#"["b",2]"#]);
    assert!(k1.watermarks.has_applied(&lineage, &seq(17), None));
    assert_eq!(k1.outbox, state.outbox);

    // A commit at a stale version conflicts and changes nothing.
    let stale = state_with(&[("count", vec![raw("999")])]);
    assert_eq!(
        commit_one(store, ns, "k1", stale).await.map(|c| c.version),
        Err(StoreError::Conflict)
    );
    assert_eq!(
        entries_of(&load_one(store, ns, "k1").await, "count"),
        ["41"],
        "a conflicting commit must not write"
    );

    // Other namespaces (another operator, another signature) see nothing of it.
    let other = Namespace::new("contract", "fedcba9876543210");
    assert_eq!(load_one(store, &other, "k1").await.version, 0);

    // Many keys load in one call of the store (more than one BatchGetItem).
    let keys: Vec<String> = (0..250).map(|i| format!("many-{i}")).collect();
    let commits = keys
        .iter()
        .map(|k| {
            Commit::new(
                k.clone(),
                0,
                state_with(&[("count", vec![raw(&format!("\"{k}\""))])]),
            )
        })
        .collect();
    assert!(
        store.commit(ns, commits).await.iter().all(Result::is_ok),
        "250 independent commits"
    );
    let loaded = store.load(ns, &keys).await.expect("load 250 keys");
    assert_eq!(loaded.len(), 250);
    for k in &keys {
        assert_eq!(entries_of(&loaded[k], "count"), [format!("\"{k}\"")]);
    }

    // A long key round-trips.
    let long_key = "k".repeat(3000);
    commit_one(
        store,
        ns,
        &long_key,
        state_with(&[("count", vec![raw("3")])]),
    )
    .await
    .expect("long key");
    assert_eq!(
        entries_of(&load_one(store, ns, &long_key).await, "count"),
        ["3"]
    );
}

pub(super) async fn large_lists<T: Table + 'static>(store: &DynamoStateStore<T>, ns: &Namespace) {
    // An entry of exactly the size the store says it holds is stored, under the item limit.
    let limit = store.limits().max_entry_bytes;
    let largest = raw(&format!("\"{}\"", "y".repeat(limit - 2)));
    commit_one(store, ns, "largest", state_with(&[("v", vec![largest])]))
        .await
        .expect("an entry of the store's limit commits");
    let loaded = load_one(store, ns, "largest").await;
    assert_eq!(loaded.slots["v"].entries[0].get().len(), limit);

    // A list of 10,000 entries of 2 KB (20 MB, fifty times DynamoDB's item limit) stores and loads.
    let entry = |i: usize| raw(&format!("\"{i:05}{}\"", "x".repeat(2043)));
    let big: Vec<Box<RawValue>> = (0..10_000).map(entry).collect();
    commit_one(store, ns, "big", state_with(&[("buffer", big)]))
        .await
        .expect("commit a 20 MB list");
    let loaded = load_one(store, ns, "big").await;
    let list = &loaded.slots["buffer"];
    assert_eq!(list.entries.len(), 10_000);
    assert!(
        list.entries
            .iter()
            .enumerate()
            .all(|(i, e)| e.get().starts_with(&format!("\"{i:05}"))),
        "order kept"
    );
    let segments_before = stored_items(store, ns, "big").await;
    // Segments are filled up to their target size: 20 MB in 256 KB segments.
    assert!(
        (50..=100).contains(&segments_before.len()),
        "a 20 MB list lives in some 80 segments: {}",
        segments_before.len()
    );

    // Appending keeps every segment and writes only the new entries.
    let mut grown = loaded.clone();
    grown
        .slots
        .get_mut("buffer")
        .unwrap()
        .entries
        .push(entry(10_000));
    commit_one(store, ns, "big", grown).await.expect("append");
    let loaded = load_one(store, ns, "big").await;
    assert_eq!(loaded.slots["buffer"].entries.len(), 10_001);
    let after_append = stored_items(store, ns, "big").await;
    assert!(
        segments_before.iter().all(|sk| after_append.contains(sk)),
        "an append must not rewrite segments"
    );

    // Keeping the first half (as a store may be handed any prefix) keeps the segments that lie
    // wholly within it and rewrites the rest.
    let mut halved = loaded.clone();
    halved.slots.get_mut("buffer").unwrap().apply(SlotUpdate {
        keep: 5_000,
        tail: vec![raw("\"tail\"")],
    });
    commit_one(store, ns, "big", halved).await.expect("halve");
    let loaded = load_one(store, ns, "big").await;
    let entries = &loaded.slots["buffer"].entries;
    assert_eq!(entries.len(), 5_001);
    assert!(entries[..5_000]
        .iter()
        .enumerate()
        .all(|(i, e)| e.get().starts_with(&format!("\"{i:05}"))));
    assert_eq!(entries[5_000].get(), "\"tail\"");

    // Replacing the list leaves its segments unreferenced; the next commit deletes them.
    let mut replaced = loaded.clone();
    replaced.slots.get_mut("buffer").unwrap().apply(SlotUpdate {
        keep: 0,
        tail: vec![raw("1")],
    });
    commit_one(store, ns, "big", replaced)
        .await
        .expect("replace");
    let loaded = load_one(store, ns, "big").await;
    assert_eq!(entries_of(&loaded, "buffer"), ["1"]);
    commit_one(store, ns, "big", loaded)
        .await
        .expect("commit that collects garbage");
    assert_eq!(
        stored_items(store, ns, "big").await,
        Vec::<String>::new(),
        "only the head remains once garbage is collected"
    );
}
