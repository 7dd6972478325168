//! `keyway bench package`: what each function of template.yaml ships to Lambda, as `cargo lambda
//! build --release` and `sam build` leave it. Each bootstrap is zipped as Lambda's
//! provided.al2023 runtime takes it and its architecture read from its ELF header. For builds
//! this machine can run, its cold start is measured on the embedded runtime: the process started
//! behind the Lambda Runtime API, on the template's tables, streams and queues served over their
//! AWS APIs, until its first response to the function's clean payload in events/. The same
//! process's next response to the same payload, warm, is the baseline measured in the same run.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use keyway::lambda::{Env, Handler as _, Invocation};
use keyway::sources::kinesis::KinesisEventRecord;
use keyway_local::{external, AwsApi, Bootstrap, ExternalFunction, Factory, FaultPlan};
use keyway_local::{LocalRuntime, LocalServices};
use serde::Serialize;

use crate::error::CliError;

/// The zipped size a function should stay under: small zips deploy and cold-start faster.
const TARGET_ZIP_BYTES: u64 = 4 * 1024 * 1024;
/// The cold start a function should stay under: process start to its first response.
const TARGET_COLD_START_MS: f64 = 50.0;
/// The memory the keyed counter should run the largest batch Lambda hands it within: Lambda's
/// smallest memory setting.
const TARGET_PEAK_MEMORY_BYTES: u64 = 128 * 1024 * 1024;
/// The largest batch: 10,000 records (Lambda's largest batch size) in an event just under 6 MB
/// (Lambda's largest synchronous payload, 6,291,456 bytes).
const LARGEST_BATCH_RECORDS: usize = 10_000;
const LARGEST_BATCH_BYTES: usize = 6_291_456;
/// Where the virtual clock starts: 2026-01-01T00:00:00Z.
const EPOCH: i64 = 1_767_225_600_000;

/// Each function's payload for its cold start, by binary: a clean batch (or its schedule's
/// event), as `cargo lambda invoke` would send it.
const PAYLOADS: &[(&str, &str)] = &[
    ("keyed-counter", "events/keyed-counter/clean-batch.json"),
    (
        "identity-enricher",
        "events/identity-enricher/clean-cloudtrail-batch.json",
    ),
    (
        "filter-policy-sync",
        "events/filter-policy-sync/clean-policy-changes.json",
    ),
    (
        "dynamic-filter",
        "events/dynamic-filter/clean-events-batch.json",
    ),
    ("cdc-rekey", "events/cdc-rekey/clean-debezium-batch.json"),
    ("cdc-join", "events/cdc-join/clean-changelog-batch.json"),
    (
        "keyed-aggregate",
        "events/keyed-aggregate/clean-events-batch.json",
    ),
    (
        "aggregate-merge",
        "events/aggregate-merge/partials-batch.json",
    ),
];

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// The stack whose functions are packaged (their binaries: Metadata/BuildProperties/Binary).
    #[arg(long, default_value = "template.yaml")]
    pub template: PathBuf,
    /// A folder of builds: BINARY/bootstrap as `cargo lambda build --release` leaves them, or
    /// LOGICAL_ID/bootstrap as `sam build --build-dir` does (repeatable).
    #[arg(long = "build", default_value = "target/lambda")]
    pub builds: Vec<PathBuf>,
    /// Cold starts measured per function; the median is reported.
    #[arg(long, default_value_t = 5)]
    pub starts: usize,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct PackageBench {
    template: PathBuf,
    packages: Vec<Package>,
    target_zip_bytes: u64,
    target_cold_start_ms: f64,
    target_peak_memory_bytes: u64,
    largest_zip_bytes: u64,
    /// The slowest median cold start of the builds this machine runs.
    slowest_cold_start_ms: Option<f64>,
    /// The most memory the keyed counter's process held for the largest batch, on the builds
    /// this machine runs.
    largest_batch_peak_bytes: Option<u64>,
    targets_met: bool,
}

