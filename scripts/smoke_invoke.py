"""Every function as a user invokes it: its package as `cargo lambda build --release` left it in
`--functions` (`<function>/bootstrap`), served by `cargo lambda watch`'s Lambda Runtime API
(`--only-lambda-apis`: watch serves the runtime APIs and this script starts the bootstrap with the
environment watch gives a function, so that the binaries a deployment ships are what answer),
invoked with `cargo lambda invoke <function> --data-file events/<function>/<payload>.json`,
against the DynamoDB tables, Kinesis streams and SQS queues of an emulator of AWS (ministack),
wired as events/README.md says.

For each function: a clean batch answers no failure and dead-letters nothing; a batch with bad
records answers no failure and dead-letters each bad record (its good records, already applied,
are skipped); and, where a batch's later key keeps state of its own (the keyed counter, the CDC
join, the keyed aggregation), the clean batch again once that key's stored state no longer
parses: the answer names that key's first record, not the batch's first, and nothing goes to the
dead-letter queue. (The identity enricher's and the merge's payloads keep state for their first
key only, where the answer could not tell one key held back from the whole batch.)

    python scripts/smoke_invoke.py --endpoint http://127.0.0.1:4566 --cargo-lambda .venv/lambda/bin/cargo-lambda \
        --functions target/lambda
"""
import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

import boto3

EVENTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "events")
PREFIX = "keyway-smoke"


@dataclass
class Invoke:
    """A payload and what it must come to: the partial batch response's failures (the sequence
    numbers of the records Lambda retries from), how many messages reach the dead-letter queue,
    and for a schedule's event its whole answer."""

    payload: str
    dead_letters: int = 0
    # Required for a schedule's event, which answers no partial batch response.
    answer: dict = None


@dataclass
class OneKeyFails:
    """The payload again once `key`'s stored state is made unreadable."""

    payload: str
    key: str


@dataclass
class Function:
    name: str
    steps: list = field(default_factory=list)
    # The package whose binary it is, when not its own.
    package: str = None


