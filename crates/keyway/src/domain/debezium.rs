//! Debezium change events, as its JSON converter writes them (with the schema envelope or
//! without), decoded into what they say of one row: the operation, the row before and after, and
//! where the change comes from. What a change comes to in the changelog model is
//! `changelog::debezium_changes`'s.
//!
//! Every connector (MySQL, PostgreSQL and the others) writes the same envelope: `op` is `c`
//! (create), `r` (read by a snapshot), `u` (update), `d` (delete), `t` (truncate) or `m` (a
//! PostgreSQL logical decoding message); `before` and `after` are the row or null; `source` names
//! the connector, database, schema and table, and whether a snapshot read the row (a boolean, or a
//! string such as "true", "last" or "incremental", depending on the version). A null value, or an
//! envelope whose payload is null, is a tombstone: it follows a delete so that Kafka's log
//! compaction drops the key, and changes nothing. A primary-key change arrives as a delete of the
//! old key, a tombstone and a create of the new one.
//!
//! What each connector puts in `before` differs: PostgreSQL with REPLICA IDENTITY DEFAULT gives
//! the key columns only, or null; the changelog completes it from the stored row, never guesses it.
//!
//! On Kinesis, Debezium Server's sink puts each event on the stream its destination (the topic)
//! names, with the record key as the partition key (the key's JSON, which `decode_key` reads) and
//! the value as the data: a tombstone is an empty record (`decode_record`).

use serde_json::{Map, Value};

use super::InvalidInput;

/// A row: column name to value, as the JSON converter writes it (numbers, strings, nested values;
/// decimals and times in the encoding the connector was configured with).
pub type Row = Map<String, Value>;

/// A change event's `op`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// A row inserted (`c`).
    Create,
    /// A row read by a snapshot: an insert, for whoever starts from it.
    Read,
    /// A row changed (`u`).
    Update,
    /// A row deleted (`d`).
    Delete,
    /// A table truncated (`t`): all its rows removed, none of them named.
    Truncate,
    /// A logical decoding message (PostgreSQL's `pg_logical_emit_message`): no row changes.
    Message,
}

impl Op {
    fn parse(code: &str) -> Option<Self> {
        Some(match code {
            "c" => Op::Create,
            "r" => Op::Read,
            "u" => Op::Update,
            "d" => Op::Delete,
            "t" => Op::Truncate,
            "m" => Op::Message,
            _ => return None,
        })
    }

    /// The code Debezium writes.
    pub fn code(self) -> &'static str {
        match self {
            Op::Create => "c",
            Op::Read => "r",
            Op::Update => "u",
            Op::Delete => "d",
            Op::Truncate => "t",
            Op::Message => "m",
        }
    }
}

/// Where a change comes from (`source`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Source {
    /// `mysql`, `postgresql` ...
    pub connector: Option<String>,
    /// The database the table is in.
    pub db: Option<String>,
    /// PostgreSQL's schema (MySQL has none).
    pub schema: Option<String>,
    /// The table the row belongs to.
    pub table: Option<String>,
    /// A snapshot read the row: `snapshot` is true, or a string other than "false".
    pub snapshot: bool,
    /// Where the change stands in the source database's log, when the event says.
    pub position: Option<Position>,
}

/// Where a change stands in its database's log: what orders a truncate against the changes of
/// rows, which travel apart from it. PostgreSQL's `lsn`; Oracle's `scn` (a log position too);
/// MySQL's binlog `file`, `pos` and `row`; for other connectors, the time the database made the
/// change (`ts_ms`), which orders changes a millisecond apart only: a change in a truncate's own
/// millisecond cannot be told before or after it, and is taken as after it (`Stored::truncated_by`
/// keeps it). Positions of one connector compare; a snapshot's reads share the position the
/// snapshot started at.
#[derive(
    Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Position {
    /// PostgreSQL's log sequence number (`lsn`), or Oracle's system change number (`scn`).
    Lsn(u64),
    /// A MySQL binlog position.
    Binlog {
        /// The binlog file's name.
        file: String,
        /// The event's byte offset in the file.
        pos: u64,
        /// The row within the event (one event can change several rows); 0 when not given.
        row: u64,
    },
    /// When the database made the change (`ts_ms`), in epoch milliseconds.
    Millis(i64),
}