#[derive(Serialize)]
struct Package {
    function: String,
    binary: String,
    /// The build folder, as given.
    build: PathBuf,
    bootstrap: PathBuf,
    /// From the ELF header: x86_64 or arm64.
    architecture: String,
    /// The function's crate, as `sam build` builds it from its CodeUri, leaves out the embedded
    /// runtime (the `keyway-local` crate), as `cargo tree` resolves it.
    embedded_runtime_left_out: bool,
    binary_bytes: u64,
    zip_bytes: u64,
    /// Median over the starts, when this machine runs the architecture.
    cold_start_ms: Option<f64>,
    /// Median of the same process's second response, the baseline.
    warm_response_ms: Option<f64>,
    /// For the keyed counter: the most memory its process held running a batch of 10,000
    /// records just under 6 MB, from its start.
    largest_batch_peak_bytes: Option<u64>,
}

/// A function of the template: its logical id, its binary and the crate folder it builds from.
struct Function {
    logical_id: String,
    binary: String,
    code_uri: String,
}

pub(super) fn run(options: Args) -> Result<(), CliError> {
    if options.starts == 0 {
        return Err(CliError::option("--starts", "must be at least 1"));
    }
    let text =
        std::fs::read_to_string(&options.template).map_err(CliError::file(&options.template))?;
    let functions = functions(&text)?;
    // CodeUri is relative to the template's folder, as SAM reads it.
    let stack_root = match options.template.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
        _ => PathBuf::from("."),
    };
    let mut left_out = BTreeMap::new();
    for function in &functions {
        if !left_out.contains_key(&function.code_uri) {
            let crate_dir = stack_root.join(&function.code_uri);
            left_out.insert(
                function.code_uri.clone(),
                embedded_runtime_left_out(&crate_dir)?,
            );
        }
    }
    let mut packages = Vec::new();
    for build in &options.builds {
        for function in &functions {
            let mut package = package(build, function)?;
            package.embedded_runtime_left_out = left_out[&function.code_uri];
            packages.push(package);
        }
    }
    let host = architecture_name(std::env::consts::ARCH);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .map_err(|e| e.to_string())?;
    for package in packages.iter_mut().filter(|p| p.architecture == host) {
        let (cold, warm) = runtime.block_on(cold_starts(&text, package, options.starts))?;
        package.cold_start_ms = Some(cold);
        package.warm_response_ms = Some(warm);
        if package.binary == "keyed-counter" {
            let peak = runtime.block_on(largest_batch_peak(&text, package))?;
            package.largest_batch_peak_bytes = Some(peak);
        }
    }
    let largest_batch_peak_bytes = packages
        .iter()
        .filter_map(|p| p.largest_batch_peak_bytes)
        .max();
    let largest_zip_bytes = packages.iter().map(|p| p.zip_bytes).max().unwrap_or(0);
    let slowest_cold_start_ms = packages
        .iter()
        .filter_map(|p| p.cold_start_ms)
        .reduce(f64::max);
    let result = PackageBench {
        template: options.template,
        targets_met: largest_zip_bytes <= TARGET_ZIP_BYTES
            && slowest_cold_start_ms.is_some_and(|ms| ms <= TARGET_COLD_START_MS)
            && largest_batch_peak_bytes.is_some_and(|b| b <= TARGET_PEAK_MEMORY_BYTES)
            && packages.iter().all(|p| p.embedded_runtime_left_out),
        packages,
        target_zip_bytes: TARGET_ZIP_BYTES,
        target_cold_start_ms: TARGET_COLD_START_MS,
        target_peak_memory_bytes: TARGET_PEAK_MEMORY_BYTES,
        largest_zip_bytes,
        slowest_cold_start_ms,
        largest_batch_peak_bytes,
    };
    crate::job::report(&result, options.json, print_table);
    Ok(())
}

