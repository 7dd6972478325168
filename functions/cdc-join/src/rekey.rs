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
//!
//! A source whose every update and delete carries the row before it whole (`BeforeImages::
//! Always`: a DynamoDB stream of new and old images, PostgreSQL's REPLICA IDENTITY FULL, MySQL's
//! full row images) needs no stored row: the re-key then keeps no state at all, and a change
//! costs no read and no write of it. It refuses (dead-letters) a change whose before image is
//! missing or partial, and truncates, which remove rows that only stored rows name. A change sent
//! again (a retry, a source replaying from an older position) is re-keyed again: the join applies
//! its steps over the version it holds, as it applies any later step, and rewrites the row's
//! joined rows; a replay of a change with every change after it ends as the first time did.
//! The truncate sweep (`truncate`) writes rows too, but only removes a row from before its
//! table's truncate, which the re-key retracts and drops itself on the row's next change, with
//! the same retraction: the join ends the same whichever of the two gets there first.

use std::collections::BTreeMap;

use keyway::domain::changelog::{debezium_changes, dynamodb_row_event};
use keyway::domain::debezium::{
    decode_key, decode_record, DebeziumEvent, Op, Position, Row, RowEvent,
};
use keyway::domain::item::item_to_plain_json;
use keyway::domain::number::Number;
use keyway::domain::{Change, Payload, RowChange, SourceRecord};
use keyway::operator::{BroadcastState, SinkDescriptor, StateDescriptor, BROADCAST_KEY};
use keyway::{Ctx, InvalidInput, KeyedOperator, ProcessError, Sink, ValueState};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::join::Stamp;
use crate::spec::{JoinKey, JoinSpec, Side};

/// The operator's name: part of its state keys and output ids.
pub const NAME: &str = "cdc-rekey";

/// The row as last stored, with where its change came from.
pub const ROW: ValueState<Stored> = ValueState::with_shape(
    "row",
    "Stored { row: JSON object of a source row's columns, at: Option<Position { Lsn(u64) | \
     Binlog { file: String, pos: u64, row: u64 } | Millis(i64) }>, seq: String }",
);

/// Each table's last truncate, by the table's name in the join: where it stands in the source's
/// log. Written by the truncate, read by every batch.
pub const TRUNCATED: BroadcastState<BTreeMap<String, Position>> = BroadcastState::with_shape(
    "truncated",
    "BTreeMap<String, Position { Lsn(u64) | Binlog { file: String, pos: u64, row: u64 } | Millis(i64) }>",
);

/// A source row as the re-key keeps it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stored {
    /// The columns: a JSON object, which no type describes.
    pub row: Row,
    /// The position of the change that made it in its source's log (a DynamoDB table's changes
    /// have none, and no truncate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<Position>,
    /// The sequence number of that change: its insert's stamp.
    pub seq: String,
}

impl Stored {
    /// Whether a truncate at `fence` removed this row: it was changed before, or its change said
    /// nothing of where it stands.
    pub fn truncated_by(&self, fence: Option<&Position>) -> bool {
        fence.is_some_and(|fence| self.at.as_ref().is_none_or(|at| at < fence))
    }
}

/// Decomposed changes, partitioned by join key.
pub const CHANGELOG: Sink<Step> = Sink::new("changelog");

/// One step of a source row's changelog, as the join reads it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// The join's group: the join key as JSON text, or for a row without one, a group of its own.
    pub group: String,
    /// The side of the join the row's table is on.
    pub side: Side,
    /// The row's table, by its name in the join.
    pub table: String,
    /// The row's primary key: a one-column key's value as text (a number in its canonical form), or
    /// else the whole key as a JSON object.
    pub pk: String,
    /// Where the step stands among the steps of its row (`join::Stamp`).
    pub stamp: Stamp,
    /// The delete or insert of the row, with its columns.
    #[serde(flatten)]
    pub change: RowChange<Row>,
}

