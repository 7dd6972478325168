//! `keyway cdc`: Debezium change events through the CDC join's re-key and join on the embedded
//! runtime (`keyway_stack::cdc`). The joined changelog goes to standard output as JSON Lines, the
//! final view to `--view-out`, a summary to standard error; `--check` compares the view with the
//! join of the tables as the input leaves them.
//!
//! Input: files of JSON values, one a line or one after another (pretty-printed, as Debezium's
//! examples are), or `-` for standard input. A value is a Debezium change event (with its schema
//! envelope or without) or a record `{"topic"?, "key"?, "value"}`; without a key, the row's
//! `--key` column is its key; without a topic, the file's name (`dbserver1.inventory.customers
//! .json`) is, whose last part names the table of a change without a source block.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use cdc_join::filter::Filter;
use cdc_join::join::{Joined, JoinedId};
use cdc_join::spec::{JoinKind, JoinSpec, Side};
use keyway::adapters::dynamodb::ITEM_MAX_BYTES;
use keyway::domain::{InvalidInput, RowChange};
use keyway_stack::cdc::{final_tables, interleave, key_of, replay, Outcome, Settings, SourceEvent};
use serde_json::{json, Value};

use crate::error::CliError;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The equi-join, LEFT_TABLE.COLUMN=RIGHT_TABLE.COLUMN (tables as `source.table` names
    /// them, or the topic's last part).
    #[arg(long)]
    pub join: String,
    /// inner, or left (every left row, with null when it has no partner).
    #[arg(long, default_value = "inner", value_parser = ["inner", "left"])]
    pub kind: String,
    /// The rows that take part: conditions on either table's columns joined by AND, values as
    /// JSON (`domains.status = "active" AND users.tier >= 2`).
    #[arg(long)]
    pub filter: Option<String>,
    /// Shards of each topic's stream and of the changelog.
    #[arg(long, default_value_t = 2)]
    pub shards: usize,
    /// Interleaves the rows' changes at random with this seed (each row's stay in order).
    #[arg(long)]
    pub shuffle: Option<u64>,
    /// The column that keys a change given without its record key.
    #[arg(long, default_value = "id")]
    pub key: String,
    /// Where to write the final view, a JSON line {"<left table>": row, "<right table>": row or
    /// null} per joined row.
    #[arg(long)]
    pub view_out: Option<PathBuf>,
    /// Compares the view with the join of the tables as the input leaves them; exits non-zero
    /// on any difference.
    #[arg(long)]
    pub check: bool,
    /// Files of Debezium change events (JSON Lines or JSON values one after another), or
    /// records {"topic", "key", "value"}; `-` for standard input.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
}

pub(crate) fn run(options: Args) -> Result<(), CliError> {
    let kind = match options.kind.as_str() {
        "left" => JoinKind::LeftOuter,
        _ => JoinKind::Inner,
    };
    let spec = JoinSpec::parse(&options.join, kind).map_err(|e| CliError::option("--join", e))?;
    let filter = Filter::parse(options.filter.as_deref().unwrap_or_default())
        .map_err(|e| CliError::option("--filter", e))?;
    let spec = spec
        .with_filter(filter)
        .map_err(|e| CliError::option("--filter", e))?;
    let mut problems = Vec::new();
    let mut events = Vec::new();
    for path in &options.paths {
        events.extend(read_events(path, &options.key, &mut problems)?);
    }
    for problem in &problems {
        eprintln!("keyway cdc: {problem}");
    }
    let ordered = match options.shuffle {
        Some(seed) => interleave(events.clone(), seed),
        None => events.clone(),
    };
    let settings = Settings {
        shards: options.shards.max(1),
        ..Settings::new(spec.clone())
    };
    let started = std::time::Instant::now();
    let outcome = crate::job::runtime_builder(true).block_on(replay(&settings, &ordered))?;
    let took = started.elapsed();
    write_changelog(&spec, &outcome)?;
    if let Some(path) = &options.view_out {
        write_view(&spec, &outcome.view, path)?;
    }
    eprint!("{}", summary(events.len(), &outcome, took));
    if options.check {
        check(&spec, &events, &outcome)?;
    }
    Ok(())
}

/// A joined row as a line: each side under its table's name.
fn joined_line(spec: &JoinSpec, joined: &Joined) -> serde_json::Map<String, Value> {
    let mut line = serde_json::Map::new();
    line.insert(spec.table(Side::Left).to_owned(), json!(joined.left));
    line.insert(spec.table(Side::Right).to_owned(), json!(joined.right));
    line
}

fn write_changelog(spec: &JoinSpec, outcome: &Outcome) -> Result<(), CliError> {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let failed = |e: std::io::Error| CliError::from(format!("standard output: {e}"));
    for stamped in &outcome.joined {
        let (op, joined) = match &stamped.change {
            RowChange::Insert(joined) => ("insert", joined),
            RowChange::Delete(joined) => ("delete", joined),
        };
        let mut line = serde_json::Map::new();
        line.insert("op".into(), json!(op));
        line.extend(joined_line(spec, joined));
        writeln!(out, "{}", Value::Object(line)).map_err(failed)?;
    }
    out.flush().map_err(failed)
}

fn write_view(
    spec: &JoinSpec,
    view: &BTreeMap<JoinedId, Joined>,
    path: &Path,
) -> Result<(), CliError> {
    let failed = |e: std::io::Error| CliError::from(format!("{}: {e}", path.display()));
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).map_err(failed)?);
    for joined in view.values() {
        writeln!(out, "{}", Value::Object(joined_line(spec, joined))).map_err(failed)?;
    }
    out.flush().map_err(failed)
}