impl Position {
    /// The position a `source` block gives, if any.
    fn of(source: &Map<String, Value>) -> Option<Self> {
        let number = |name: &str| source.get(name).and_then(Value::as_u64);
        if let Some(lsn) = number("lsn") {
            return Some(Self::Lsn(lsn));
        }
        // Oracle writes its system change number as text.
        let scn = source.get("scn").and_then(|scn| match scn {
            Value::String(text) => text.parse().ok(),
            other => other.as_u64(),
        });
        if let Some(scn) = scn {
            return Some(Self::Lsn(scn));
        }
        let file = source
            .get("file")
            .and_then(Value::as_str)
            .filter(|f| !f.is_empty());
        if let (Some(file), Some(pos)) = (file, number("pos")) {
            return Some(Self::Binlog {
                file: file.to_owned(),
                pos,
                row: number("row").unwrap_or(0),
            });
        }
        source
            .get("ts_ms")
            .and_then(Value::as_i64)
            .map(Self::Millis)
    }
}

/// One change event.
#[derive(Clone, Debug, PartialEq)]
pub struct RowEvent {
    /// What happened to the row.
    pub op: Op,
    /// The row before the change, when the event carries it (whole or in part).
    pub before: Option<Row>,
    /// The row after the change; `None` for a delete, a truncate or a message.
    pub after: Option<Row>,
    /// Empty when the event has no source block.
    pub source: Source,
    /// When the connector processed the change.
    pub ts_ms: Option<i64>,
}

impl RowEvent {
    /// An event of `op` with its rows, from no source in particular.
    pub fn new(op: Op, before: Option<Row>, after: Option<Row>) -> Self {
        Self {
            op,
            before,
            after,
            source: Source::default(),
            ts_ms: None,
        }
    }
}

/// A change event's value.
#[derive(Clone, Debug, PartialEq)]
// Nearly every event is a change: boxing it would cost each one an allocation to save bytes on
// the rare tombstone.
#[allow(clippy::large_enum_variant)]
pub enum DebeziumEvent {
    /// A change event.
    Change(RowEvent),
    /// A null value: Kafka's log compaction drops the key; nothing changes.
    Tombstone,
}

/// Decodes a change event's value. Anything malformed is refused naming its place (`payload.op`
/// in an envelope, `op` without one) and the problem.
pub fn decode(value: &Value) -> Result<DebeziumEvent, InvalidInput> {
    let (payload, prefix) = match value {
        Value::Null => return Ok(DebeziumEvent::Tombstone),
        Value::Object(object) if is_envelope(object) => (&object["payload"], "payload."),
        Value::Object(_) => (value, ""),
        _ => {
            return Err(InvalidInput::new(
                "value",
                "expected a Debezium change event (a JSON object), or null (a tombstone)",
            ))
        }
    };
    let payload = match payload {
        Value::Null => return Ok(DebeziumEvent::Tombstone),
        Value::Object(payload) => payload,
        _ => return Err(InvalidInput::new("payload", "expected an object, or null")),
    };
    let field = |name: &str| format!("{prefix}{name}");
    let op = payload
        .get("op")
        .and_then(Value::as_str)
        .and_then(Op::parse)
        .ok_or_else(|| {
            let found = payload
                .get("op")
                .map_or("missing".to_owned(), |op| format!("{op}"));
            InvalidInput::new(
                field("op"),
                format!("{found}: not one of c, r, u, d, t and m"),
            )
        })?;
    let row = |name: &str| match payload.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(row)) => Ok(Some(row.clone())),
        Some(_) => Err(InvalidInput::new(
            field(name),
            "expected the row as an object, or null",
        )),
    };
    let (before, after) = (row("before")?, row("after")?);
    if after.is_none() && matches!(op, Op::Create | Op::Read | Op::Update) {
        return Err(InvalidInput::new(
            field("after"),
            format!(
                "missing: an event of op {:?} carries the row as it became",
                op.code()
            ),
        ));
    }
    Ok(DebeziumEvent::Change(RowEvent {
        op,
        before,
        after,
        source: source(payload.get("source"), &field("source"))?,
        ts_ms: payload.get("ts_ms").and_then(Value::as_i64),
    }))
}