/// A record as read: a change of a row of a table of the join; a truncate of such a table, which
/// names no row; or a tombstone, which follows a delete for Kafka's compaction, names no table
/// and changes nothing.
#[derive(Clone, Debug)]
pub enum SourceChange {
    /// A change of one row of a table of the join.
    Change {
        /// The table, by its name in the join.
        table: String,
        /// The side of the join the table is on.
        side: Side,
        /// The row's primary key (`primary_key`).
        pk: String,
        /// The change event, with the row's images before and after it.
        event: Box<RowEvent>,
    },
    /// A truncate of a table of the join, which empties the table.
    Truncate {
        /// The table, by its name in the join.
        table: String,
        /// Where the truncate stands in the source's log: the table's rows changed before it go.
        at: Position,
    },
    /// A tombstone: the null value that follows a delete for Kafka's log compaction.
    Tombstone {
        /// The primary key of the deleted row.
        pk: String,
    },
}

/// Whether the source's updates and deletes carry the row before them whole (`BEFORE_IMAGES`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BeforeImages {
    /// Not always (PostgreSQL's REPLICA IDENTITY DEFAULT sends the key columns only): the re-key
    /// stores each row, to retract what a change replaces.
    #[default]
    Sometimes,
    /// Always: the re-key stores nothing and retracts the before image; a change without a whole
    /// one, or a truncate, is dead-lettered.
    Always,
}

impl BeforeImages {
    /// Both, as `BEFORE_IMAGES` names them.
    pub const ALL: [BeforeImages; 2] = [BeforeImages::Sometimes, BeforeImages::Always];

    /// Its value of `BEFORE_IMAGES`.
    pub fn name(self) -> &'static str {
        match self {
            BeforeImages::Sometimes => "sometimes",
            BeforeImages::Always => "always",
        }
    }
}

/// Where a change comes from, which says what its before image holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Images {
    /// A Debezium change of a table: a whole row has every column, a NULL one as `null`.
    Debezium,
    /// A DynamoDB stream's change of an item: its old image is the whole item, whose attributes
    /// vary from item to item (one it lacks is NULL).
    DynamoDb,
}

impl Images {
    /// The fields that name the change's table and its before image.
    fn fields(self) -> (&'static str, &'static str) {
        match self {
            Images::Debezium => ("source.table", "before"),
            Images::DynamoDb => ("eventSourceARN", "dynamodb.OldImage"),
        }
    }

    /// The field of its after image.
    fn after(self) -> &'static str {
        match self {
            Images::Debezium => "after",
            Images::DynamoDb => "dynamodb.NewImage",
        }
    }
}

/// Refuses a key or join column holding a number that is read inexactly: JSON numbers are read
/// as 64-bit integers or doubles, and a double past ±2^53 (an integer past 64 bits among them:
/// an Oracle `NUMBER(38)`, a PostgreSQL `NUMERIC(30)`) stands for many numbers, so that two rows
/// (18446744073709551617 and ...618) would be taken for one row, or one join key.
fn exact_column(
    field: impl FnOnce() -> String,
    column: &str,
    value: Option<&Value>,
) -> Result<(), InvalidInput> {
    match value {
        Some(Value::Number(n)) if Number::of(n).inexact().is_some() => Err(InvalidInput::new(
            field(),
            format!(
                "column {column:?} holds {n}, a number past ±2^53 that is read as a double and \
                 would be taken for its neighbours: a key must be an integer within 64 bits, or \
                 text (Debezium's decimal.handling.mode=string)"
            ),
        )),
        _ => Ok(()),
    }
}

/// The re-key of one join.
#[derive(Clone, Debug)]
pub struct Rekey {
    /// The join whose rows are re-keyed: its columns, kind and filter.
    pub spec: JoinSpec,
    /// A source table's name in the join by the name its changes carry, where the two differ: a
    /// DynamoDB table's changes carry its physical name (`stack-UsersTable-1A2B`).
    pub table_names: BTreeMap<String, String>,
    /// Whether changes carry whole before images, so that no row need be stored.
    pub before_images: BeforeImages,
}

impl Rekey {
    /// The re-key of `spec`, its tables named in their changes as in the join, storing rows.
    pub fn new(spec: JoinSpec) -> Self {
        Self {
            spec,
            table_names: BTreeMap::new(),
            before_images: BeforeImages::Sometimes,
        }
    }

    fn stores_rows(&self) -> bool {
        self.before_images == BeforeImages::Sometimes
    }

    /// A change's table under its name in the join.
    fn joined_name(&self, table: String) -> String {
        self.table_names.get(&table).cloned().unwrap_or(table)
    }

