//! `keyway local` as a user runs it: their template, their function's bootstrap, their files.
//!
//! The keyed counter runs as an external bootstrap: the real `keyed-counter` binary when
//! `KEYWAY_EXTERNAL_BOOTSTRAP` names it (the test command builds it and sets it), otherwise
//! `keyway bootstrap KeyedCounterFunction`, the same handler behind the same Lambda runtime
//! client. Other bootstraps here are scripts, as a function in another language would be.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("keyway-local-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn executable(path: &Path, text: &str) -> PathBuf {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.to_owned()
}

fn keyway(args: &[&str]) -> Output {
    let output = Command::new(env!("CARGO_BIN_EXE_keyway"))
        .args(args)
        .output()
        .expect("keyway runs");
    eprintln!("{}", String::from_utf8_lossy(&output.stderr));
    output
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The counter's bootstrap: the built function binary, or the keyway command serving it.
fn counter_bootstrap(dir: &Path) -> PathBuf {
    match std::env::var("KEYWAY_EXTERNAL_BOOTSTRAP") {
        Ok(path) => {
            eprintln!("the keyed counter runs as {path}");
            PathBuf::from(path)
        }
        Err(_) => {
            eprintln!(
                "KEYWAY_EXTERNAL_BOOTSTRAP is unset: the keyed counter runs as `keyway bootstrap`"
            );
            let script = format!(
                "#!/bin/sh\nexec '{}' bootstrap KeyedCounterFunction\n",
                env!("CARGO_BIN_EXE_keyway")
            );
            executable(&dir.join("bootstrap"), &script)
        }
    }
}

#[test]
fn a_function_run_as_its_own_bootstrap_counts_every_click_once_and_in_order_across_a_reshard() {
    let dir = scratch("counter");
    // Each key's running totals, click by click: amounts that differ make them depend on the
    // order the clicks are counted in.
    let mut expected: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut clicks = String::new();
    for i in 0..3000 {
        let key = format!("user-{}", (i * i) % 17);
        let amount = i % 7 + 1;
        let totals = expected.entry(key.clone()).or_default();
        totals.push(totals.last().unwrap_or(&0) + amount);
        clicks.push_str(&format!("{{\"key\":\"{key}\",\"amount\":{amount}}}\n"));
    }
    clicks.push_str("{\"key\": 42}\n");
    std::fs::write(dir.join("clicks.jsonl"), clicks).unwrap();
    let template = concat!(env!("CARGO_MANIFEST_DIR"), "/../../template.yaml");
    let bootstrap = counter_bootstrap(&dir);
    let out = dir.join("out");
    let output = keyway(&[
        "local",
        "--template",
        template,
        "--function",
        &format!("KeyedCounterFunction={}", bootstrap.display()),
        "--put",
        &format!("ClicksStream={}", dir.join("clicks.jsonl").display()),
        "--partition-key",
        "/key",
        "--reshard",
        "ClicksStream=3",
        "--out",
        out.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(stdout.contains("3001 records put"), "{stdout}");

    // The first half of the clicks went to the template's two shards, the rest to three new
    // ones.
    let shards: Vec<String> = lines(&out.join("streams/ClicksStream.jsonl"))
        .iter()
        .map(|r| r["shardId"].as_str().unwrap().to_owned())
        .collect();
    let old = ["shardId-000000000000", "shardId-000000000001"];
    assert_eq!(
        shards.iter().filter(|s| old.contains(&s.as_str())).count(),
        1500
    );
    assert!(shards.iter().any(|s| s == "shardId-000000000004"));
    // Each key's running totals are those of its clicks in the order they were written: no click
    // of a new shard was counted before the clicks of its parents (which take several batches
    // of 500 each). (The queue is a standard one,
    // which keeps no order: the totals are compared as sets, one an output id.)
    let mut by_id: BTreeMap<String, (String, u64)> = BTreeMap::new();
    for message in lines(&out.join("queues/CountsQueue.jsonl")) {
        let body: Value = serde_json::from_str(message["body"].as_str().unwrap()).unwrap();
        let total = (
            body["key"].as_str().unwrap().to_owned(),
            body["count"].as_u64().unwrap(),
        );
        let id = message["outputId"].as_str().unwrap().to_owned();
        assert_eq!(*by_id.entry(id).or_insert_with(|| total.clone()), total);
    }
    let mut counts: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (key, total) in by_id.into_values() {
        counts.entry(key).or_default().push(total);
    }
    counts
        .values_mut()
        .for_each(|totals| totals.sort_unstable());
    assert_eq!(counts, expected);
    let dead = lines(&out.join("queues/DeadLetterQueue.jsonl"));
    assert_eq!(dead.len(), 1);
    assert!(dead[0]["body"]
        .as_str()
        .unwrap()
        .contains("\"field\":\"data\""));
    assert!(!lines(&out.join("tables/StateTable.jsonl")).is_empty());

    // It ran as a process: its metric lines are in its log, not the command's.
    let log = std::fs::read_to_string(out.join("logs/KeyedCounterFunction.log")).unwrap();
    assert!(
        log.contains("\"Function\":\"KeyedCounterFunction\""),
        "{log}"
    );
}

/// A stack of one stream, one function and an on-failure queue, as a user writes it.
const STACK: &str = r#"
AWSTemplateFormatVersion: "2010-09-09"
Transform: AWS::Serverless-2016-10-31
Resources:
  Events:
    Type: AWS::Kinesis::Stream
    Properties:
      ShardCount: 1
  GivenUp:
    Type: AWS::SQS::Queue
  Worker:
    Type: AWS::Serverless::Function
    Properties:
      Runtime: provided.al2023
      Handler: bootstrap
      CodeUri: worker/
      Timeout: 1
      Environment:
        Variables:
          GREETING: hello
      Events:
        Stream:
          Type: Kinesis
          Properties:
            Stream: !GetAtt Events.Arn
            StartingPosition: TRIM_HORIZON
            BatchSize: 10
            MaximumRetryAttempts: 1
            FunctionResponseTypes: [ReportBatchItemFailures]
            DestinationConfig:
              OnFailure:
                Destination: !GetAtt GivenUp.Arn
"#;

/// Runs `template` with `function` as its bootstrap and `lines` put on the resource `put`.
fn run_user_stack(
    dir: &Path,
    template: &str,
    (function, bootstrap): (&str, &Path),
    (put, lines): (&str, &str),
) -> (String, PathBuf) {
    std::fs::write(dir.join("template.yaml"), template).unwrap();
    std::fs::write(dir.join("lines.jsonl"), lines).unwrap();
    let out = dir.join("out");
    let output = keyway(&[
        "local",
        "--template",
        dir.join("template.yaml").to_str().unwrap(),
        "--function",
        &format!("{function}={}", bootstrap.display()),
        "--put",
        &format!("{put}={}", dir.join("lines.jsonl").display()),
        "--out",
        out.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{stdout}");
    (stdout, out)
}

fn run_stack(dir: &Path, bootstrap: &Path) -> (String, PathBuf) {
    let events = "{\"n\":1}\n{\"n\":2}\n{\"n\":3}\n";
    run_user_stack(dir, STACK, ("Worker", bootstrap), ("Events", events))
}

/// A bootstrap in Python, speaking the runtime API with nothing but the standard library: it
/// starts slowly, fails the record whose `n` is 2, and writes what it was given to
/// `calls.jsonl`.
const PYTHON_BOOTSTRAP: &str = r#"#!/usr/bin/env python3
import base64, json, os, time, urllib.request
# A start-up longer than the function's timeout of a second: Lambda does not count it.
time.sleep(1.5)
api = "http://" + os.environ["AWS_LAMBDA_RUNTIME_API"] + "/2018-06-01/runtime/invocation/"
while True:
    with urllib.request.urlopen(api + "next") as r:
        request_id = r.headers["Lambda-Runtime-Aws-Request-Id"]
        deadline = int(r.headers["Lambda-Runtime-Deadline-Ms"])
        event = json.load(r)
    records = [json.loads(base64.b64decode(x["kinesis"]["data"])) for x in event["Records"]]
    with open("calls.jsonl", "a") as log:
        log.write(json.dumps({"ns": [x["n"] for x in records], "greeting": os.environ.get("GREETING"), "deadline": deadline, "endpoint": os.environ.get("AWS_ENDPOINT_URL")}) + "\n")
    failed = [x["kinesis"]["sequenceNumber"] for x, r in zip(event["Records"], records) if r["n"] == 2]
    body = json.dumps({"batchItemFailures": [{"itemIdentifier": s} for s in failed[:1]]}).encode()
    urllib.request.urlopen(urllib.request.Request(api + request_id + "/response", data=body, method="POST")).read()
"#;

#[test]
fn a_bootstrap_in_another_language_gets_its_environment_and_its_partial_failures_are_retried_as_on_lambda(
) {
    let dir = scratch("python");
    let worker = dir.join("worker");
    std::fs::create_dir_all(&worker).unwrap();
    let bootstrap = executable(&worker.join("bootstrap"), PYTHON_BOOTSTRAP);
    let (stdout, out) = run_stack(&dir, &bootstrap);
    // Lambda retries from the failed record: [1, 2, 3], then [2, 3] once (MaximumRetryAttempts
    // 1), then gives the batch up to the on-failure queue.
    let calls = lines(&worker.join("calls.jsonl"));
    let batches: Vec<Value> = calls.iter().map(|c| c["ns"].clone()).collect();
    assert_eq!(
        batches,
        [serde_json::json!([1, 2, 3]), serde_json::json!([2, 3])],
        "{stdout}"
    );
    assert!(calls.iter().all(|c| c["greeting"] == "hello"
        && c["endpoint"]
            .as_str()
            .unwrap()
            .starts_with("http://127.0.0.1:")));
    let given_up = lines(&out.join("queues/GivenUp.jsonl"));
    assert_eq!(given_up.len(), 1, "{stdout}");
    let record: Value = serde_json::from_str(given_up[0]["body"].as_str().unwrap()).unwrap();
    assert_eq!(record["KinesisBatchInfo"]["batchSize"], 2, "{record}");
}

#[test]
fn a_bootstrap_that_exits_or_never_answers_fails_its_invocations_and_the_batch_is_given_up() {
    for (name, script) in [
        ("exits", "#!/bin/sh\necho 'no runtime here' >&2\nexit 3\n"),
        // Takes the invocation and never answers.
        ("hangs", "#!/usr/bin/env python3\nimport os, time, urllib.request\nurllib.request.urlopen(\"http://\" + os.environ[\"AWS_LAMBDA_RUNTIME_API\"] + \"/2018-06-01/runtime/invocation/next\").read()\ntime.sleep(30)\n"),
    ] {
        let dir = scratch(name);
        let worker = dir.join("worker");
        std::fs::create_dir_all(&worker).unwrap();
        let bootstrap = executable(&worker.join("bootstrap"), script);
        let (stdout, out) = run_stack(&dir, &bootstrap);
        assert!(
            stdout.contains("function errors           2"),
            "{name}: {stdout}"
        );
        if name == "hangs" {
            assert!(stdout.contains("(2 timeouts"), "{stdout}");
        }
        assert_eq!(
            lines(&out.join("queues/GivenUp.jsonl")).len(),
            1,
            "{name}: {stdout}"
        );
        let log = std::fs::read_to_string(out.join("logs/Worker.log")).unwrap_or_default();
        if name == "exits" {
            assert!(log.contains("no runtime here"), "{log}");
        }
    }
}

#[test]
fn lines_put_into_a_table_are_dynamodb_json_items_whose_stream_triggers_the_tables_mapping() {
    let dir = scratch("table");
    let template = concat!(env!("CARGO_MANIFEST_DIR"), "/../../template.yaml");
    let users = dir.join("users.jsonl");
    std::fs::write(
        &users,
        "{\"id\": {\"N\": \"1\"}, \"name\": {\"S\": \"ann\"}}\n{\"id\": {\"N\": \"2\"}, \"name\": {\"S\": \"bo\"}}\n",
    )
    .unwrap();
    let out = dir.join("out");
    let put = format!("CdcUsersTable={}", users.display());
    let output = keyway(&[
        "local",
        "--template",
        template,
        "--put",
        &put,
        "--out",
        out.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(
        stdout.contains("CdcRekeyFunction/Users\n    invocations"),
        "{stdout}"
    );
    assert!(stdout.contains("records delivered         2"), "{stdout}");
    let items = lines(&out.join("tables/CdcUsersTable.jsonl"));
    assert_eq!(items.len(), 2);
    assert_eq!(items[0]["name"]["S"], "ann");

    // A line that is not an item stops the command, naming the file's line.
    std::fs::write(&users, "{\"id\": {\"N\": \"1\"}}\n{\"id\": 3}\n").unwrap();
    let output = keyway(&["local", "--template", template, "--put", &put]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("users.jsonl:2") && stderr.contains("item.id"),
        "{stderr}"
    );
}

/// A queue consumer as a user writes one: it fails the messages it cannot read.
const QUEUE_STACK: &str = r#"
Transform: AWS::Serverless-2016-10-31
Resources:
  Dead:
    Type: AWS::SQS::Queue
  Inbox:
    Type: AWS::SQS::Queue
    Properties:
      VisibilityTimeout: 5
      RedrivePolicy:
        deadLetterTargetArn: !GetAtt Dead.Arn
        maxReceiveCount: 2
  Reader:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: reader/
      Handler: bootstrap
      Runtime: provided.al2023
      Timeout: 5
      Events:
        Inbox:
          Type: SQS
          Properties:
            Queue: !GetAtt Inbox.Arn
            BatchSize: 5
            FunctionResponseTypes: [ReportBatchItemFailures]
"#;

const PYTHON_READER: &str = r#"#!/usr/bin/env python3
import json, os, urllib.request
api = "http://" + os.environ["AWS_LAMBDA_RUNTIME_API"] + "/2018-06-01/runtime/invocation/"
while True:
    with urllib.request.urlopen(api + "next") as r:
        request_id = r.headers["Lambda-Runtime-Aws-Request-Id"]
        event = json.load(r)
    failed = []
    with open("read.jsonl", "a") as log:
        for m in event["Records"]:
            body = json.loads(m["body"])
            if "n" not in body:
                failed.append({"itemIdentifier": m["messageId"]})
                continue
            log.write(json.dumps({"n": body["n"], "receives": m["attributes"]["ApproximateReceiveCount"]}) + "\n")
    body = json.dumps({"batchItemFailures": failed}).encode()
    urllib.request.urlopen(urllib.request.Request(api + request_id + "/response", data=body, method="POST")).read()
"#;

#[test]
fn a_queue_consumer_reads_each_message_and_what_it_cannot_read_goes_to_the_dead_letter_queue() {
    let dir = scratch("queue");
    let reader = dir.join("reader");
    std::fs::create_dir_all(&reader).unwrap();
    let bootstrap = executable(&reader.join("bootstrap"), PYTHON_READER);
    let mut messages: String = (0..12).map(|n| format!("{{\"n\":{n}}}\n")).collect();
    messages.push_str("{\"oops\":true}\n");
    let (stdout, out) = run_user_stack(
        &dir,
        QUEUE_STACK,
        ("Reader", &bootstrap),
        ("Inbox", &messages),
    );
    assert!(stdout.contains("Reader/Inbox"), "{stdout}");
    let mut read: Vec<u64> = lines(&reader.join("read.jsonl"))
        .iter()
        .map(|r| r["n"].as_u64().unwrap())
        .collect();
    read.sort();
    assert_eq!(
        read,
        (0..12).collect::<Vec<u64>>(),
        "each message read once"
    );
    let dead = lines(&out.join("queues/Dead.jsonl"));
    assert_eq!(dead.len(), 1, "{stdout}");
    assert_eq!(dead[0]["body"], "{\"oops\":true}");
}

/// A bootstrap that takes a tenth of a second a batch and writes each record it was given.
const PYTHON_SLOW_WRITER: &str = r#"#!/usr/bin/env python3
import base64, json, os, time, urllib.request
api = "http://" + os.environ["AWS_LAMBDA_RUNTIME_API"] + "/2018-06-01/runtime/invocation/"
while True:
    with urllib.request.urlopen(api + "next") as r:
        request_id = r.headers["Lambda-Runtime-Aws-Request-Id"]
        event = json.load(r)
    time.sleep(0.1)
    with open("seen.jsonl", "a") as log:
        for x in event["Records"]:
            log.write(base64.b64decode(x["kinesis"]["data"]).decode() + "\n")
    urllib.request.urlopen(urllib.request.Request(api + request_id + "/response", data=b"{}", method="POST")).read()
"#;

/// ParallelizationFactor 10 makes ten batches of a shard at once; the one execution environment
/// of an external function takes them one after another, each within its timeout, and each
/// key's records reach it once and in order.
#[test]
fn concurrent_batches_of_a_parallelization_factor_wait_for_the_one_environment_in_turn() {
    let dir = scratch("lanes");
    let worker = dir.join("worker");
    std::fs::create_dir_all(&worker).unwrap();
    let bootstrap = executable(&worker.join("bootstrap"), PYTHON_SLOW_WRITER);
    let template = STACK.replace(
        "BatchSize: 10",
        "BatchSize: 3\n            ParallelizationFactor: 10",
    );
    let records: String = (0..60)
        .map(|i| format!("{{\"k\":\"key-{}\",\"n\":{i}}}\n", i % 12))
        .collect();
    std::fs::write(dir.join("template.yaml"), &template).unwrap();
    std::fs::write(dir.join("lines.jsonl"), &records).unwrap();
    let output = keyway(&[
        "local",
        "--template",
        dir.join("template.yaml").to_str().unwrap(),
        "--function",
        &format!("Worker={}", bootstrap.display()),
        "--put",
        &format!("Events={}", dir.join("lines.jsonl").display()),
        "--partition-key",
        "/k",
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(stdout.contains("function errors           0"), "{stdout}");
    let seen = lines(&worker.join("seen.jsonl"));
    assert_eq!(seen.len(), 60, "each record once: {stdout}");
    let mut last: BTreeMap<String, i64> = BTreeMap::new();
    for record in &seen {
        let n = record["n"].as_i64().unwrap();
        let key = record["k"].as_str().unwrap().to_owned();
        assert!(last.get(&key).is_none_or(|l| *l < n), "{key} out of order");
        last.insert(key, n);
    }
}

#[test]
fn a_reshard_keyway_local_cannot_make_is_refused_naming_the_flag_and_the_problem() {
    let dir = scratch("reshard-refused");
    std::fs::write(dir.join("template.yaml"), STACK).unwrap();
    std::fs::write(dir.join("lines.jsonl"), "{\"n\":1}\n{\"n\":2}\n").unwrap();
    let template = dir.join("template.yaml");
    let lines = dir.join("lines.jsonl");
    let run = |reshard: &str, put: &str| {
        let output = keyway(&[
            "local",
            "--template",
            template.to_str().unwrap(),
            "--function",
            "Worker=/bin/false",
            "--reshard",
            reshard,
            "--put",
            &format!("{put}={}", lines.display()),
        ]);
        assert!(!output.status.success());
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let queue = run("GivenUp=2", "GivenUp");
    assert!(
        queue.contains("--reshard GivenUp: not a Kinesis stream"),
        "{queue}"
    );
    let zero = run("Events=0", "Events");
    assert!(
        zero.contains("--reshard Events=0: the count is not a number of shards"),
        "{zero}"
    );
    let unput = run("Events=2", "GivenUp");
    assert!(
        unput.contains("--reshard Events: no --put file for it"),
        "{unput}"
    );
    let far = run("Events=3", "Events");
    assert!(
        far.contains("--reshard Events=3: InvalidArgumentException: TargetShardCount 3"),
        "{far}"
    );
}
