//! The re-key: Debezium change events, partitioned by primary key (Debezium Server's Kinesis sink
//! puts a record under its record key), and a DynamoDB table's changes from its stream (one
//! item's in order), decomposed into deletes and inserts and re-published to the changelog
//! stream partitioned by join key, the delete before the insert.
//!
//! Per source row (`table#pk`) it keeps the row as last stored: what a delete retracts when its
//! event has no whole before image (PostgreSQL's REPLICA IDENTITY DEFAULT), never guessed. Each
//! step is stamped with the position of the change it came from (`join::Stamp`): one row's changes
//! arrive in order under its primary key, so its steps' stamps grow, and the join and its view
//! keep a row's order even when its join key moves between shards. A deleted row leaves no state.
//! The join's filter applies here, to each step alone (see `filter`): the join never sees a row
//! that does not match.
//!
//! One writer per key (one input stream) and outputs computed from the record and the stored
//! row alone: emit-then-commit (DESIGN §3); a retry re-emits the same steps under the same ids.

use std::collections::BTreeMap;

use keyway::domain::changelog::{debezium_changes, dynamodb_row_event};
use keyway::domain::debezium::{decode_key, decode_record, DebeziumEvent, Op, Row, RowEvent};
use keyway::domain::item::item_to_plain_json;
use keyway::domain::{Change, Payload, RowChange, SourceRecord};
use keyway::operator::{SinkDescriptor, StateDescriptor};
use keyway::{Ctx, InvalidInput, KeyedOperator, ProcessError, Sink, ValueState};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::join::Stamp;
use crate::spec::{JoinKey, JoinSpec, Side};

/// The operator's name: part of its state keys and output ids.
pub const NAME: &str = "cdc-rekey";

/// The row as last stored: a JSON object of the source row's columns, which no type describes.
pub const ROW: ValueState<Row> =
    ValueState::with_shape("row", "Row: JSON object of a source row's columns");

/// Decomposed changes, partitioned by join key.
pub const CHANGELOG: Sink<Step> = Sink::new("changelog");

/// One step of a source row's changelog, as the join reads it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// The join's group: the join key as JSON text, or for a row without one, a group of its own.
    pub group: String,
    pub side: Side,
    pub table: String,
    pub pk: String,
    pub stamp: Stamp,
    #[serde(flatten)]
    pub change: RowChange<Row>,
}

/// A record as read: a change of a row of a table of the join, or a tombstone, which follows a
/// delete for Kafka's compaction, names no table and changes nothing.
#[derive(Clone, Debug)]
pub enum SourceChange {
    Change {
        table: String,
        side: Side,
        pk: String,
        event: Box<RowEvent>,
    },
    Tombstone {
        pk: String,
    },
}

/// The re-key of one join.
#[derive(Clone, Debug)]
pub struct Rekey {
    pub spec: JoinSpec,
    /// A source table's name in the join by the name its changes carry, where the two differ: a
    /// DynamoDB table's changes carry its physical name (`stack-UsersTable-1A2B`).
    pub table_names: BTreeMap<String, String>,
}

impl Rekey {
    /// The re-key of `spec`, its tables named in their changes as in the join.
    pub fn new(spec: JoinSpec) -> Self {
        Self {
            spec,
            table_names: BTreeMap::new(),
        }
    }

    /// A change's table under its name in the join.
    fn joined_name(&self, table: String) -> String {
        self.table_names.get(&table).cloned().unwrap_or(table)
    }

    /// The change of a row of a table of the join: refused, naming `field`, for another table.
    fn change(
        &self,
        table: String,
        field: &str,
        pk: String,
        event: RowEvent,
    ) -> Result<SourceChange, InvalidInput> {
        let table = self.joined_name(table);
        let side = self.spec.side(&table).ok_or_else(|| {
            InvalidInput::new(
                field,
                format!(
                    "{table:?} is neither side of the join {}",
                    self.spec.describe()
                ),
            )
        })?;
        Ok(SourceChange::Change {
            table,
            side,
            pk,
            event: Box::new(event),
        })
    }