    /// The side of `table`, a table of the join: refused, naming `field`, for another table.
    fn side_of(&self, table: &str, field: &str) -> Result<Side, InvalidInput> {
        self.spec.side(table).ok_or_else(|| {
            InvalidInput::new(
                field,
                format!(
                    "{table:?} is neither side of the join {}",
                    self.spec.describe()
                ),
            )
        })
    }

    /// The change of a row of a table of the join, named as its change names it.
    fn change(
        &self,
        table: String,
        images: Images,
        pk: String,
        event: RowEvent,
    ) -> Result<SourceChange, InvalidInput> {
        let table = self.joined_name(table);
        let side = self.side_of(&table, images.fields().0)?;
        let column = self.spec.column(side);
        for (field, row) in [
            (images.fields().1, &event.before),
            (images.after(), &event.after),
        ] {
            if let Some(row) = row {
                exact_column(|| format!("{field}.{column}"), column, row.get(column))?;
            }
        }
        if !self.stores_rows() {
            self.check_before_image(&table, side, &event, images)?;
        }
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
                // Debezium Server puts it under its null key: which it is does not matter.
                return self.truncate(table_of(record, event), &event.source.position);
            }
        }
        let key: Value = serde_json::from_str(&record.partition_key).map_err(|e| {
            InvalidInput::new(
                "partitionKey",
                format!("expected the record key as JSON: {e}"),
            )
        })?;
        let key = decode_key(&key)?;
        for (column, value) in &key {
            exact_column(|| "partitionKey".to_owned(), column, Some(value))?;
        }
        let pk = primary_key(&key);
        let DebeziumEvent::Change(event) = decoded else {
            return Ok(SourceChange::Tombstone { pk });
        };
        let table = table_of(record, &event);
        self.change(table, Images::Debezium, pk, event)
    }

    /// A truncate of a table of the join, which must say where it stands in the source's log.
    fn truncate(&self, table: String, at: &Option<Position>) -> Result<SourceChange, InvalidInput> {
        let table = self.joined_name(table);
        self.side_of(&table, "source.table")?;
        if !self.stores_rows() {
            return Err(InvalidInput::new(
                "op",
                format!(
                    "a truncate of {table:?} removes rows that only stored rows name, and with \
                     BEFORE_IMAGES=always the re-key stores none (set it to sometimes to take \
                     truncates)"
                ),
            ));
        }
        let at = at.clone().ok_or_else(|| {
            InvalidInput::new(
                "source",
                format!(
                    "a truncate of {table:?} says nothing of where it stands (lsn, scn, file and pos, \
                     or ts_ms): the rows it removes cannot be told from those changed after it"
                ),
            )
        })?;
        Ok(SourceChange::Truncate { table, at })
    }

    /// The delete of `stored`, a row of `table` under `pk` that a truncate removed, as the join
    /// must see it; none when the join never saw the row (the filter kept it out).
    pub fn retraction(&self, side: Side, table: &str, pk: &str, stored: &Stored) -> Option<Step> {
        self.spec.takes_part(table, &stored.row).then(|| Step {
            group: group_of(&self.spec, side, pk, &stored.row),
            side,
            table: table.to_owned(),
            pk: pk.to_owned(),
            stamp: Stamp::truncated(&stored.seq),
            change: RowChange::Delete(stored.row.clone()),
        })
    }

    /// A change of a DynamoDB table from its stream: the item's keys are its primary key.
    fn decode_dynamodb(&self, change: &Change) -> Result<SourceChange, InvalidInput> {
        let table = change.table.clone().ok_or_else(|| {
            InvalidInput::new("eventSourceARN", "missing: the change names no table")
        })?;
        let pk = primary_key(&item_to_plain_json(&change.keys));
        let event = dynamodb_row_event(change)?;
        self.change(table, Images::DynamoDb, pk, event)
    }

    /// Refuses, naming its field, an update or delete of a row of `table` whose before image
    /// the re-key cannot retract from alone: missing, or (a Debezium row, whose columns are
    /// fixed) without a column the row after it has, or for a delete, without the row's join
    /// column or a column the filter reads. A DynamoDB item's old image is whole when present.
    fn check_before_image(
        &self,
        table: &str,
        side: Side,
        event: &RowEvent,
        images: Images,
    ) -> Result<(), InvalidInput> {
        let field = images.fields().1;
        let needed: Vec<&str> = match (&event.op, &event.after, images) {
            (Op::Update | Op::Delete, _, Images::DynamoDb) => Vec::new(),
            (Op::Update, Some(after), Images::Debezium) => {
                after.keys().map(String::as_str).collect()
            }
            (Op::Delete, _, Images::Debezium) => std::iter::once(self.spec.column(side))
                .chain(self.spec.filter.columns_of(table))
                .collect(),
            _ => return Ok(()),
        };
        let problem = match &event.before {
            None => "missing".to_owned(),
            Some(before) => match needed.iter().find(|c| !before.contains_key(**c)) {
                None => return Ok(()),
                Some(column) => format!("without the column {column:?}"),
            },
        };
        Err(InvalidInput::new(
            field,
            format!(
                "{problem}: with BEFORE_IMAGES=always every update and delete must carry the \
                 whole row before it (PostgreSQL: REPLICA IDENTITY FULL; a DynamoDB stream: \
                 NEW_AND_OLD_IMAGES)"
            ),
        ))
    }
}