fn print_table(r: &PackageBench) {
    let mb = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    let ms = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1}"));
    println!("keyway bench package: {}", r.template.display());
    println!();
    println!(
        "{:<26} {:<8} {:>13} {:>10} {:>14} {:>10}  build",
        "function", "arch", "binary (MiB)", "zip (MiB)", "cold start ms", "warm ms"
    );
    for p in &r.packages {
        println!(
            "{:<26} {:<8} {:>13.2} {:>10.2} {:>14} {:>10}  {}",
            p.function,
            p.architecture,
            mb(p.binary_bytes),
            mb(p.zip_bytes),
            ms(p.cold_start_ms),
            ms(p.warm_response_ms),
            p.bootstrap.display()
        );
    }
    println!();
    println!(
        "embedded runtime left out of every function: {}",
        r.packages.iter().all(|p| p.embedded_runtime_left_out)
    );
    let peak = r
        .largest_batch_peak_bytes
        .map_or("-".to_owned(), |b| format!("{:.1}", mb(b)));
    println!(
        "the keyed counter ran 10,000 records in 6 MB within {peak} MiB (target: at most {:.0})",
        mb(r.target_peak_memory_bytes)
    );
    println!(
        "largest zip {:.2} MiB (target: at most {:.1}); slowest cold start {} ms (target: at most {:.0}): {}",
        mb(r.largest_zip_bytes),
        mb(r.target_zip_bytes),
        ms(r.slowest_cold_start_ms),
        r.target_cold_start_ms,
        if r.targets_met { "met" } else { "missed" }
    );
}

/// The template's functions and the binary each is built from.
fn functions(text: &str) -> Result<Vec<Function>, CliError> {
    let (wiring, template) = keyway_local::template::parse_with(text, &BTreeMap::new())
        .map_err(|e| CliError::option("--template", e))?;
    wiring
        .functions
        .iter()
        .map(|f| {
            let resource = &template["Resources"][f.logical_id.as_str()];
            let binary = resource["Metadata"]["BuildProperties"]["Binary"]
                .as_str()
                .ok_or_else(|| {
                    format!(
                        "Resources/{}/Metadata/BuildProperties/Binary: missing; it names the binary sam build makes",
                        f.logical_id
                    )
                })?;
            let code_uri = resource["Properties"]["CodeUri"].as_str().ok_or_else(|| {
                format!(
                    "Resources/{}/Properties/CodeUri: missing; it names the crate sam build builds",
                    f.logical_id
                )
            })?;
            Ok(Function {
                logical_id: f.logical_id.clone(),
                binary: binary.to_owned(),
                code_uri: code_uri.to_owned(),
            })
        })
        .collect()
}

/// The function's bootstrap in `build`, zipped.
fn package(build: &Path, function: &Function) -> Result<Package, CliError> {
    let bootstrap = [&function.binary, &function.logical_id]
        .iter()
        .map(|name| build.join(name).join("bootstrap"))
        .find(|path| path.is_file())
        .ok_or_else(|| {
            format!(
                "--build {}: no {}/bootstrap nor {}/bootstrap (run `cargo lambda build --release` or `sam build --build-dir {}` first)",
                build.display(),
                function.binary,
                function.logical_id,
                build.display()
            )
        })?;
    let binary = std::fs::read(&bootstrap).map_err(CliError::file(&bootstrap))?;
    let architecture = elf_architecture(&binary).ok_or_else(|| {
        format!(
            "{}: not an x86_64 or arm64 ELF executable",
            bootstrap.display()
        )
    })?;
    Ok(Package {
        function: function.logical_id.clone(),
        binary: function.binary.clone(),
        build: build.to_owned(),
        bootstrap,
        architecture: architecture.to_owned(),
        embedded_runtime_left_out: false,
        binary_bytes: binary.len() as u64,
        zip_bytes: zip_bootstrap(&binary)?.len() as u64,
        cold_start_ms: None,
        warm_response_ms: None,
        largest_batch_peak_bytes: None,
    })
}