    /// A Debezium change event on Kinesis, under its record key.
    fn decode_debezium(
        &self,
        record: &SourceRecord,
        data: &[u8],
    ) -> Result<SourceChange, InvalidInput> {
        let decoded = decode_record(data)?;
        if let DebeziumEvent::Change(event) = &decoded {
            if event.op == Op::Truncate {
                // Refused whole rather than applied to some rows: see the README's CDC section.
                return Err(InvalidInput::new(
                    "op",
                    format!(
                        "a truncate of {:?} is not applied by the join; its rows stay until deleted",
                        table_of(record, event)
                    ),
                ));
            }
        }
        let key: Value = serde_json::from_str(&record.partition_key).map_err(|e| {
            InvalidInput::new(
                "partitionKey",
                format!("expected the record key as JSON: {e}"),
            )
        })?;
        let pk = primary_key(&decode_key(&key)?);
        let DebeziumEvent::Change(event) = decoded else {
            return Ok(SourceChange::Tombstone { pk });
        };
        let table = table_of(record, &event);
        self.change(table, "source.table", pk, event)
    }

    /// A change of a DynamoDB table from its stream: the item's keys are its primary key.
    fn decode_dynamodb(&self, change: &Change) -> Result<SourceChange, InvalidInput> {
        let table = change.table.clone().ok_or_else(|| {
            InvalidInput::new("eventSourceARN", "missing: the change names no table")
        })?;
        let pk = primary_key(&item_to_plain_json(&change.keys));
        let event = dynamodb_row_event(change)?;
        self.change(table, "eventSourceARN", pk, event)
    }
}

/// The group a row of `table` (on `side`) with primary key `pk` joins in: its join key, or for a
/// row without one (NULL joins nothing) a group of its own.
pub fn group_of(spec: &JoinSpec, side: Side, pk: &str, row: &Row) -> String {
    match spec.join_key(side, row) {
        JoinKey::Value(text) => text,
        JoinKey::Null => format!("null#{}#{pk}", spec.table(side)),
    }
}

/// A primary key as text: the value of a one-column key as JSON, or the whole key as JSON.
pub fn primary_key(key: &Row) -> String {
    match key.values().next() {
        Some(value) if key.len() == 1 => value.to_string(),
        _ => Value::Object(key.clone()).to_string(),
    }
}

/// The table of a change: its `source.table`, or else the stream's name, which Debezium Server
/// makes the topic (`prefix.schema.table`): its last part.
fn table_of(record: &SourceRecord, event: &RowEvent) -> String {
    match &event.source.table {
        Some(table) => table.clone(),
        None => {
            let stream = record.stream.rsplit('/').next().unwrap_or(&record.stream);
            stream.rsplit('.').next().unwrap_or(stream).to_owned()
        }
    }
}

impl KeyedOperator for Rekey {
    type Input = SourceChange;

    fn name(&self) -> &str {
        NAME
    }

    fn states(&self) -> Vec<StateDescriptor> {
        vec![ROW.descriptor()]
    }

    fn sinks(&self) -> Vec<SinkDescriptor> {
        vec![CHANGELOG.descriptor()]
    }

    fn decode(&self, record: &SourceRecord) -> Result<SourceChange, InvalidInput> {
        match &record.payload {
            Payload::Bytes(data) => self.decode_debezium(record, data),
            Payload::Change(change) => self.decode_dynamodb(change),
            Payload::Timer { .. } => Err(InvalidInput::new(
                "record",
                "expected a Debezium change on Kinesis or a DynamoDB Streams change",
            )),
        }
    }

    fn key(&self, input: &SourceChange) -> String {
        match input {
            SourceChange::Change { table, pk, .. } => format!("{table}#{pk}"),
            SourceChange::Tombstone { pk } => format!("tombstone#{pk}"),
        }
    }

    fn process(&self, ctx: &mut Ctx<'_>, input: SourceChange) -> Result<(), ProcessError> {
        let SourceChange::Change {
            table,
            side,
            pk,
            event,
        } = input
        else {
            return Ok(());
        };
        let sequence = ctx.record().sequence.as_str().to_owned();
        let mut stored = ctx.value(&ROW)?;
        let steps = debezium_changes(&event, stored.get());
        let mut out = Vec::with_capacity(steps.len());
        for change in steps {
            let stamp = match &change {
                RowChange::Delete(_) => {
                    stored.clear();
                    Stamp::delete(&sequence)
                }
                RowChange::Insert(row) => {
                    stored.set(row.clone());
                    Stamp::insert(&sequence)
                }
            };
            // The row is stored whether or not it matches the filter: a later delete without a
            // before image retracts what was there. Only matching rows go on (see `filter`).
            if !self.spec.takes_part(&table, change.row()) {
                continue;
            }
            out.push(Step {
                group: group_of(&self.spec, side, &pk, change.row()),
                side,
                table: table.clone(),
                pk: pk.clone(),
                stamp,
                change,
            });
        }
        for step in out {
            ctx.emit(&CHANGELOG, step.group.clone(), &step)?;
        }
        Ok(())
    }
}