impl Rekey {
    /// One change of a source row, and the retraction of what a truncate of its table removed:
    /// the row stored before the truncate, retracted first; and the row as this change leaves
    /// it when the change came before the truncate (late, on a shard behind the truncate's),
    /// retracted after its steps. A change is never skipped for a truncate: an attempt that
    /// crashed before its commit may have sent its steps already, when the fence was not yet
    /// known, and the retry's must include them (emit-then-commit, DESIGN §3).
    fn change_row(
        &self,
        ctx: &mut Ctx<'_>,
        table: &str,
        side: Side,
        pk: &str,
        event: &RowEvent,
    ) -> Result<(), ProcessError> {
        let sequence = ctx.record().sequence.as_str().to_owned();
        let fence = ctx
            .broadcast(&TRUNCATED)?
            .and_then(|fenced| fenced.get(table).cloned());
        let mut stored = ctx.value(&ROW)?;
        let mut out = Vec::new();
        if let Some(gone) = stored.get().filter(|s| s.truncated_by(fence.as_ref())) {
            out.extend(self.retraction(side, table, pk, gone));
            stored.clear();
        }
        for change in debezium_changes(event, stored.get().map(|s| &s.row)) {
            match &change {
                RowChange::Delete(_) => stored.clear(),
                RowChange::Insert(row) => stored.set(Stored {
                    row: row.clone(),
                    at: event.source.position.clone(),
                    seq: sequence.clone(),
                }),
            }
            let stamp = Stamp::of(&change, &sequence);
            // The row is stored whether or not it matches the filter: a later delete without a
            // before image retracts what was there. Only matching rows go on (see `filter`).
            out.extend(self.step(table, side, pk, stamp, change));
        }
        // A change that leaves the row as it was (made again after a truncate the re-key has
        // not seen yet, the same as before it) is no step, but moves the row past that truncate.
        if let (Some(kept), Some(at)) = (stored.get(), &event.source.position) {
            if kept.at.as_ref().is_some_and(|was| was < at) {
                let moved = Stored {
                    at: Some(at.clone()),
                    ..kept.clone()
                };
                stored.set(moved);
            }
        }
        if let Some(late) = stored.get().filter(|s| s.truncated_by(fence.as_ref())) {
            out.extend(self.retraction(side, table, pk, late));
            stored.clear();
        }
        for step in out {
            ctx.emit(&CHANGELOG, step.group.clone(), &step)?;
        }
        Ok(())
    }
}

impl Rekey {
    /// The step of `change` to a row of `table` under `pk`, stamped `stamp`; none when the row
    /// does not take part in the join (see `filter`).
    fn step(
        &self,
        table: &str,
        side: Side,
        pk: &str,
        stamp: Stamp,
        change: RowChange<Row>,
    ) -> Option<Step> {
        self.spec.takes_part(table, change.row()).then(|| Step {
            group: group_of(&self.spec, side, pk, change.row()),
            side,
            table: table.to_owned(),
            pk: pk.to_owned(),
            stamp,
            change,
        })
    }