/// Whether the crate in `crate_dir`, built from there as `sam build` builds a function, leaves the
/// embedded runtime (the `keyway-local` crate and its YAML reader) out.
fn embedded_runtime_left_out(crate_dir: &Path) -> Result<bool, CliError> {
    let manifest = crate_dir.join("Cargo.toml");
    let out =
        std::process::Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
            .arg("tree")
            .arg("--manifest-path")
            .arg(&manifest)
            // Dev-dependencies are the tests', which a release build leaves out.
            .args(["-e", "normal", "--prefix", "none"])
            .output()
            .map_err(|e| format!("cargo tree: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo tree --manifest-path {}: {}",
            manifest.display(),
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(!String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|line| line.starts_with("keyway-local ")))
}

/// The architecture an ELF executable is for, as Lambda names it (its e_machine field).
fn elf_architecture(binary: &[u8]) -> Option<&'static str> {
    if binary.len() < 20 || &binary[..4] != b"\x7fELF" {
        return None;
    }
    match u16::from_le_bytes([binary[18], binary[19]]) {
        0x3e => Some("x86_64"),
        0xb7 => Some("arm64"),
        _ => None,
    }
}

/// Lambda's name for a Rust target architecture.
fn architecture_name(arch: &str) -> &str {
    match arch {
        "aarch64" => "arm64",
        other => other,
    }
}

/// Median cold start and warm response of `package`'s bootstrap, in milliseconds. Each start is
/// a first: the template deployed afresh on the embedded services, and the process started with
/// the environment the template gives the function. Warm is the same process answering the same
/// batch again. (Whether it applies the records again or skips them as applied depends on their
/// arrival times against the function's redelivery window on the real clock: the payloads'
/// records arrived on 2026-01-01.) Every answer must be clean: no record of the batch failed.
async fn cold_starts(text: &str, package: &Package, starts: usize) -> Result<(f64, f64), CliError> {
    let payload = payload(&package.binary)?;
    let mut cold = Vec::with_capacity(starts);
    let mut warm = Vec::with_capacity(starts);
    for start in 0..starts {
        let launched = launch(text, package).await?;
        for (which, times) in [("cold", &mut cold), ("warm", &mut warm)] {
            let began = Instant::now();
            launched
                .answer_cleanly(&payload, &format!("bench-package-{start}-{which}"), package)
                .await?;
            times.push(began.elapsed());
        }
    }
    Ok((median_ms(&mut cold), median_ms(&mut warm)))
}

/// The most memory `package`'s process held, from its start, running a batch of 10,000 records
/// just under 6 MB: the largest Lambda hands a function (the keyed counter's clicks, a thousand
/// users' keys padded to fill it).
async fn largest_batch_peak(text: &str, package: &Package) -> Result<u64, CliError> {
    let launched = launch(text, package).await?;
    // The data of each record sized so that the event comes just under 6 MB: a first event
    // tells how much the records' JSON and base64 add.
    let first = 40;
    let per_record = largest_batch(first).len() / LARGEST_BATCH_RECORDS;
    let overhead = per_record - first.div_ceil(3) * 4;
    let room = (LARGEST_BATCH_BYTES - 4096) / LARGEST_BATCH_RECORDS;
    let event = largest_batch(room.saturating_sub(overhead) * 3 / 4);
    if !(LARGEST_BATCH_BYTES * 9 / 10..=LARGEST_BATCH_BYTES).contains(&event.len()) {
        let size = event.len();
        return Err(format!("the largest batch came to {size} bytes, not just under 6 MB").into());
    }
    launched
        .answer_cleanly(&event, "bench-package-largest-batch", package)
        .await?;
    launched.function.peak_memory_bytes().await.ok_or_else(|| {
        format!(
            "{}: its process's peak memory cannot be read",
            package.function
        )
        .into()
    })
}

