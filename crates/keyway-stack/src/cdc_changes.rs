//! Generated change events of two tables, `domains` (id, name, user_id) and `users` (id, name),
//! as Debezium's PostgreSQL connector writes them to its topics: inserts, updates that rename a
//! row or move a domain to another user (or to none), primary-key changes (a delete, a tombstone
//! and a create under the new key), deletes followed by their tombstones, and events a restarted
//! connector sends again. For the CDC join's command, benchmark, demo and tests.

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};

use crate::cdc::SourceEvent;

/// The join the generated tables are made for.
pub const JOIN: &str = "domains.user_id=users.id";
/// The `domains` table's topic, as Debezium names it (`prefix.schema.table`).
pub(crate) const DOMAINS: &str = "app.public.domains";
/// The `users` table's topic, as Debezium names it.
pub(crate) const USERS: &str = "app.public.users";

/// What to generate.
#[derive(Clone, Debug)]
pub struct Workload {
    /// How many changes the database makes, truncates included.
    pub changes: usize,
    /// Rows the `domains` table holds about at most.
    pub domains: u64,
    /// Rows the `users` table holds about at most.
    pub users: u64,
    /// Of the updates of a domain, the share that moves it to another user.
    pub join_key_updates: f64,
    /// Of all events, the share sent twice.
    pub duplicates: f64,
    /// The share of domains that belong to user 0, a large customer: its join key holds that
    /// many rows.
    pub hot_user: f64,
    /// Truncates among the changes, evenly spread, of domains and users in turn.
    pub truncates: usize,
    /// Seeds the generator, so that a workload can be made again.
    pub seed: u64,
}

impl Default for Workload {
    fn default() -> Self {
        Self {
            changes: 10_000,
            domains: 2_000,
            users: 500,
            join_key_updates: 0.1,
            duplicates: 0.01,
            hot_user: 0.02,
            truncates: 0,
            seed: 7,
        }
    }
}

type Row = Map<String, Value>;

struct Generator {
    rng: StdRng,
    workload: Workload,
    rows: BTreeMap<(&'static str, u64), Row>,
    /// Primary keys a row moves to are new ones, above every id generated at random.
    next_id: u64,
    lsn: u64,
    out: Vec<SourceEvent>,
}

impl Generator {
    fn event(&mut self, table: &str, op: &str, before: Option<&Row>, after: Option<&Row>) -> Value {
        self.lsn += 8;
        json!({
            "before": before,
            "after": after,
            "source": {
                "version": "2.7.3.Final", "connector": "postgresql", "name": "app",
                "ts_ms": 1_767_225_600_000_i64 + self.lsn as i64, "snapshot": "false",
                "db": "app", "schema": "public", "table": table, "lsn": self.lsn
            },
            "op": op,
            "ts_ms": 1_767_225_600_000_i64 + self.lsn as i64
        })
    }

    fn put(&mut self, topic: &str, id: u64, value: Option<Value>) {
        let event = SourceEvent {
            topic: topic.to_owned(),
            key: json!({ "id": id }),
            value,
        };
        if self.rng.random_bool(self.workload.duplicates) {
            self.out.push(event.clone());
        }
        self.out.push(event);
    }

    fn fresh(&mut self, table: &str, id: u64) -> Row {
        let mut row = Row::new();
        row.insert("id".into(), json!(id));
        row.insert(
            "name".into(),
            json!(format!("{table}-{id}-{}", self.rng.random_range(0..1000))),
        );
        if table == "domains" {
            row.insert("user_id".into(), self.user());
        }
        row
    }

    /// A domain's user: one of the users' ids, user 0 more often, or now and then none.
    fn user(&mut self) -> Value {
        if self.rng.random_bool(0.02) {
            Value::Null
        } else if self.rng.random_bool(self.workload.hot_user) {
            json!(0)
        } else {
            json!(self.rng.random_range(0..self.workload.users))
        }
    }

    fn change(&mut self) {
        let (table, topic, space) = if self.rng.random_bool(0.7) {
            ("domains", DOMAINS, self.workload.domains)
        } else {
            ("users", USERS, self.workload.users)
        };
        let id = self.rng.random_range(0..space);
        let Some(old) = self.rows.get(&(table, id)).cloned() else {
            let row = self.fresh(table, id);
            let event = self.event(table, "c", None, Some(&row));
            self.put(topic, id, Some(event));
            self.rows.insert((table, id), row);
            return;
        };
        let roll: f64 = self.rng.random();
        if roll < 0.1 {
            self.delete(table, topic, id, &old);
        } else if roll < 0.13 {
            // The primary key changes: a delete, a tombstone, a create under the new key.
            self.delete(table, topic, id, &old);
            let to = self.next_id;
            self.next_id += 1;
            let mut row = old.clone();
            row.insert("id".into(), json!(to));
            let event = self.event(table, "c", None, Some(&row));
            self.put(topic, to, Some(event));
            self.rows.insert((table, to), row);
        } else {
            let mut row = old.clone();
            if table == "domains" && self.rng.random_bool(self.workload.join_key_updates) {
                row.insert("user_id".into(), self.user());
            } else {
                let name = format!("{table}-{id}-{}", self.rng.random_range(0..1000));
                row.insert("name".into(), json!(name));
            }
            let event = self.event(table, "u", Some(&old), Some(&row));
            self.put(topic, id, Some(event));
            self.rows.insert((table, id), row);
        }
    }

    /// A truncate of `table`, under Debezium Server's null key: its rows go.
    fn truncate(&mut self, table: &'static str, topic: &str) {
        let event = self.event(table, "t", None, None);
        self.out.push(SourceEvent {
            topic: topic.to_owned(),
            key: json!("default"),
            value: Some(event),
        });
        self.rows.retain(|(t, _), _| *t != table);
    }

    fn delete(&mut self, table: &'static str, topic: &str, id: u64, old: &Row) {
        let event = self.event(table, "d", Some(old), None);
        self.put(topic, id, Some(event));
        self.put(topic, id, None);
        self.rows.remove(&(table, id));
    }
}

/// `workload.changes` changes (more events: deletes bring tombstones, duplicates come twice), in
/// the order the database made them.
pub fn generate(workload: &Workload) -> Vec<SourceEvent> {
    let mut generator = Generator {
        rng: StdRng::seed_from_u64(workload.seed),
        next_id: workload.domains.max(workload.users),
        workload: workload.clone(),
        rows: BTreeMap::new(),
        lsn: 0,
        out: Vec::with_capacity(workload.changes * 11 / 10),
    };
    let every = workload.changes / (workload.truncates + 1);
    let mut truncated = 0;
    for n in 1..=workload.changes {
        if truncated < workload.truncates && n % every.max(1) == 0 {
            let (table, topic) = [("domains", DOMAINS), ("users", USERS)][truncated % 2];
            generator.truncate(table, topic);
            truncated += 1;
        } else {
            generator.change();
        }
    }
    generator.out
}