    /// One change of a source row from its images alone (`BeforeImages::Always`): the decoder
    /// refused a change without a whole before image, so no stored row is needed.
    fn change_from_images(
        &self,
        ctx: &mut Ctx<'_>,
        table: &str,
        side: Side,
        pk: &str,
        event: &RowEvent,
    ) -> Result<(), ProcessError> {
        let sequence = ctx.record().sequence.as_str().to_owned();
        for change in debezium_changes(event, None) {
            let stamp = Stamp::of(&change, &sequence);
            if let Some(step) = self.step(table, side, pk, stamp, change) {
                ctx.emit(&CHANGELOG, step.group.clone(), &step)?;
            }
        }
        Ok(())
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

/// A primary key as text: the value of a one-column key as JSON (a number in the text equal
/// numbers share, `keyway::domain::number`), or the whole key as JSON.
pub fn primary_key(key: &Row) -> String {
    match key.values().next() {
        Some(Value::Number(n)) if key.len() == 1 => Number::of(n).canonical(),
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
        if self.stores_rows() {
            vec![ROW.descriptor(), TRUNCATED.descriptor()]
        } else {
            Vec::new()
        }
    }

    fn stateless(&self) -> bool {
        !self.stores_rows()
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
            SourceChange::Truncate { .. } => BROADCAST_KEY.to_owned(),
            SourceChange::Tombstone { pk } => format!("tombstone#{pk}"),
        }
    }

    fn process(&self, ctx: &mut Ctx<'_>, input: SourceChange) -> Result<(), ProcessError> {
        match input {
            SourceChange::Change {
                table,
                side,
                pk,
                event,
            } if self.stores_rows() => self.change_row(ctx, &table, side, &pk, &event),
            SourceChange::Change {
                table,
                side,
                pk,
                event,
            } => self.change_from_images(ctx, &table, side, &pk, &event),
            SourceChange::Truncate { table, at } => {
                let mut fences = ctx.broadcast_mut(&TRUNCATED)?;
                let mut fenced = fences.get().cloned().unwrap_or_default();
                // A replayed or older truncate moves nothing.
                if fenced.get(&table).is_none_or(|last| *last < at) {
                    fenced.insert(table, at);
                    fences.set(fenced);
                }
                Ok(())
            }
            SourceChange::Tombstone { .. } => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn trusting() -> Rekey {
        let spec = JoinSpec::parse("domains.user_id=users.id", crate::spec::JoinKind::LeftOuter)
            .expect("the join");
        Rekey {
            before_images: BeforeImages::Always,
            ..Rekey::new(spec)
        }
    }

    fn row(value: Value) -> Row {
        value.as_object().expect("an object").clone()
    }

    /// The field a change is refused for, if it is.
    fn refused(
        images: Images,
        op: Op,
        before: Option<Value>,
        after: Option<Value>,
    ) -> Option<String> {
        let event = RowEvent::new(op, before.map(row), after.map(row));
        let table = match images {
            Images::Debezium => "domains",
            Images::DynamoDb => "users",
        };
        trusting()
            .change(table.into(), images, "7".into(), event)
            .err()
            .map(|e| e.field)
    }

    #[test]
    fn trusting_before_images_a_dynamodb_items_old_image_is_whole_whatever_attributes_it_lacks() {
        let old = json!({"id": 7});
        let new = json!({"id": 7, "plan": "pro"});
        assert_eq!(
            refused(
                Images::DynamoDb,
                Op::Update,
                Some(old.clone()),
                Some(new.clone())
            ),
            None
        );
        assert_eq!(refused(Images::DynamoDb, Op::Delete, Some(old), None), None);
        let missing = refused(Images::DynamoDb, Op::Delete, None, None);
        assert_eq!(missing.as_deref(), Some("dynamodb.OldImage"));
        // A Debezium row has every column: one missing is a partial image.
        let partial = refused(
            Images::Debezium,
            Op::Update,
            Some(json!({"id": 7})),
            Some(new),
        );
        assert_eq!(partial.as_deref(), Some("before"));
        let no_join_column = refused(Images::Debezium, Op::Delete, Some(json!({"id": 7})), None);
        assert_eq!(no_join_column.as_deref(), Some("before"));
        let whole = json!({"id": 7, "user_id": null});
        assert_eq!(
            refused(Images::Debezium, Op::Delete, Some(whole), None),
            None
        );
    }
}