FUNCTIONS = [
    Function("keyed-counter", [
        Invoke("clean-batch.json"),
        # The record with an unknown field and the one whose data is not JSON.
        Invoke("kinesis-batch.json", dead_letters=2),
        OneKeyFails("clean-batch.json", key="user-2"),
    ]),
    Function("identity-enricher", [
        Invoke("clean-cloudtrail-batch.json"),
        Invoke("cloudtrail-batch.json", dead_letters=1),
        Invoke("feedback-batch.json"),
        # Nothing is due: a buffered record waits for its resolution up to BUFFER_TTL_SECONDS.
        Invoke("scheduled-event.json", answer={"deadLettered": 0, "due": 0, "fired": 0, "left": 0, "skipped": 0}),
    ]),
    Function("filter-policy-sync", [
        Invoke("clean-policy-changes.json"),
        # The subscription with a malformed pattern.
        Invoke("policy-changes.json", dead_letters=1),
        # The item naming another consumer than the table's.
        Invoke("own-table-changes.json", dead_letters=1),
    ]),
    Function("dynamic-filter", [
        Invoke("clean-events-batch.json"),
        # The event cut off mid-JSON and the one without a filter key.
        Invoke("events-batch.json", dead_letters=2),
    ]),
    Function("cdc-rekey", package="cdc-join", steps=[
        Invoke("clean-debezium-batch.json"),
        Invoke("debezium-batch.json", dead_letters=1),
        Invoke("users-stream-batch.json"),
        Invoke("truncate-batch.json"),
        Invoke("scheduled-event.json", answer={"tables": 1, "rows": 1}),
    ]),
    Function("cdc-join", [
        Invoke("clean-changelog-batch.json"),
        # The record of op update, which is no step.
        Invoke("changelog-batch.json", dead_letters=1),
        OneKeyFails("clean-changelog-batch.json", key="2"),
    ]),
    Function("keyed-aggregate", [
        Invoke("clean-events-batch.json"),
        # The value that is a string and the record cut off mid-JSON.
        Invoke("events-batch.json", dead_letters=2),
        # Nothing is due: a running total goes to the merge FLUSH_SECONDS after its first change.
        Invoke("scheduled-event.json", answer={"deadLettered": 0, "due": 0, "fired": 0, "left": 0, "skipped": 0}),
        OneKeyFails("clean-events-batch.json", key="page-2"),
    ]),
    Function("aggregate-merge", package="keyed-aggregate", steps=[
        Invoke("partials-batch.json"),
        Invoke("bad-partials-batch.json", dead_letters=1),
    ]),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stack:
    """The tables, streams and queues the payloads' functions are wired to."""

    def __init__(self, endpoint):
        session = boto3.session.Session(aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1")
        self.dynamodb = session.client("dynamodb", endpoint_url=endpoint)
        self.kinesis = session.client("kinesis", endpoint_url=endpoint)
        self.sqs = session.client("sqs", endpoint_url=endpoint)
        self.tables = {name: f"{PREFIX}-{name}" for name in ["state", "filter-state", "view"]}
        for table in self.tables.values():
            self.dynamodb.create_table(
                TableName=table,
                BillingMode="PAY_PER_REQUEST",
                AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}, {"AttributeName": "sk", "AttributeType": "S"}],
                KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
            )
        # The identity enricher's payloads name the streams cloudtrail and feedback, which it reads
        # and publishes resolutions to.
        self.streams = {name: name for name in ["cloudtrail", "feedback"]}
        self.streams.update({name: f"{PREFIX}-{name}" for name in ["enriched", "changelog", "joined", "partials", "results"]})
        for stream in self.streams.values():
            self.kinesis.create_stream(StreamName=stream, ShardCount=1)
        # The consumers' queues the policy payloads subscribe to, and the stack's own.
        names = ["keyway-live_events", "keyway-live_edits", "keyway-audit_trail", f"{PREFIX}-counts", f"{PREFIX}-dead-letters"]
        self.queues = {name: self.sqs.create_queue(QueueName=name)["QueueUrl"] for name in names}
        self.dead_letters = self.queues[f"{PREFIX}-dead-letters"]

    def environment(self, endpoint):
        url_prefix = self.queues["keyway-live_events"].rsplit("/", 1)[0] + "/"
        state = self.tables["state"]
        return {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "STATE_TABLE": state,
            "DEAD_LETTER_SINK": f"sqs:{self.dead_letters}",
            "COUNTS_SINK": f"sqs:{self.queues[f'{PREFIX}-counts']}",
            "EVENTS_STREAM": self.streams["cloudtrail"],
            "FEEDBACK_STREAM": self.streams["feedback"],
            "ENRICHED_SINK": f"kinesis:{self.streams['enriched']}",
            "FILTER_STATE_TABLE": self.tables["filter-state"],
            "CONSUMER_QUEUES": json.dumps({"live": ["keyway-live_events", "keyway-live_edits"], "audit": ["keyway-audit_trail"]}),
            "POLICY_TABLE_PREFIX": "keyway-policies-",
            "QUEUE_URL_PREFIX": url_prefix,
            "JOIN": "domains.user_id=users.id",
            "JOIN_KIND": "inner",
            "CHANGELOG_SINK": f"kinesis:{self.streams['changelog']}",
            "TABLE_NAMES": json.dumps({"keyway-CdcUsersTable-1A2B3C": "users"}),
            "JOINED_SINK": f"kinesis:{self.streams['joined']}",
            "VIEW_TABLE": self.tables["view"],
            "AGGREGATES": "count,sum,min,max,mean",
            "PARTIALS_SINK": f"kinesis:{self.streams['partials']}",
            "KEY_POINTER": "/key",
            "VALUE_POINTER": "/value",
            "RESULTS_SINK": f"kinesis:{self.streams['results']}",
        }

    def drain_dead_letters(self):
        """How many messages wait on the dead-letter queue; takes them off."""
        taken = 0
        while True:
            got = self.sqs.receive_message(QueueUrl=self.dead_letters, MaxNumberOfMessages=10, WaitTimeSeconds=0).get("Messages", [])
            if not got:
                return taken
            taken += len(got)
            self.sqs.delete_message_batch(QueueUrl=self.dead_letters, Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)])

    def heads(self):
        items = []
        for page in self.dynamodb.get_paginator("scan").paginate(TableName=self.tables["state"]):
            items.extend(i for i in page["Items"] if i["sk"]["S"] == "head")
        return items


def invoke(cargo_lambda, port, function, payload):
    path = os.path.join(EVENTS, function, payload)
    try:
        done = subprocess.run(
            [cargo_lambda, "lambda", "invoke", "--invoke-address", "127.0.0.1", "--invoke-port", str(port), "--data-file", path, function],
            capture_output=True, text=True, timeout=120,
        )
    except subprocess.TimeoutExpired:
        sys.exit(f"smoke: {function} did not answer events/{function}/{payload} within 120 s (its log above says why)")
    if done.returncode != 0:
        sys.exit(f"smoke: cargo lambda invoke {function} --data-file events/{function}/{payload} failed: {done.stdout}{done.stderr}")
    return json.loads(done.stdout)


def failures(answer):
    return [f["itemIdentifier"] for f in answer.get("batchItemFailures", [])]


def first_record_of(function, payload, key):
    """The first record of `key` in the payload, or the payload's first record when `key` is None."""
    with open(os.path.join(EVENTS, function, payload)) as f:
        records = json.load(f)["Records"]
    return next(r["kinesis"]["sequenceNumber"] for r in records if key in (None, r["kinesis"]["partitionKey"]))