/// Decodes a Kinesis record's data as Debezium Server writes it: an empty record is a tombstone.
pub fn decode_record(data: &[u8]) -> Result<DebeziumEvent, InvalidInput> {
    if data.is_empty() {
        return Ok(DebeziumEvent::Tombstone);
    }
    let value: Value = serde_json::from_slice(data)
        .map_err(|e| InvalidInput::new("data", format!("not JSON: {e}")))?;
    decode(&value)
}

/// The schema envelope (`schemas.enable=true`): `schema` and `payload` side by side.
fn is_envelope(object: &Map<String, Value>) -> bool {
    object.contains_key("payload") && (object.contains_key("schema") || object.len() == 1)
}

fn source(value: Option<&Value>, field: &str) -> Result<Source, InvalidInput> {
    let source = match value {
        None | Some(Value::Null) => return Ok(Source::default()),
        Some(Value::Object(source)) => source,
        Some(_) => return Err(InvalidInput::new(field, "expected an object")),
    };
    let text = |name: &str| source.get(name).and_then(Value::as_str).map(str::to_owned);
    let snapshot = match source.get("snapshot") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        // "true", "first", "last", "first_in_data_collection", "incremental" ... or "false".
        Some(Value::String(s)) => s != "false",
        Some(_) => {
            return Err(InvalidInput::new(
                format!("{field}.snapshot"),
                "expected a boolean or a string",
            ))
        }
    };
    Ok(Source {
        connector: text("connector"),
        db: text("db"),
        schema: text("schema"),
        table: text("table"),
        snapshot,
        position: Position::of(source),
    })
}