/// The keyed counter's clicks of a thousand users, 10,000 records of about `data_bytes` each
/// (the keys padded), as one event of a shard.
fn largest_batch(data_bytes: usize) -> String {
    let datas: Vec<(String, Vec<u8>, String)> = (0..LARGEST_BATCH_RECORDS)
        .map(|i| {
            let key = format!("user-{:04}-", i % 1000);
            let pad = "x".repeat(data_bytes.saturating_sub(key.len() + 24));
            let data = format!(r#"{{"key":"{key}{pad}","amount":1}}"#).into_bytes();
            (key, data, format!("{:056}", i + 1))
        })
        .collect();
    keyway_local::mapping::events::kinesis_event_json(
        "arn:aws:kinesis:us-east-1:000000000000:stream/clicks",
        datas
            .iter()
            .map(|(key, data, sequence)| KinesisEventRecord {
                shard_id: "shardId-000000000000",
                sequence_number: sequence,
                partition_key: key,
                data,
                arrival_millis: EPOCH,
            }),
    )
}

/// A package's bootstrap started as the template deploys it, on embedded services served over
/// their AWS APIs (kept running as long as this is).
struct Launched {
    function: ExternalFunction,
    _api: AwsApi,
    log: PathBuf,
}

/// Starts `package`'s bootstrap afresh, as the template deploys its function.
async fn launch(text: &str, package: &Package) -> Result<Launched, CliError> {
    // Absolute: the process starts in its own folder, as Lambda's does.
    let bootstrap =
        std::fs::canonicalize(&package.bootstrap).map_err(CliError::file(&package.bootstrap))?;
    // Beside the builds, not in them: a build's folder is what the CDK app zips.
    let logs = workspace_root()?.join("target/bench-package");
    std::fs::create_dir_all(&logs).map_err(CliError::file(&logs))?;
    let log = logs.join(format!("{}-{}.log", package.function, package.architecture));
    let services = LocalServices::new(EPOCH, FaultPlan::default());
    let api = AwsApi::start(services.clone())
        .await
        .map_err(|e| format!("cannot serve the AWS APIs: {e}"))?;
    let env = deployed_env(text, &services, &package.function, &bootstrap, &api)?;
    let function = ExternalFunction::new(
        env.get("AWS_LAMBDA_FUNCTION_NAME")
            .map_or("function", String::as_str),
        Bootstrap {
            path: bootstrap,
            env: env.clone(),
            aws_endpoint: api.endpoint.clone(),
            log: Some(log.clone()),
        },
        services.clock.clone(),
    );
    Ok(Launched {
        function,
        _api: api,
        log,
    })
}

impl Launched {
    /// Invokes the function with `event`; an error unless it answers with no record failed.
    async fn answer_cleanly(
        &self,
        event: &str,
        request_id: &str,
        package: &Package,
    ) -> Result<(), CliError> {
        let invocation = Invocation {
            request_id: request_id.to_owned(),
            deadline_millis: None,
        };
        let failed = match &self.function.handle(event, &invocation).await {
            Ok(answer) => Some(answer.batch_item_failures())
                .filter(|failures| !failures.is_empty())
                .map(|failures| format!("batchItemFailures {failures:?}")),
            Err(e) => Some(e.to_string()),
        };
        match failed {
            None => Ok(()),
            Some(failed) => Err(format!(
                "{} ({}), {request_id}: {failed} (its output: {})",
                package.function,
                package.bootstrap.display(),
                self.log.display()
            )
            .into()),
        }
    }
}

/// The environment the template gives `function` once deployed on `services`: the template is
/// deployed with every function as its bootstrap, and the runtime's factory records it.
fn deployed_env(
    text: &str,
    services: &Arc<LocalServices>,
    function: &str,
    bootstrap: &Path,
    api: &AwsApi,
) -> Result<Env, CliError> {
    let recorded: Arc<Mutex<Option<Env>>> = Arc::default();
    let (wiring, _) = keyway_local::template::parse_with(text, &BTreeMap::new())
        .map_err(|e| CliError::option("--template", e))?;
    let mut factories: BTreeMap<String, Factory> = BTreeMap::new();
    for f in &wiring.functions {
        let inner = external::factory(bootstrap.to_owned(), api.endpoint.clone(), None);
        let record = (f.logical_id == function).then(|| recorded.clone());
        factories.insert(
            f.logical_id.clone(),
            Box::new(move |platform, env| {
                if let Some(record) = &record {
                    *record.lock().unwrap_or_else(|p| p.into_inner()) = Some(env.clone());
                }
                inner(platform, env)
            }),
        );
    }
    LocalRuntime::from_template_with(text, &BTreeMap::new(), services.clone(), &factories)?;
    let env = recorded.lock().unwrap_or_else(|p| p.into_inner()).take();
    env.ok_or_else(|| format!("the template does not deploy {function}").into())
}

/// The clean payload the function's cold start answers.
fn payload(binary: &str) -> Result<String, CliError> {
    let (_, path) = PAYLOADS
        .iter()
        .find(|(b, _)| *b == binary)
        .ok_or_else(|| format!("{binary}: no payload to start it with (package.rs PAYLOADS)"))?;
    let path = workspace_root()?.join(path);
    std::fs::read_to_string(&path).map_err(CliError::file(&path))
}

fn median_ms(times: &mut [Duration]) -> f64 {
    times.sort();
    times[times.len() / 2].as_secs_f64() * 1000.0
}

/// The workspace the command was built from, or the current directory's if run elsewhere.
fn workspace_root() -> Result<PathBuf, CliError> {
    let built_in = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let root = if built_in.join("Cargo.toml").is_file() {
        built_in
    } else {
        std::env::current_dir().map_err(|e| CliError::from(format!("current directory: {e}")))?
    };
    root.canonicalize()
        .map_err(|e| format!("workspace {}: {e}", root.display()).into())
}

/// A zip archive holding `binary` as an executable `bootstrap`, deflated: what Lambda's
/// provided.al2023 runtime runs (PKWARE APPNOTE 6.3: one local header, the data, one central
/// directory entry, the end record).
fn zip_bootstrap(binary: &[u8]) -> Result<Vec<u8>, CliError> {
    let name = b"bootstrap";
    let mut deflate = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
    deflate
        .write_all(binary)
        .map_err(|e| format!("deflate: {e}"))?;
    let data = deflate.finish().map_err(|e| format!("deflate: {e}"))?;
    let crc = crc32fast::hash(binary);
    let size = u32::try_from(binary.len()).map_err(|_| "a binary over 4 GiB")?;
    let packed = u32::try_from(data.len()).map_err(|_| "a zip over 4 GiB")?;
    let u16s = |out: &mut Vec<u8>, values: &[u16]| {
        values
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes()))
    };
    let u32s = |out: &mut Vec<u8>, values: &[u32]| {
        values
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes()))
    };
    // What the local header and the directory entry share: version 2.0, no flags, deflate,
    // 1980-01-01 00:00 (a fixed time: the same binary gives the same zip), sizes, name length,
    // no extra field.
    let common = |out: &mut Vec<u8>| {
        u16s(out, &[20, 0, 8, 0, 0x21]);
        u32s(out, &[crc, packed, size]);
        u16s(out, &[name.len() as u16, 0]);
    };
    let mut zip = Vec::with_capacity(data.len() + 128);
    u32s(&mut zip, &[0x0403_4b50]);
    common(&mut zip);
    zip.extend_from_slice(name);
    zip.extend_from_slice(&data);
    let directory = zip.len() as u32;
    u32s(&mut zip, &[0x0201_4b50]);
    // Made by Unix (3), so that the external attributes carry the file mode.
    u16s(&mut zip, &[(3 << 8) | 20]);
    common(&mut zip);
    // No comment, disk 0, no internal attributes; a regular file, mode 755; at offset 0.
    u16s(&mut zip, &[0, 0, 0]);
    u32s(&mut zip, &[0o100_755 << 16, 0]);
    zip.extend_from_slice(name);
    let directory_len = zip.len() as u32 - directory;
    // The end record: disk 0, directory on disk 0, one entry of one, its size and offset.
    u32s(&mut zip, &[0x0605_4b50]);
    u16s(&mut zip, &[0, 0, 1, 1]);
    u32s(&mut zip, &[directory_len, directory]);
    u16s(&mut zip, &[0]);
    Ok(zip)
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    #[test]
    fn every_function_of_the_stack_names_its_binary_and_has_a_payload_to_start_with() {
        let root = workspace_root().unwrap();
        let text = std::fs::read_to_string(root.join("template.yaml")).unwrap();
        let functions = functions(&text).unwrap();
        assert_eq!(functions.len(), 8, "template.yaml's functions");
        for function in &functions {
            let payload = payload(&function.binary)
                .unwrap_or_else(|e| panic!("{}: {e}", function.logical_id));
            let event: serde_json::Value = serde_json::from_str(&payload).unwrap();
            assert!(
                event.get("Records").is_some() || event.get("detail-type").is_some(),
                "{}: a stream batch or a scheduled event",
                function.binary
            );
        }
    }

    #[test]
    fn the_release_profile_sets_what_cargo_lambda_would_otherwise_choose_and_unwinds() {
        let root = workspace_root().unwrap();
        let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
        let section: Vec<&str> = manifest
            .lines()
            .skip_while(|line| line.trim() != "[profile.release]")
            .skip(1)
            .take_while(|line| !line.starts_with('['))
            .collect();
        let value = |key: &str| {
            section.iter().find_map(|line| {
                let (k, v) = line.split_once('=')?;
                (k.trim() == key).then(|| v.trim().to_owned())
            })
        };
        // cargo lambda build adds its own value for each of these that the profile leaves out.
        for key in ["strip", "lto", "codegen-units", "panic"] {
            assert!(value(key).is_some(), "[profile.release] sets {key}");
        }
        assert_eq!(
            value("panic").as_deref(),
            Some("\"unwind\""),
            "the executor catches an operator's panic"
        );
    }

    #[test]
    fn a_crate_built_with_the_embedded_runtime_is_told_from_a_function_built_without() {
        let root = workspace_root().unwrap();
        assert!(embedded_runtime_left_out(&root.join("functions/keyed-counter")).unwrap());
        assert!(!embedded_runtime_left_out(&root.join("crates/keyway-cli")).unwrap());
    }

    #[test]
    fn a_bootstrap_s_architecture_is_read_from_its_elf_header() {
        let this = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(
            elf_architecture(&this),
            Some(architecture_name(std::env::consts::ARCH))
        );
        let mut arm = this[..64].to_vec();
        arm[18..20].copy_from_slice(&0xb7u16.to_le_bytes());
        assert_eq!(elf_architecture(&arm), Some("arm64"));
        arm[18..20].copy_from_slice(&0x28u16.to_le_bytes());
        assert_eq!(
            elf_architecture(&arm),
            None,
            "32-bit ARM is not a Lambda architecture"
        );
        assert_eq!(elf_architecture(b"#!/bin/sh\necho hi\n"), None);
    }

    #[test]
    fn the_zip_holds_the_binary_as_an_executable_bootstrap_that_unzip_restores() {
        let binary: Vec<u8> = (0..100_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        let zip = zip_bootstrap(&binary).unwrap();
        assert!(
            zip.len() < binary.len() / 2,
            "deflated: {} bytes",
            zip.len()
        );
        let dir = std::env::temp_dir().join(format!("keyway-zip-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("function.zip");
        std::fs::write(&path, &zip).unwrap();
        // Python's zipfile reads the archive as Lambda's unzip would, mode bits included.
        let script = "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); i = z.getinfo('bootstrap'); \
                      sys.stdout.buffer.write(b'%o\\n' % (i.external_attr >> 16)); sys.stdout.buffer.write(z.read(i))";
        let out = Command::new("python3")
            .args(["-c", script])
            .arg(&path)
            .output()
            .expect("python3 runs");
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let split = out.stdout.iter().position(|&b| b == b'\n').unwrap();
        assert_eq!(&out.stdout[..split], b"100755");
        assert!(
            out.stdout[split + 1..] == binary[..],
            "the binary comes back unchanged"
        );
    }
}