def check_invoke(stack, cargo_lambda, port, function, step):
    answer = invoke(cargo_lambda, port, function, step.payload)
    scheduled = "Records" not in json.load(open(os.path.join(EVENTS, function, step.payload)))
    if scheduled:
        if answer != step.answer:
            sys.exit(f"smoke: {function} answered {answer} to {step.payload}, expected {step.answer}")
    elif failures(answer):
        sys.exit(f"smoke: {function} answered failures {failures(answer)} to {step.payload}, expected none")
    dead = stack.drain_dead_letters()
    if dead != step.dead_letters:
        sys.exit(f"smoke: {function} dead-lettered {dead} records of {step.payload}, expected {step.dead_letters}")
    print(f"smoke: {function} {step.payload}: {json.dumps(answer)[:100]}, {dead} dead-lettered: ok")


def check_one_key_fails(stack, cargo_lambda, port, function, step, heads_before):
    new_heads = [h for h in stack.heads() if h["pk"]["S"] not in heads_before]
    mine = [h for h in new_heads if h["pk"]["S"].endswith("#" + step.key)]
    if len(mine) != 1:
        sys.exit(f"smoke: {function} left {len(mine)} heads for key {step.key}: {[h['pk']['S'] for h in new_heads]}")
    head = mine[0]
    stack.dynamodb.put_item(TableName=stack.tables["state"], Item=dict(head, doc={"S": "{not json"}))
    answer = invoke(cargo_lambda, port, function, step.payload)
    stack.dynamodb.put_item(TableName=stack.tables["state"], Item=head)
    expected = [first_record_of(function, step.payload, step.key)]
    if expected[0] == first_record_of(function, step.payload, None):
        sys.exit(f"smoke: {step.key} owns the first record of {step.payload}: the answer could not tell it from the whole batch")
    if failures(answer) != expected:
        sys.exit(f"smoke: with {step.key}'s state unreadable, {function} answered {answer}, expected failures {expected}")
    dead = stack.drain_dead_letters()
    if dead:
        sys.exit(f"smoke: with {step.key}'s state unreadable, {function} dead-lettered {dead} records")
    print(f"smoke: {function} {step.payload} with {step.key}'s state unreadable: retried from that key's first record, {expected[0][-8:]}, alone: ok")


@contextlib.contextmanager
def watching(cargo_lambda, function, package, bootstrap, environment):
    """`cargo lambda watch`'s Lambda Runtime API for `function` on the port it yields, and the
    function's bootstrap polling it with `environment` and the variables watch gives a function
    it starts itself."""
    port = free_port()
    watch = subprocess.Popen(
        [cargo_lambda, "lambda", "watch", "--only-lambda-apis", "--invoke-port", str(port),
         "--invoke-address", "127.0.0.1", "--ignore-changes", "--quiet",
         "--manifest-path", os.path.join(EVENTS, "..", "functions", package, "Cargo.toml")],
        start_new_session=True,
    )
    served = None
    try:
        for _ in range(120):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.5)
        else:
            sys.exit(f"smoke: cargo lambda watch did not listen on port {port} within a minute")
        served = subprocess.Popen(
            [bootstrap],
            env=dict(
                environment,
                PATH=os.environ["PATH"],
                AWS_LAMBDA_RUNTIME_API=f"http://127.0.0.1:{port}/.rt/{function}",
                AWS_LAMBDA_FUNCTION_NAME=function,
                AWS_LAMBDA_FUNCTION_VERSION="1",
                AWS_LAMBDA_FUNCTION_MEMORY_SIZE="512",
            ),
            start_new_session=True,
        )
        yield port, served
    finally:
        for process in (served, watch):
            if process is not None and process.poll() is None:
                os.killpg(process.pid, 15)
                process.wait()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--cargo-lambda", required=True)
    parser.add_argument("--functions", required=True, help="cargo lambda build's folder: <function>/bootstrap")
    args = parser.parse_args()
    stack = Stack(args.endpoint)
    environment = stack.environment(args.endpoint)
    for function in FUNCTIONS:
        bootstrap = os.path.join(args.functions, function.name, "bootstrap")
        if not os.access(bootstrap, os.X_OK):
            sys.exit(f"smoke: {bootstrap} is missing: build the functions with cargo lambda build --release first")
        package = function.package or function.name
        with watching(args.cargo_lambda, function.name, package, bootstrap, environment) as (port, served):
            heads_before = {h["pk"]["S"] for h in stack.heads()}
            for step in function.steps:
                if served.poll() is not None:
                    sys.exit(f"smoke: {function.name} exited with {served.returncode} before {step.payload}")
                if isinstance(step, OneKeyFails):
                    check_one_key_fails(stack, args.cargo_lambda, port, function.name, step, heads_before)
                else:
                    check_invoke(stack, args.cargo_lambda, port, function.name, step)
    print(f"smoke: every payload of the {len(FUNCTIONS)} functions answered as it should")


if __name__ == "__main__":
    main()
