//! The due-time index of timers.

use super::*;

/// The due-time index of timers: entries come due in time order once their time has come, each
/// operator's apart, until forgotten; one due long ago is found however long no sweep ran; the
/// timers of one time share an entry.
pub(super) async fn timer_index<T: Table + 'static>(
    store: &DynamoStateStore<T>,
    clock: &ManualClock,
) {
    let now = clock.now_millis();
    let minute = 60_000;
    let entry = |key: &str, at_millis: i64| keyway::ports::TimerEntry {
        at_millis,
        key: key.to_owned(),
    };
    let keys = |due: &[keyway::ports::DueTimer]| -> Vec<String> {
        due.iter().map(|d| d.timer.key.clone()).collect()
    };
    let entries = [
        entry("late", now + 180 * minute),
        entry("soon", now + minute),
        entry("later", now + 120 * minute),
        entry("past", now - 30 * minute),
    ];
    store
        .schedule_timers("timed", &entries, now)
        .await
        .expect("timers indexed");
    let due = store.due_timers("timed", now, 10).await.expect("due");
    assert_eq!(
        keys(&due),
        ["past"],
        "a timer set in the past is due at once"
    );
    assert!(
        store
            .due_timers("untimed", now + 999 * minute, 10)
            .await
            .unwrap()
            .is_empty(),
        "an operator sees only its own timers"
    );
    let all = store
        .due_timers("timed", now + 180 * minute, 10)
        .await
        .unwrap();
    assert_eq!(
        keys(&all),
        ["past", "soon", "later", "late"],
        "in time order"
    );
    let two = store
        .due_timers("timed", now + 180 * minute, 2)
        .await
        .unwrap();
    assert_eq!(keys(&two), ["past", "soon"], "at most the limit");
    store.forget_timers("timed", &two).await.expect("forgotten");
    let rest = store
        .due_timers("timed", now + 180 * minute, 10)
        .await
        .unwrap();
    assert_eq!(keys(&rest), ["later", "late"], "forgotten entries are gone");
    assert_eq!(rest[1].timer, entries[0]);
    store.forget_timers("timed", &rest).await.unwrap();
    postponed_and_long_ago(store, now).await;
    shared_entries(store, now).await;
}

/// Timers one write sets for one time come due together, whatever the limit; one of them
/// postponed comes due again alone, after the others were forgotten.
async fn shared_entries<T: Table + 'static>(store: &DynamoStateStore<T>, now: i64) {
    let minute = 60_000;
    let t = now + 10 * 1440 * minute;
    let entries: Vec<keyway::ports::TimerEntry> = ["x", "y", "z"]
        .into_iter()
        .map(|key| keyway::ports::TimerEntry {
            at_millis: t + minute,
            key: key.to_owned(),
        })
        .collect();
    store.schedule_timers("shared", &entries, t).await.unwrap();
    let due = store.due_timers("shared", t + minute, 2).await.unwrap();
    let keys: Vec<&str> = due.iter().map(|d| d.timer.key.as_str()).collect();
    assert_eq!(keys, ["x", "y", "z"], "one entry, whole");
    let (left, done): (Vec<_>, Vec<_>) = due.into_iter().partition(|d| d.timer.key == "y");
    store
        .postpone_timers("shared", &left, t + 5 * minute)
        .await
        .unwrap();
    store.forget_timers("shared", &done).await.unwrap();
    let again = store
        .due_timers("shared", t + 5 * minute, 10)
        .await
        .unwrap();
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(again[0].timer, entries[1]);
    store.forget_timers("shared", &again).await.unwrap();
}

/// An entry postponed comes due again then, as the same timer, and not before. (Written by a
/// clock as late as the sweeps of `timer_index`: the index trusts writers to lag no more than
/// minutes.) One due long ago is found by a sweep after days without one.
async fn postponed_and_long_ago<T: Table + 'static>(store: &DynamoStateStore<T>, now: i64) {
    let minute = 60_000;
    let entry = |key: &str, at_millis: i64| keyway::ports::TimerEntry {
        at_millis,
        key: key.to_owned(),
    };
    let t = now + 180 * minute;
    let again = entry("again", t + minute);
    store
        .schedule_timers("timed", std::slice::from_ref(&again), t)
        .await
        .unwrap();
    let due = store.due_timers("timed", t + minute, 10).await.unwrap();
    assert_eq!(due.len(), 1);
    store
        .postpone_timers("timed", &due, t + 5 * minute)
        .await
        .expect("postponed");
    let early = store.due_timers("timed", t + 4 * minute, 10).await.unwrap();
    assert!(early.is_empty(), "not due before its new time: {early:?}");
    let later = store.due_timers("timed", t + 5 * minute, 10).await.unwrap();
    assert_eq!(later.len(), 1, "one entry, not two");
    assert_eq!(later[0].timer, again);
    store.forget_timers("timed", &later).await.unwrap();
    // No sweep for four days, then one that reads a bounded number of hours each time.
    let long_ago = entry("long-ago", now + 200 * minute);
    store
        .schedule_timers("timed", std::slice::from_ref(&long_ago), now)
        .await
        .unwrap();
    let mut found = Vec::new();
    for _ in 0..3 {
        found.extend(
            store
                .due_timers("timed", now + 4 * 1440 * minute, 10)
                .await
                .unwrap(),
        );
    }
    assert_eq!(found.first().map(|d| &d.timer), Some(&long_ago));
}