/// A record key as Debezium writes it (the primary key's columns), with or without the schema
/// envelope: `{"id": 1004}`.
pub fn decode_key(value: &Value) -> Result<Row, InvalidInput> {
    let key = match value {
        Value::Object(object) if is_envelope(object) => &object["payload"],
        other => other,
    };
    match key {
        Value::Object(key) => Ok(key.clone()),
        _ => Err(InvalidInput::new(
            "key",
            "expected the primary key's columns as an object",
        )),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn change(value: Value) -> RowEvent {
        match decode(&value).unwrap() {
            DebeziumEvent::Change(event) => event,
            DebeziumEvent::Tombstone => panic!("a tombstone: {value}"),
        }
    }

    fn row(value: Value) -> Row {
        value.as_object().unwrap().clone()
    }

    #[test]
    fn an_event_with_the_schema_envelope_decodes_as_its_payload_does() {
        let payload = json!({
            "before": null,
            "after": {"id": 1004, "email": "annek@noanswer.org"},
            "source": {"connector": "mysql", "db": "inventory", "table": "customers", "snapshot": true},
            "op": "r",
            "ts_ms": 1486500577691_i64
        });
        let enveloped = json!({"schema": {"type": "struct", "fields": []}, "payload": payload});
        assert_eq!(change(enveloped), change(payload.clone()));
        let event = change(payload);
        assert_eq!(event.op, Op::Read);
        assert_eq!(
            event.after,
            Some(row(json!({"id": 1004, "email": "annek@noanswer.org"})))
        );
        assert_eq!(
            event.source,
            Source {
                connector: Some("mysql".into()),
                db: Some("inventory".into()),
                schema: None,
                table: Some("customers".into()),
                snapshot: true,
                position: None,
            }
        );
        assert_eq!(event.ts_ms, Some(1486500577691));
    }

    #[test]
    fn a_change_stands_at_its_lsn_its_binlog_place_or_else_its_source_time() {
        let at = |source: Value| {
            change(json!({"op": "c", "after": {"id": 1}, "source": source}))
                .source
                .position
        };
        assert_eq!(
            at(json!({"connector": "postgresql", "lsn": 34078720, "ts_ms": 5})),
            Some(Position::Lsn(34078720))
        );
        let binlog = |file: &str, pos: u64, row: u64| Position::Binlog {
            file: file.into(),
            pos,
            row,
        };
        assert_eq!(
            at(json!({"file": "mysql-bin.000003", "pos": 154, "row": 2})),
            Some(binlog("mysql-bin.000003", 154, 2))
        );
        assert!(binlog("mysql-bin.000003", 900, 0) < binlog("mysql-bin.000004", 4, 0));
        assert!(binlog("mysql-bin.000003", 154, 0) < binlog("mysql-bin.000003", 154, 1));
        assert_eq!(
            at(json!({"ts_ms": 1486500577691_i64})),
            Some(Position::Millis(1486500577691))
        );
        assert_eq!(at(json!({"connector": "mysql"})), None);
        assert_eq!(
            at(json!({"connector": "oracle", "scn": "1513734", "ts_ms": 5})),
            Some(Position::Lsn(1513734))
        );
    }

    #[test]
    fn a_null_value_or_payload_is_a_tombstone() {
        assert_eq!(decode(&Value::Null).unwrap(), DebeziumEvent::Tombstone);
        assert_eq!(
            decode(&json!({"schema": null, "payload": null})).unwrap(),
            DebeziumEvent::Tombstone
        );
    }

    #[test]
    fn snapshot_is_read_as_a_boolean_or_a_string() {
        let with = |snapshot: Value| {
            change(json!({"op": "r", "after": {"id": 1}, "source": {"snapshot": snapshot}}))
                .source
                .snapshot
        };
        assert!(with(json!(true)));
        assert!(with(json!("true")));
        assert!(with(json!("last")));
        assert!(with(json!("incremental")));
        assert!(!with(json!(false)));
        assert!(!with(json!("false")));
        let e =
            decode(&json!({"op": "r", "after": {"id": 1}, "source": {"snapshot": 1}})).unwrap_err();
        assert_eq!(e.field, "source.snapshot");
    }

    #[test]
    fn truncates_and_messages_carry_no_row() {
        for (code, op) in [("t", Op::Truncate), ("m", Op::Message)] {
            let event = change(json!({"op": code, "source": {"table": "customers"}}));
            assert_eq!((event.op, event.before, event.after), (op, None, None));
        }
    }

    #[test]
    fn a_delete_may_come_without_its_row_but_a_create_or_update_may_not() {
        let event = change(json!({"op": "d", "before": null, "after": null}));
        assert_eq!((event.op, event.before), (Op::Delete, None));
        for code in ["c", "r", "u"] {
            let e = decode(&json!({"schema": {}, "payload": {"op": code, "before": {"id": 1}}}))
                .unwrap_err();
            assert_eq!(e.field, "payload.after", "{code}");
            assert!(e.problem.contains("missing"), "{e}");
        }
    }

    #[test]
    fn malformed_events_are_refused_naming_the_place() {
        let cases = [
            (json!([1]), "value"),
            (json!({"payload": 5}), "payload"),
            (json!({"after": {"id": 1}}), "op"),
            (json!({"op": "x", "after": {"id": 1}}), "op"),
            (
                json!({"schema": {}, "payload": {"op": "c", "after": [1]}}),
                "payload.after",
            ),
            (json!({"op": "d", "before": "id=1"}), "before"),
            (
                json!({"op": "c", "after": {"id": 1}, "source": "mysql"}),
                "source",
            ),
        ];
        for (value, field) in cases {
            assert_eq!(decode(&value).unwrap_err().field, field, "{value}");
        }
    }

    #[test]
    fn a_kinesis_record_is_the_events_json_and_an_empty_one_is_a_tombstone() {
        assert_eq!(decode_record(b"").unwrap(), DebeziumEvent::Tombstone);
        let data = br#"{"op": "c", "after": {"id": 1}}"#;
        assert_eq!(change(json!({"op": "c", "after": {"id": 1}})), {
            let DebeziumEvent::Change(event) = decode_record(data).unwrap() else {
                panic!("a change")
            };
            event
        });
        let e = decode_record(b"{\"op\": ").unwrap_err();
        assert_eq!(e.field, "data");
    }

    #[test]
    fn a_key_decodes_with_or_without_its_schema() {
        let key = row(json!({"id": 1004}));
        assert_eq!(decode_key(&json!({"id": 1004})).unwrap(), key);
        assert_eq!(
            decode_key(&json!({"schema": {"type": "struct"}, "payload": {"id": 1004}})).unwrap(),
            key
        );
        assert_eq!(decode_key(&json!("1004")).unwrap_err().field, "key");
    }
}
