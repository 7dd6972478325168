//! `keyway local`: a user's own SAM or CDK-synthesized stack on the embedded runtime. The
//! template is read at run time; its streams, tables, queues and event source mappings run in
//! memory with Lambda's stream-trigger semantics; each function runs in-process when it is one of
//! keyway's (by its logical id in keyway's template.yaml) or as its bootstrap process behind the
//! Lambda Runtime API (`--function ID=BOOTSTRAP`). The lines of each `--put` file go onto their
//! stream (or into their table), the stack runs until every mapping is idle, and what each
//! mapping did is printed; `--out` keeps every queue's messages, table's items and stream's
//! records as JSON Lines. `keyway bootstrap ID` (bootstrap.rs) is the other side.

use std::collections::BTreeMap;
use std::io::{BufRead as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use keyway::domain::item::{item_from_dynamodb_json, item_to_dynamodb_json};
use keyway::domain::InvalidInput;
use keyway_local::{external, AwsApi, Factory, FaultPlan, LocalRuntime, LocalServices};
use keyway_stack as stack;
use serde_json::{json, Value};

use crate::error::CliError;

/// Where the virtual clock starts: 2026-01-01T00:00:00Z.
const EPOCH: i64 = 1_767_225_600_000;
/// How much virtual time a run may take before it is called unfinished.
const RUN_LIMIT: Duration = Duration::from_secs(7 * 24 * 3600);

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// A SAM template or a CDK-synthesized CloudFormation template (YAML or JSON).
    #[arg(long)]
    pub template: PathBuf,
    /// A template parameter's value (repeatable).
    #[arg(long = "parameter", value_name = "NAME=VALUE")]
    pub parameters: Vec<String>,
    /// Runs the function with this logical id as this bootstrap executable (repeatable).
    #[arg(long = "function", value_name = "ID=BOOTSTRAP")]
    pub functions: Vec<String>,
    /// Puts each line of a JSON Lines file on a stream, or, as a DynamoDB JSON item, into a
    /// table; by logical id (repeatable, in order).
    #[arg(long = "put", value_name = "ID=FILE")]
    pub puts: Vec<String>,
    /// UpdateShardCount on a stream halfway through the first file put on it: the first half
    /// of its lines go to the template's shards, the rest to COUNT new ones, and its mappings
    /// read the closed shards before their children (repeatable).
    #[arg(long = "reshard", value_name = "STREAM=COUNT")]
    pub reshards: Vec<String>,
    /// The JSON pointer of each line's partition key on a stream (its line number without one).
    #[arg(long)]
    pub partition_key: Option<String>,
    /// Probability of each injected fault.
    #[arg(long, default_value_t = 0.0)]
    pub faults: f64,
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Writes queues/ID.jsonl, tables/ID.jsonl, streams/ID.jsonl and logs/FUNCTION.log here.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

pub(crate) fn run(options: Args) -> Result<(), CliError> {
    // Virtual time, with the IO the runtime APIs and the bootstrap processes need.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(local(options))
}

async fn local(options: Args) -> Result<(), CliError> {
    let text =
        std::fs::read_to_string(&options.template).map_err(CliError::file(&options.template))?;
    let parameters: BTreeMap<String, String> = pairs("--parameter", &options.parameters)?
        .into_iter()
        .collect();
    let services = LocalServices::new(EPOCH, FaultPlan::all(options.faults, options.seed));
    let api = AwsApi::start(services.clone())
        .await
        .map_err(|e| format!("cannot serve the AWS APIs: {e}"))?;
    let logs = match &options.out {
        Some(out) => Some(created(&out.join("logs"))?),
        None => None,
    };
    let factories = factories(&options, &text, &parameters, &api, logs)?;
    let mut runtime = LocalRuntime::from_template_with(&text, &parameters, services.clone(), &factories)
        .map_err(|e| match e {
            keyway_local::LocalError::Unregistered { function } => format!(
                "Resources/{function}: not one of keyway's functions: run it as its bootstrap with --function {function}=PATH"
            ),
            other => other.to_string(),
        })?;
    let mut reshards = reshards(&options)?;
    let mut put = 0;
    for (id, file) in pairs("--put", &options.puts)? {
        put += put_file(
            &runtime,
            &services,
            &id,
            Path::new(&file),
            options.partition_key.as_deref(),
            reshards.remove(&id),
        )?;
    }
    if let Some(id) = reshards.keys().next() {
        return Err(CliError::option(
            format!("--reshard {id}"),
            "no --put file for it",
        ));
    }
    let report = runtime.run_until_idle(RUN_LIMIT).await?;
    print_summary(&options, &runtime, &services, &report, put);
    if let Some(out) = &options.out {
        write_out(&runtime, &services, out)?;
        println!("\nqueues, tables and streams written to {}", out.display());
    }
    drop(api);
    Ok(())
}

/// Each `--reshard STREAM=COUNT`'s shard count, by stream.
fn reshards(options: &Args) -> Result<BTreeMap<String, usize>, CliError> {
    pairs("--reshard", &options.reshards)?
        .into_iter()
        .map(|(id, count)| match count.parse::<usize>() {
            Ok(n) if n > 0 => Ok((id, n)),
            _ => Err(CliError::option(
                format!("--reshard {id}={count}"),
                "the count is not a number of shards",
            )),
        })
        .collect()
}

/// keyway's functions in-process, and each `--function ID=BOOTSTRAP` as its bootstrap.
fn factories(
    options: &Args,
    text: &str,
    parameters: &BTreeMap<String, String>,
    api: &AwsApi,
    logs: Option<PathBuf>,
) -> Result<BTreeMap<String, Factory>, CliError> {
    let (wiring, _) = keyway_local::template::parse_with(text, parameters)
        .map_err(|e| CliError::input(options.template.display(), e))?;
    let mut factories: BTreeMap<String, Factory> = stack::functions();
    for (id, path) in pairs("--function", &options.functions)? {
        if !wiring.functions.iter().any(|f| f.logical_id == id) {
            return Err(CliError::option(
                format!("--function {id}={path}"),
                format!("the template has no function {id}"),
            ));
        }
        let path = std::fs::canonicalize(&path)
            .map_err(|e| CliError::option(format!("--function {id}={path}"), e))?;
        factories.insert(
            id,
            external::factory(path, api.endpoint.clone(), logs.clone()),
        );
    }
    Ok(factories)
}

/// What each mapping did and what each resource holds.
fn print_summary(
    options: &Args,
    runtime: &LocalRuntime,
    services: &LocalServices,
    report: &keyway_local::RunReport,
    put: usize,
) {
    println!(
        "keyway local: {} on the embedded runtime, {put} records put, {:.0} s of virtual time",
        options.template.display(),
        report.elapsed.as_secs_f64()
    );
    let stats = runtime
        .mappings()
        .iter()
        .map(|m| (&m.name, m.stats()))
        .chain(
            runtime
                .queue_mappings()
                .iter()
                .map(|m| (&m.name, m.stats())),
        );
    let (busy, idle): (Vec<_>, Vec<_>) = stats.partition(|(_, s)| s.invocations > 0);
    for (name, stats) in busy {
        crate::demo::print_mapping(name, stats);
    }
    if !idle.is_empty() {
        let names: Vec<&str> = idle.iter().map(|(name, _)| name.as_str()).collect();
        println!("  not invoked: {}", names.join(", "));
    }
    println!();
    print_resources(runtime, services);
}

/// `NAME=VALUE` arguments, in order.
fn pairs(flag: &str, values: &[String]) -> Result<Vec<(String, String)>, CliError> {
    values
        .iter()
        .map(|value| {
            value
                .split_once('=')
                .filter(|(name, _)| !name.is_empty())
                .map(|(name, v)| (name.to_owned(), v.to_owned()))
                .ok_or_else(|| format!("{flag} {value}: expected NAME=VALUE").into())
        })
        .collect()
}

/// What a `--put` file goes to.
enum Target {
    Table(Arc<keyway_local::LocalTable>),
    Stream,
    Queue { fifo: bool },
}

/// Puts each line of `file` on the stream, into the table, or on the queue with logical id `id`.
fn put_file(
    runtime: &LocalRuntime,
    services: &LocalServices,
    id: &str,
    file: &Path,
    pointer: Option<&str>,
    reshard: Option<usize>,
) -> Result<usize, CliError> {
    let name = runtime.resource(id).ok_or_else(|| {
        CliError::option(
            format!("--put {id}"),
            format!("the template has no resource {id}"),
        )
    })?;
    let opened = std::fs::File::open(file).map_err(CliError::file(file))?;
    let target = if let Some(table) = services.dynamodb.table(&name) {
        Target::Table(table)
    } else if services.kinesis.stream_arn(&name).is_some() {
        Target::Stream
    } else if services.sqs.config(&name).is_some() {
        Target::Queue {
            fifo: services.sqs.is_fifo(&name),
        }
    } else {
        return Err(CliError::option(
            format!("--put {id}"),
            "not a stream, a table or a queue",
        ));
    };
    // Halfway through the file: counted in a first pass, only when a reshard asks for it.
    let mut reshard_at = match (reshard, &target) {
        (None, _) => None,
        (Some(count), Target::Stream) => {
            let counted = std::fs::File::open(file).map_err(CliError::file(file))?;
            let lines = std::io::BufReader::new(counted).lines().count();
            Some((lines / 2, count))
        }
        (Some(_), _) => {
            return Err(CliError::option(
                format!("--reshard {id}"),
                "not a Kinesis stream",
            ))
        }
    };
    let mut count = 0;
    for (i, line) in std::io::BufReader::new(opened).lines().enumerate() {
        if reshard_at.is_some_and(|(half, _)| half == i) {
            reshard_stream(services, id, &name, reshard_at.take())?;
        }
        let at = format!("{}:{}", file.display(), i + 1);
        let line = line.map_err(|e| CliError::input(&at, e))?;
        if line.trim().is_empty() {
            continue;
        }
        // As a producer does, a put the service throttled or failed is made again.
        let mut attempts = 0;
        while let Err(failed) = put_line(services, &name, &target, &line, pointer, (i, &at)) {
            attempts += 1;
            if !failed.retryable || attempts == PUT_ATTEMPTS {
                return Err(CliError::input(at, failed.problem));
            }
        }
        count += 1;
    }
    // An empty file reshards all the same.
    reshard_stream(services, id, &name, reshard_at)?;
    Ok(count)
}

/// UpdateShardCount on the stream `name` (logical id `id`), when a reshard is due.
fn reshard_stream(
    services: &LocalServices,
    id: &str,
    name: &str,
    due: Option<(usize, usize)>,
) -> Result<(), CliError> {
    let Some((_, shards)) = due else {
        return Ok(());
    };
    services
        .kinesis
        .update_shard_count(name, shards)
        .map_err(|e| CliError::option(format!("--reshard {id}={shards}"), e))?;
    Ok(())
}

/// How often a line is put before the command gives up on it.
const PUT_ATTEMPTS: usize = 100;

/// Why a line was not put, and whether putting it again can help.
struct PutFailed {
    problem: String,
    retryable: bool,
}

impl PutFailed {
    fn of(problem: impl ToString) -> Self {
        Self {
            problem: problem.to_string(),
            retryable: false,
        }
    }

    fn sink(err: keyway::ports::SinkError) -> Self {
        Self {
            retryable: err.is_retryable(),
            problem: err.to_string(),
        }
    }
}

/// A table's line is a DynamoDB JSON item; a stream's, a record keyed by the partition key; a
/// queue's, a message (on a FIFO queue, in the group the partition key names, deduplicated by its
/// file and line, `at`).
fn put_line(
    services: &LocalServices,
    name: &str,
    target: &Target,
    line: &str,
    pointer: Option<&str>,
    (index, at): (usize, &str),
) -> Result<(), PutFailed> {
    use keyway::adapters::kinesis::PutOutcome;
    use keyway::adapters::sqs::{SqsEntry, SqsOutcome};
    match target {
        Target::Table(table) => {
            let value: Value =
                serde_json::from_str(line).map_err(|e| PutFailed::of(format!("not JSON: {e}")))?;
            let item = item_from_dynamodb_json(&value, "item").map_err(PutFailed::of)?;
            table.put_item(item).map_err(PutFailed::of)
        }
        Target::Stream => {
            let key = partition_key(line, pointer, index).map_err(PutFailed::of)?;
            let put = services.kinesis.put_record(name, &key, line.as_bytes());
            match put.map_err(PutFailed::sink)? {
                PutOutcome::Written { .. } => Ok(()),
                PutOutcome::Failed { code, message } => Err(PutFailed {
                    problem: format!("{code}: {message}"),
                    retryable: true,
                }),
            }
        }
        Target::Queue { fifo } => {
            let group = fifo
                .then(|| partition_key(line, pointer, index))
                .transpose()
                .map_err(PutFailed::of)?;
            let deduplication = fifo.then_some(at);
            let entry = SqsEntry {
                id: "0",
                body: line,
                output_id: None,
                group_id: group.as_deref(),
                deduplication_id: deduplication,
            };
            match services
                .sqs
                .send_now(name, &entry)
                .map_err(PutFailed::sink)?
            {
                SqsOutcome::Sent { .. } => Ok(()),
                SqsOutcome::Failed {
                    code,
                    message,
                    sender_fault,
                } => Err(PutFailed {
                    problem: format!("{code}: {message}"),
                    retryable: !sender_fault,
                }),
            }
        }
    }
}

/// The partition key of a line: the value at `pointer`, or the line's index without one.
fn partition_key(line: &str, pointer: Option<&str>, index: usize) -> Result<String, InvalidInput> {
    let Some(pointer) = pointer else {
        return Ok(index.to_string());
    };
    let value: Value = serde_json::from_str(line)
        .map_err(|e| InvalidInput::new("line", format!("not JSON: {e}")))?;
    match value.pointer(pointer) {
        Some(Value::String(key)) if !key.is_empty() => Ok(key.clone()),
        Some(key @ (Value::Number(_) | Value::Bool(_))) => Ok(key.to_string()),
        Some(other) => Err(InvalidInput::new(
            pointer,
            format!("{other} cannot be a partition key"),
        )),
        None => Err(InvalidInput::new(
            pointer,
            "no such field for the partition key",
        )),
    }
}

/// The template's resources by kind: (logical id, name or URL).
fn resources(runtime: &LocalRuntime) -> Vec<(String, String)> {
    runtime
        .wiring
        .resources
        .keys()
        .filter_map(|id| Some((id.clone(), runtime.resource(id)?)))
        .collect()
}

fn print_resources(runtime: &LocalRuntime, services: &LocalServices) {
    println!("what is in the stack (empty resources left out)");
    for (id, name) in resources(runtime) {
        let (count, what) = if let Some(table) = services.dynamodb.table(&name) {
            (table.len(), "items")
        } else if services.kinesis.stream_arn(&name).is_some() {
            (services.kinesis.records(&name).len(), "records")
        } else {
            (services.sqs.messages(&name).len(), "messages")
        };
        if count > 0 {
            println!("  {id:<28} {count:>8} {what}");
        }
    }
}

fn write_out(runtime: &LocalRuntime, services: &LocalServices, out: &Path) -> Result<(), CliError> {
    for (id, name) in resources(runtime) {
        let (folder, lines): (&str, Vec<Value>) = if let Some(table) =
            services.dynamodb.table(&name)
        {
            (
                "tables",
                table.items().iter().map(item_to_dynamodb_json).collect(),
            )
        } else if services.kinesis.stream_arn(&name).is_some() {
            let records = services.kinesis.records(&name);
            ("streams", records.iter().map(|r| json!({
                "shardId": r.shard_id,
                "sequenceNumber": r.sequence_number,
                "partitionKey": r.partition_key,
                "data": String::from_utf8(r.data.to_vec()).unwrap_or_else(|_| base64::engine::general_purpose::STANDARD.encode(&r.data)),
            })).collect())
        } else {
            let messages = services.sqs.messages(&name);
            (
                "queues",
                messages
                    .iter()
                    .map(|m| {
                        json!({
                            "messageId": m.message_id,
                            "body": m.body,
                            "outputId": m.output_id,
                            "groupId": m.group_id,
                        })
                    })
                    .collect(),
            )
        };
        let path = created(&out.join(folder))?.join(format!("{id}.jsonl"));
        let file = std::fs::File::create(&path).map_err(CliError::file(&path))?;
        let mut writer = std::io::BufWriter::new(file);
        for line in lines {
            writeln!(writer, "{line}").map_err(CliError::file(&path))?;
        }
        writer.flush().map_err(CliError::file(&path))?;
    }
    Ok(())
}

fn created(dir: &Path) -> Result<PathBuf, CliError> {
    std::fs::create_dir_all(dir).map_err(CliError::file(&dir))?;
    std::fs::canonicalize(dir).map_err(CliError::file(&dir))
}