/// The view against the join of the tables as `events` leave them: an error naming the rows
/// that differ.
fn check(spec: &JoinSpec, events: &[SourceEvent], outcome: &Outcome) -> Result<(), CliError> {
    let (view, omitted) = (&outcome.view, &outcome.omitted);
    let expected = final_tables(events).join(spec);
    let mut differences = Vec::new();
    for (id, row) in &expected {
        // A pair too large for a view item is kept without its rows; one that fits by far must
        // not be (rows within a few KB of the limit may be either, for the keys and rank beside).
        let rows = |r: &Joined| {
            let json = |row| serde_json::to_string(row).map_or(0, |t| t.len());
            json(&r.left) + r.right.as_ref().map_or(0, json)
        };
        let excused = omitted.contains(id) && rows(row) > ITEM_MAX_BYTES - 4 * 1024;
        if view.get(id) != Some(row) && !excused {
            differences.push(format!("missing or different: {id:?}"));
        }
    }
    let kept = view.keys().chain(omitted.iter());
    for id in kept.filter(|id| !expected.contains_key(*id)) {
        differences.push(format!("not in the join: {id:?}"));
    }
    if differences.is_empty() {
        eprintln!(
            "check: the view equals the join of the final tables ({} rows)",
            expected.len()
        );
        return Ok(());
    }
    for difference in differences.iter().take(10) {
        eprintln!("check: {difference}");
    }
    Err(format!(
        "check: the view differs from the join of the final tables in {} rows",
        differences.len()
    )
    .into())
}

/// The topic a file's records are of when they do not say: its name without the extension.
fn topic_of(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "stdin".into());
    for extension in [".jsonl", ".ndjson", ".json", ".txt"] {
        if let Some(stem) = name.strip_suffix(extension) {
            return stem.to_owned();
        }
    }
    name
}

/// The events of one file, in order. A value that names no row is reported in `problems` and
/// left out; text that is not JSON ends the file's reading with an error.
fn read_events(
    path: &Path,
    key_column: &str,
    problems: &mut Vec<String>,
) -> Result<Vec<SourceEvent>, CliError> {
    let mut text = String::new();
    let read = if path.as_os_str() == "-" {
        std::io::stdin().read_to_string(&mut text)
    } else {
        std::fs::File::open(path).and_then(|mut f| f.read_to_string(&mut text))
    };
    read.map_err(|e| CliError::from(format!("{}: {e}", path.display())))?;
    let topic = topic_of(path);
    let mut events = Vec::new();
    let values = serde_json::Deserializer::from_str(&text).into_iter::<Value>();
    for (i, value) in values.enumerate() {
        let value = value.map_err(|e| CliError::from(format!("{}: {e}", path.display())))?;
        match event_of(value, &topic, key_column) {
            Ok(Some(event)) => events.push(event),
            Ok(None) => {}
            Err(why) => problems.push(format!("{} value {}: {why}", path.display(), i + 1)),
        }
    }
    Ok(events)
}

/// A value read as a record of `topic`: `None` for a tombstone without a key, which names no
/// row and changes nothing.
fn event_of(
    value: Value,
    topic: &str,
    key_column: &str,
) -> Result<Option<SourceEvent>, InvalidInput> {
    let is_record = value
        .as_object()
        .is_some_and(|o| o.contains_key("value") && !o.contains_key("op"));
    let (topic, key, value) = if is_record {
        let topic = value["topic"].as_str().unwrap_or(topic).to_owned();
        let key = value.get("key").cloned().filter(|k| !k.is_null());
        (
            topic,
            key,
            Some(value["value"].clone()).filter(|v| !v.is_null()),
        )
    } else {
        (topic.to_owned(), None, Some(value).filter(|v| !v.is_null()))
    };
    let key = match (key, &value) {
        (Some(key), _) => key,
        (None, Some(value)) => key_of(value, key_column)?,
        (None, None) => return Ok(None),
    };
    Ok(Some(SourceEvent { topic, key, value }))
}

fn summary(read: usize, outcome: &Outcome, took: std::time::Duration) -> String {
    let inserts = outcome
        .joined
        .iter()
        .filter(|s| s.change.is_insert())
        .count();
    let mut text = format!(
        "changes {read}  joined changes {} ({inserts} inserts, {} deletes)  view rows {}  ({:.0} changes/s)\n",
        outcome.joined.len(),
        outcome.joined.len() - inserts,
        outcome.view.len(),
        read as f64 / took.as_secs_f64().max(1e-9),
    );
    if !outcome.omitted.is_empty() {
        text += &format!(
            "view pairs kept without their rows (too large for an item): {}\n",
            outcome.omitted.len()
        );
    }
    text.push_str(&crate::filter::dead_letter_summary(&outcome.dead_letters));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_without_a_key_is_keyed_by_its_rows_key_column_and_a_bare_tombstone_is_skipped() {
        let change = json!({"op": "c", "before": null, "after": {"id": 7, "name": "a"},
                            "source": {"table": "users"}});
        let event = event_of(change.clone(), "app.public.users", "id")
            .unwrap()
            .unwrap();
        assert_eq!(
            (event.topic.as_str(), event.key),
            ("app.public.users", json!({"id": 7}))
        );
        let record = json!({"topic": "t", "key": {"id": 8}, "value": null});
        let tombstone = event_of(record, "file", "id").unwrap().unwrap();
        assert_eq!(
            (tombstone.topic.as_str(), tombstone.value),
            ("t", None::<Value>)
        );
        assert_eq!(event_of(Value::Null, "file", "id").unwrap(), None);
        let err = event_of(change, "file", "uuid").unwrap_err();
        assert!(err.to_string().starts_with("uuid: missing"), "{err}");
        assert_eq!(
            topic_of(Path::new("dir/app.public.users.jsonl")),
            "app.public.users"
        );
    }
}
