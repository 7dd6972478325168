"""The stack deployed on the AWS emulator, end to end, twice: from template.yaml and from the CDK app.

Deploys template.yaml through the emulator's CloudFormation (SAM transform) with the real
bootstrap binaries of its functions, then the CDK app's synthesized template with its assets
published as `cdk deploy` publishes them. For each stack:
- the keyed counter: clicks on its Kinesis stream give one running count per click in the counts
  queue, one dead letter per malformed click, and the counts in the state table under the
  operator's locked signature;
- the identity enricher: a role chain put on the CloudTrail stream in reverse order comes out on
  the enriched stream traced to its original actor, through the feedback stream; a record whose
  resolution never comes goes out unresolved once the buffer TTL (a stack parameter, 5 seconds
  here) has passed and the schedule has swept the timers;
- dynamic filtering: a consumer subscribes through `keyway subscriptions`, events sent to the
  events stream reach its queue as its pattern says, and after it unsubscribes, none do; the time
  from a subscription change to the first event filtered by it is measured over several changes;
- the CDC join: Debezium changes of `domains` put on the changes stream under their record keys
  (a join key moved, a row deleted, a primary key changed) and `users` written to the stack's
  DynamoDB table build a view table equal to the join of the final tables.
Failure semantics (partial batch responses, bisection, retries) are the embedded runtime's tests:
the emulator does not implement them.

Usage: e2e_ministack.py --endpoint URL --functions DIR --template PATH --cdk-out DIR --lock PATH
       --keyway PATH
(DIR holds one folder per function with its bootstrap, as `cargo lambda build` lays them out.)
"""

import argparse
import base64
import io
import json
import os
import re
import subprocess
import sys
import time
import uuid
import zipfile
import zlib

import boto3


def head_doc(item):
    """A state head's doc: JSON text, or, above a KB, deflated in `docz` (raw deflate)."""
    if "docz" in item:
        return json.loads(zlib.decompress(item["docz"]["B"], -15))
    return json.loads(item["doc"]["S"])


def client(service, endpoint):
    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )


def locked_signature(lock, operator):
    """The operator's signature as state-signatures.lock records it."""
    with open(lock) as f:
        for line in f:
            words = line.split()
            if words[:2] == ["operator", operator]:
                return words[2]
    sys.exit(f"e2e: {operator} is not in {lock}")


def wait(what, check, timeout=120.0, every=0.5):
    deadline = time.time() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.time() > deadline:
            sys.exit(f"e2e: timed out waiting for {what}")
        time.sleep(every)


def zipped(files):
    """A zip of (name, path, executable) entries, as Lambda takes a function's code."""
    code = io.BytesIO()
    with zipfile.ZipFile(code, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, path, executable in files:
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o755 if executable else 0o644) << 16
            with open(path, "rb") as f:
                archive.writestr(info, f.read())
    return code.getvalue()


# The identity enricher's buffer TTL on the deployed stacks: short, so that a record that waits
# for a resolution that never comes goes out within the test.
BUFFER_TTL_SECONDS = 5

# Keyed aggregation's running totals go to the merge this long after their first change (and
# the schedule's next sweep of the keys' timers): short, so that results come within the test.
AGGREGATE_FLUSH_SECONDS = 5
# How often the keyed aggregation decides which keys are hot: long enough that the period of the
# test's events is still among the last five (a key cools after five cool periods) when the
# results are in and a later record's batch decides it.
HOT_KEY_PERIOD_SECONDS = 30


def create_stack(cfn, stack, template, parameters=None, template_url=None):
    """Creates the stack from its template's text (or from the template's copy in S3, as a
    template over CloudFormation's 51,200 bytes must be given) and waits for it; returns its
    outputs."""
    if parameters is None:
        # The emulator's CloudFormation takes standard metric alarms only: the skew alarm, on
        # metric math, is left out (sam validate and cfn-lint check it).
        parameters = {
            "BufferTtlSeconds": str(BUFFER_TTL_SECONDS),
            "MetricMathAlarms": "false",
            "AggregateFlushSeconds": str(AGGREGATE_FLUSH_SECONDS),
            "HotKeyPeriodSeconds": str(HOT_KEY_PERIOD_SECONDS),
            "AggregateValuePointer": "/value",
            "Aggregates": "count,sum,min,max,mean",
            # The emulator runs the functions on this machine: host builds, for x86_64.
            "Architecture": "x86_64",
        }
    body = {"TemplateURL": template_url} if template_url else {"TemplateBody": template}
    cfn.create_stack(
        StackName=stack,
        Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in parameters.items()],
        Capabilities=["CAPABILITY_IAM", "CAPABILITY_AUTO_EXPAND"],
        **body,
    )

    def created():
        status = cfn.describe_stacks(StackName=stack)["Stacks"][0]
        if status["StackStatus"].endswith("FAILED") or "ROLLBACK" in status["StackStatus"]:
            events = cfn.describe_stack_events(StackName=stack)["StackEvents"]
            reasons = [e.get("ResourceStatusReason") for e in events if e.get("ResourceStatusReason")]
            sys.exit(f"e2e: stack {status['StackStatus']}: {reasons[:5]}")
        return status if status["StackStatus"] == "CREATE_COMPLETE" else None

    outputs = {o["OutputKey"]: o["OutputValue"] for o in wait("the stack", created)["Outputs"]}
    print(f"e2e: stack {stack} created: {outputs}")
    return outputs


def deploy_sam(endpoint, template_path, functions, stack):
    """template.yaml through the emulator's SAM transform, each function's CodeUri pointing at its
    binary (the one its Metadata names, as `sam build` picks it), and the template itself put in
    the same bucket, as `sam deploy` puts a template over the 51,200 bytes CloudFormation takes
    inline."""
    s3 = client("s3", endpoint)
    bucket = f"{stack}-code"
    s3.create_bucket(Bucket=bucket)
    with open(template_path) as f:
        template = f.read()

    def code_of(match):
        binary = match.group(1)
        bootstrap = os.path.join(functions, binary, "bootstrap")
        s3.put_object(Bucket=bucket, Key=f"{binary}.zip", Body=zipped([("bootstrap", bootstrap, True)]))
        return f"Binary: {binary}\n{match.group(2)}CodeUri: s3://{bucket}/{binary}.zip\n"

    template, functions_found = re.subn(r"Binary: (\S+)\n(\s+Properties:\n\s+)CodeUri: \S+\n", code_of, template)
    if functions_found != template.count("BuildMethod: rust-cargolambda"):
        sys.exit("e2e: template.yaml's functions no longer read 'Binary: ... Properties: CodeUri: ...'; update this script")
    s3.put_object(Bucket=bucket, Key="template.yaml", Body=template.encode())
    template_url = f"{endpoint}/{bucket}/template.yaml"
    return create_stack(client("cloudformation", endpoint), stack, None, template_url=template_url)


def deploy_cdk(endpoint, cdk_out, stack):
    """The CDK app's synthesized stack, its assets published as `cdk deploy` publishes them: each
    function's code zipped, and the template itself (over the 51,200 bytes CloudFormation takes
    inline) copied, into the bootstrap bucket under the key the manifest names."""
    with open(os.path.join(cdk_out, "keyway.assets.json")) as f:
        manifest = json.load(f)
    s3 = client("s3", endpoint)
    made = set()
    template_url = None
    for asset in manifest["files"].values():
        source = os.path.join(cdk_out, asset["source"]["path"])
        if asset["source"]["packaging"] == "zip":
            files = [
                (os.path.relpath(os.path.join(d, n), source), os.path.join(d, n), os.access(os.path.join(d, n), os.X_OK))
                for d, _, names in os.walk(source)
                for n in names
            ]
            body = zipped(files)
        else:
            with open(source, "rb") as f:
                body = f.read()
        for destination in asset["destinations"].values():
            bucket = destination["bucketName"].replace("${AWS::AccountId}", "000000000000").replace("${AWS::Region}", "us-east-1")
            if bucket not in made:
                s3.create_bucket(Bucket=bucket)
                made.add(bucket)
            s3.put_object(Bucket=bucket, Key=destination["objectKey"], Body=body)
            if asset["source"]["path"] == "keyway.template.json":
                template_url = f"{endpoint}/{bucket}/{destination['objectKey']}"
    if template_url is None:
        sys.exit("e2e: the CDK assets manifest names no keyway.template.json")
    return create_stack(client("cloudformation", endpoint), stack, None, template_url=template_url)


def deploy_consumer(endpoint, template_path, stack, outputs, consumer):
    """A consumer's own stack (consumer.yaml, or the CDK app's keyway-consumer stack), deployed
    with the keyway stack's outputs as its owner would."""
    with open(template_path) as f:
        template = f.read()
    parameters = {
        "Consumer": consumer,
        "PolicyTablePrefix": outputs["PolicyTablePrefix"],
        "PolicySyncFunctionArn": outputs["FilterPolicySyncFunctionArn"],
        "FailedBatchesQueueArn": outputs["FailedBatchesQueueArn"],
    }
    return create_stack(client("cloudformation", endpoint), f"{stack}-{consumer}", template, parameters)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--functions", required=True, help="one folder per function with its bootstrap")
    parser.add_argument("--template", required=True)
    parser.add_argument("--consumer-template", required=True, help="a consumer's own stack")
    parser.add_argument("--cdk-out", required=True)
    parser.add_argument("--lock", required=True)
    parser.add_argument("--keyway", required=True, help="the keyway command, which derives output ids")
    args = parser.parse_args()
    run = uuid.uuid4().hex[:8]
    signature = locked_signature(args.lock, "keyed-counter")

    stack = f"keyway-e2e-sam-{run}"
    outputs = deploy_sam(args.endpoint, args.template, args.functions, stack)
    check(args.endpoint, stack, outputs, signature, args.keyway)
    check_operations(args.endpoint, stack, outputs)
    check_identity(args.endpoint, stack, outputs)
    consumer = deploy_consumer(args.endpoint, args.consumer_template, stack, outputs, "live")
    check_filter(args.endpoint, stack, outputs, consumer, args.keyway)
    check_cdc(args.endpoint, stack, outputs)
    check_aggregation(args.endpoint, stack, outputs)
    delete(args.endpoint, f"{stack}-live")
    delete(args.endpoint, stack)
    stack = f"keyway-e2e-cdk-{run}"
    outputs = deploy_cdk(args.endpoint, args.cdk_out, stack)
    check(args.endpoint, stack, outputs, signature, args.keyway)
    check_operations(args.endpoint, stack, outputs)
    check_identity(args.endpoint, stack, outputs)
    consumer_template = os.path.join(args.cdk_out, "keyway-consumer.template.json")
    consumer = deploy_consumer(args.endpoint, consumer_template, stack, outputs, "live")
    check_filter(args.endpoint, stack, outputs, consumer, args.keyway)
    check_cdc(args.endpoint, stack, outputs)
    check_aggregation(args.endpoint, stack, outputs)
    delete(args.endpoint, f"{stack}-live")
    delete(args.endpoint, stack)


def delete(endpoint, stack):
    client("cloudformation", endpoint).delete_stack(StackName=stack)


def output_ids(keyway, stream, positions):
    """The ids the keyed counter derives for records at `positions` (shard, sequence number)."""
    lines = "".join(
        json.dumps({"operator": "keyed-counter", "sink": "counts", "origin": f"{stream}/{shard}", "sequence": seq}) + "\n"
        for shard, seq in positions
    )
    done = subprocess.run([keyway, "ids"], input=lines, capture_output=True, text=True, check=True)
    return done.stdout.split()


def check(endpoint, stack, outputs, signature, keyway):
    """Puts clicks on the stack's stream and checks what the deployed function made of them: each
    user's stored count, every running count under the id derived from its record, the two
    malformed records as dead letters, and no batch given up."""
    # Clicks of ten users, two malformed records among them.
    kinesis = client("kinesis", endpoint)
    clicks = [f"user-{i % 10}" for i in range(200)]
    records = [{"PartitionKey": key, "Data": json.dumps({"key": key}).encode()} for key in clicks]
    records += [{"PartitionKey": "user-x", "Data": b"{not json"}, {"PartitionKey": "user-y", "Data": b'{"key": 7}'}]
    positions = []
    for start in range(0, len(records), 100):
        response = kinesis.put_records(StreamName=outputs["ClicksStreamName"], Records=records[start : start + 100])
        if response.get("FailedRecordCount"):
            sys.exit(f"e2e: the stream refused records: {response}")
        positions += [(r["ShardId"], r["SequenceNumber"]) for r in response["Records"]]

    sqs = client("sqs", endpoint)

    def drain(url, seen):
        messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"]).get("Messages", [])
        for m in messages:
            seen.append(m)
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        return messages

    updates = []
    def all_counted():
        drain(outputs["CountsQueueUrl"], updates)
        return len({m["MessageAttributes"]["outputId"]["StringValue"] for m in updates}) >= len(clicks)

    wait("a running count for every click", all_counted, timeout=180)
    by_id = {}
    for m in updates:
        body = json.loads(m["Body"])
        by_id.setdefault(m["MessageAttributes"]["outputId"]["StringValue"], set()).add((body["key"], body["count"]))
    expected_ids = set(output_ids(keyway, outputs["ClicksStreamName"], positions[: len(clicks)]))
    if set(by_id) != expected_ids:
        sys.exit(f"e2e: {len(set(by_id) - expected_ids)} unknown and {len(expected_ids - set(by_id))} missing output ids")
    if any(len(bodies) != 1 for bodies in by_id.values()):
        sys.exit("e2e: an output id came with two different bodies")
    runs = {}
    for (key, count), in by_id.values():
        runs.setdefault(key, []).append(count)
    if any(sorted(counts) != list(range(1, 21)) for counts in runs.values()) or len(runs) != 10:
        sys.exit(f"e2e: each user's running counts should be 1..20: {runs}")

    letters = []
    wait("two dead letters", lambda: drain(outputs["DeadLetterQueueUrl"], letters) is not None and len(letters) >= 2, timeout=60)
    dead = sorted((json.loads(m["Body"])["sequenceNumber"], json.loads(m["Body"])["field"]) for m in letters)
    malformed = sorted((seq, "data") for _, seq in positions[len(clicks) :])
    if dead != malformed:
        sys.exit(f"e2e: dead letters {dead}, expected the malformed records {malformed}")

    failed = []
    drain(outputs["FailedBatchesQueueUrl"], failed)
    if failed:
        sys.exit(f"e2e: batches were given up: {[m['Body'] for m in failed]}")

    # State lives under the operator's locked signature; beside it, the operator's signature
    # history (one item of its own) records that this signature is the one deployed.
    dynamodb = client("dynamodb", endpoint)
    items = dynamodb.scan(TableName=outputs["StateTableName"], ConsistentRead=True)["Items"]
    heads = [i for i in items if i["sk"]["S"] == "head" and i["pk"]["S"].startswith(f"keyed-counter#{signature}#")]
    stored = {i["pk"]["S"].rsplit("#", 1)[1]: head_doc(i)["slots"]["count"]["e"][0] for i in heads}
    if stored != {f"user-{i}": 20 for i in range(10)}:
        sys.exit(f"e2e: stored counts {stored}, expected 20 for each of the 10 users")
    history = [i for i in items if i["pk"]["S"] == "keyed-counter#signature-history#signature-history"]
    if len(history) != 1 or signature not in json.dumps(history[0]):
        sys.exit(f"e2e: the signature history does not record {signature}: {history}")
    others = [i["pk"]["S"] for i in items if i not in heads and i not in history and i["sk"]["S"] == "head"]
    if others:
        sys.exit(f"e2e: unexpected keys in the state table: {others}")

    print(f"e2e: {stack}: {len(clicks)} clicks counted, each output under its derived id, 20 stored for each user, the 2 malformed records dead-lettered, no batch given up: ok")



def cloudtrail(event_id, caller, event_name, issues=None):
    """A CloudTrail record of account 111111111111; `issues` (role, key) for an AssumeRole."""
    record = {
        "eventVersion": "1.08",
        "userIdentity": caller,
        "eventTime": "2026-01-01T00:00:00Z",
        "eventSource": "sts.amazonaws.com",
        "eventName": event_name,
        "awsRegion": "us-east-1",
        "eventID": event_id,
        "recipientAccountId": "111111111111",
    }
    if issues:
        role, key = issues
        record["requestParameters"] = {"roleArn": f"arn:aws:iam::111111111111:role/{role}", "roleSessionName": f"{role}-session"}
        record["responseElements"] = {"credentials": {"accessKeyId": key, "expiration": "Jan 1, 2099, 1:00:00 AM", "sessionToken": "token"}}
    return record


def role_session(key, role):
    return {
        "type": "AssumedRole",
        "principalId": f"AROA{role.upper()}:{role}-session",
        "arn": f"arn:aws:sts::111111111111:assumed-role/{role}/{role}-session",
        "accountId": "111111111111",
        "accessKeyId": key,
        "sessionContext": {"sessionIssuer": {"type": "Role", "arn": f"arn:aws:iam::111111111111:role/{role}", "accountId": "111111111111", "userName": role}},
    }


def read_stream(kinesis, stream):
    """Every record of `stream` so far, as JSON."""
    records = []
    for shard in kinesis.list_shards(StreamName=stream)["Shards"]:
        iterator = kinesis.get_shard_iterator(StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        while iterator:
            response = kinesis.get_records(ShardIterator=iterator, Limit=1000)
            records += [json.loads(r["Data"]) for r in response["Records"]]
            if not response["Records"]:
                break
            iterator = response.get("NextShardIterator")
    return records


# The functions a stream triggers, each with an alarm on its iterator age.
STREAM_FUNCTIONS = ["KeyedCounter", "IdentityEnricher", "FilterPolicySync", "DynamicFilter", "CdcRekey", "CdcJoin", "KeyedAggregate", "AggregateMerge"]


def check_operations(endpoint, stack, outputs):
    """The stack's alarms as deployed: one on each stream-triggered function's iterator age and no
    skew alarm (MetricMathAlarms is false here); and the keyed counter's metric lines: clicks of
    one user nine times in ten make a line that names that user the batch's heaviest key."""
    cfn = client("cloudformation", endpoint)
    resources = {r["LogicalResourceId"]: r["PhysicalResourceId"] for r in cfn.describe_stack_resources(StackName=stack)["StackResources"]}
    if "KeyedCounterSkewAlarm" in resources:
        sys.exit("e2e: the skew alarm was created though MetricMathAlarms is false")
    alarms = client("cloudwatch", endpoint).describe_alarms()["MetricAlarms"]
    for name in STREAM_FUNCTIONS:
        function = resources[f"{name}Function"]
        on_age = [
            a for a in alarms
            if a.get("MetricName") == "IteratorAge" and a.get("Namespace") == "AWS/Lambda"
            and {"Name": "FunctionName", "Value": function} in a.get("Dimensions", [])
        ]
        if len(on_age) != 1 or on_age[0]["Threshold"] != 300000 or on_age[0]["Statistic"] != "Maximum":
            sys.exit(f"e2e: {name}: expected one alarm on the maximum IteratorAge above 300000 ms, found {on_age}")
    print(f"e2e: {stack}: an iterator-age alarm on each of the {len(STREAM_FUNCTIONS)} stream-triggered functions, no skew alarm: ok")
    for name in STREAM_FUNCTIONS:
        function = resources[f"{name}Function"]
        for metric in ("Errors", "Throttles"):
            found = [
                a for a in alarms
                if a.get("MetricName") == metric and a.get("Namespace") == "AWS/Lambda"
                and {"Name": "FunctionName", "Value": function} in a.get("Dimensions", [])
            ]
            if len(found) != 1 or found[0]["Threshold"] != 0 or found[0]["Statistic"] != "Sum":
                sys.exit(f"e2e: {name}: expected one alarm on the sum of its {metric} above 0, found {found}")
    for queue in ("DeadLetterQueue", "FailedBatchesQueue"):
        queue_name = resources[queue].rstrip("/").rsplit("/", 1)[-1]
        found = [
            a for a in alarms
            if a.get("MetricName") == "ApproximateNumberOfMessagesVisible" and a.get("Namespace") == "AWS/SQS"
            and {"Name": "QueueName", "Value": queue_name} in a.get("Dimensions", [])
        ]
        if len(found) != 1:
            sys.exit(f"e2e: {queue}: expected one alarm on the messages it holds, found {found}")
    print(f"e2e: {stack}: error and throttle alarms on each function, depth alarms on both failure queues: ok")
    board = client("cloudwatch", endpoint).get_dashboard(DashboardName=resources["Dashboard"])
    text = json.dumps(json.loads(board["DashboardBody"]))
    missing = [name for name in STREAM_FUNCTIONS if f'"{resources[f"{name}Function"]}"' not in text]
    if missing or "${" in text:
        sys.exit(f"e2e: the dashboard does not graph {missing}, or left a substitution: {text[:500]}")
    print(f"e2e: {stack}: the dashboard graphs each of the {len(STREAM_FUNCTIONS)} functions: ok")

    kinesis = client("kinesis", endpoint)
    keys = ["skew-hot" if i % 10 else f"skew-{i}" for i in range(100)]
    records = [{"PartitionKey": key, "Data": json.dumps({"key": key}).encode()} for key in keys]
    response = kinesis.put_records(StreamName=outputs["ClicksStreamName"], Records=records)
    if response.get("FailedRecordCount"):
        sys.exit(f"e2e: the stream refused records: {response}")
    function = resources["KeyedCounterFunction"]
    logs = client("logs", endpoint)
    # Each function writes to the log group of its own the stack creates, which its role may write.
    log_group = client("lambda", endpoint).get_function_configuration(FunctionName=function)["LoggingConfig"]["LogGroup"]
    if log_group != resources["KeyedCounterFunctionLogGroup"]:
        sys.exit(f"e2e: the keyed counter logs to {log_group}, not to its stack's log group {resources['KeyedCounterFunctionLogGroup']}")

    def hot_line():
        try:
            events = logs.filter_log_events(logGroupName=log_group)["events"]
        except logs.exceptions.ResourceNotFoundException:
            return None
        for event in events:
            try:
                line = json.loads(event["message"])
            except ValueError:
                continue
            if not isinstance(line, dict) or "_aws" not in line:
                continue
            heaviest = (line.get("HotKeys") or [{}])[0]
            if heaviest.get("key") == "skew-hot":
                return line
        return None

    line = wait("a metric line naming the hot key", hot_line, timeout=120)
    namespaces = [m["Namespace"] for m in line["_aws"]["CloudWatchMetrics"]]
    if (line["Function"], line["Operator"], namespaces) != (function, "keyed-counter", ["keyway"]) or not line["Shard"].startswith("shardId-"):
        sys.exit(f"e2e: the metric line does not name the function, operator and shard: {line}")
    if line["HottestKeyRecords"] < 2 or line["HotKeys"][0]["records"] != line["HottestKeyRecords"]:
        sys.exit(f"e2e: the metric line's heaviest key does not carry the batch: {line}")
    print(f"e2e: {stack}: the keyed counter's metric line names skew-hot, {int(line['HottestKeyRecords'])} of {int(line['Records'])} records on {line['Shard']}: ok")


def check_aggregation(endpoint, stack, outputs):
    """Events of a hot key spread over eight buckets (key#0 .. key#7) and of cold keys under their
    own: once the running totals are flushed and merged, each key's last result on the results
    stream is its exact count, sum, minimum, maximum and mean."""
    kinesis = client("kinesis", endpoint)
    oracle = {}
    records = []
    for i in range(80):
        key = "hot" if i % 2 == 0 else f"cold-{i % 5}"
        value = (i % 7) / 4 - 0.5
        partition = f"hot#{(i // 2) % 8}" if key == "hot" else key
        oracle.setdefault(key, []).append(value)
        records.append({"PartitionKey": partition, "Data": json.dumps({"key": key, "value": value}).encode()})
    response = kinesis.put_records(StreamName=outputs["AggregateEventsStreamName"], Records=records)
    if response.get("FailedRecordCount"):
        sys.exit(f"e2e: the stream refused records: {response}")
    expected = {}
    for key, values in oracle.items():
        expected[key] = {"key": key, "count": len(values), "sum": sum(values), "min": min(values), "max": max(values), "mean": sum(values) / len(values)}
    stream = outputs["AggregateResultsStreamName"]

    def results():
        last = {}
        for shard in kinesis.list_shards(StreamName=stream)["Shards"]:
            iterator = kinesis.get_shard_iterator(StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
            for record in kinesis.get_records(ShardIterator=iterator, Limit=10000)["Records"]:
                body = json.loads(record["Data"])
                last[body["key"]] = body
        return last if last == expected else None

    started = time.time()
    wait("each key's merged result", results, timeout=240, every=2)
    print(f"e2e: {stack}: {len(records)} events of a key salted over 8 buckets and 5 cold keys aggregated exactly after {time.time() - started:.0f} s: ok")
    check_hot_key_registry(endpoint, stack, outputs, kinesis)


def check_hot_key_registry(endpoint, stack, outputs, kinesis):
    """The hot key carried half of the events: once its period has ended, the next batch's report
    decides it, and the registry producers read lists it (the keys the function judged are its
    buckets' own key, not the buckets)."""
    dynamodb = client("dynamodb", endpoint)
    kinesis.put_record(StreamName=outputs["AggregateEventsStreamName"], PartitionKey="tick",
                       Data=json.dumps({"key": "tick", "value": 1}).encode())

    def listed():
        item = dynamodb.get_item(TableName=outputs["HotKeysTableName"], ConsistentRead=True,
                                 Key={"pk": {"S": "keyed-aggregate#hot"}, "sk": {"S": "hot"}}).get("Item")
        keys = sorted((item or {}).get("keys", {}).get("M", {}))
        return keys if "hot" in keys else None

    started = time.time()
    keys = wait("the hot key in the registry", listed, timeout=120, every=2)
    # Each cold key carries a tenth of so few events: above the 5% that makes a key hot too.
    if "hot" not in keys or any("#" in key for key in keys):
        sys.exit(f"e2e: the registry lists {keys}, expected the hot key and no bucket")
    print(f"e2e: {stack}: the hot-key registry lists the hot key {time.time() - started:.0f} s after a later record: ok")


def check_identity(endpoint, stack, outputs):
    """The article's role chain put in reverse order, and a record whose key nobody issued: the
    chain comes out traced to Alice through the feedback stream, the orphan unresolved once its
    timer is swept."""
    kinesis = client("kinesis", endpoint)
    alice = {"type": "IAMUser", "principalId": "AIDAALICE", "arn": "arn:aws:iam::111111111111:user/alice", "accountId": "111111111111", "accessKeyId": "AKIAALICE", "userName": "alice"}
    chain = [
        cloudtrail("1-alice-assumes-role-1", alice, "AssumeRole", ("role-1", "ASIA1")),
        cloudtrail("2-action-with-asia1", role_session("ASIA1", "role-1"), "ListBuckets"),
        cloudtrail("3-role-1-assumes-role-2", role_session("ASIA1", "role-1"), "AssumeRole", ("role-2", "ASIA2")),
        cloudtrail("4-snapshot-with-asia2", role_session("ASIA2", "role-2"), "CreateDBSnapshot"),
    ]
    orphan = cloudtrail("5-orphan", role_session("ASIA9", "role-9"), "ListBuckets")
    put = time.time()
    for record in list(reversed(chain)) + [orphan]:
        key = f"111111111111#{record['userIdentity']['accessKeyId']}"
        kinesis.put_record(StreamName=outputs["CloudTrailStreamName"], PartitionKey=key, Data=json.dumps(record).encode())

    def enriched():
        by_event = {r["eventID"]: r for r in read_stream(kinesis, outputs["EnrichedStreamName"])}
        return by_event if len(by_event) >= 5 else None

    # The orphan waits the buffer TTL, then up to a minute for the schedule's next sweep.
    out = wait("every record enriched, the orphan swept out", enriched, timeout=BUFFER_TTL_SECONDS + 150, every=2)
    for record in chain:
        enrichment = out[record["eventID"]]["enrichment"]
        if enrichment["status"] != "resolved" or enrichment["originalActor"]["arn"] != alice["arn"]:
            sys.exit(f"e2e: {record['eventID']} is not traced to Alice: {enrichment}")
    keys = [link["accessKeyId"] for link in out["4-snapshot-with-asia2"]["enrichment"]["roleChain"]]
    if keys != ["ASIA1", "ASIA2"]:
        sys.exit(f"e2e: the snapshot's role chain is {keys}, expected ASIA1 then ASIA2")
    if out["5-orphan"]["enrichment"]["status"] != "unresolved":
        sys.exit(f"e2e: the orphan should go out unresolved: {out['5-orphan']['enrichment']}")
    print(f"e2e: {stack}: a role chain put in reverse order traced to Alice, the orphan unresolved after {time.time() - put:.0f} s: ok")


# Changes whose propagation is measured on each stack.
PROPAGATION_SAMPLES = 8


def check_filter(endpoint, stack, outputs, consumer, keyway):
    """A consumer's subscription made and removed through `keyway subscriptions` in the policy
    table of its own stack (`consumer`'s outputs): the events its pattern matches reach its queue,
    the others and those after it unsubscribed do not. Then the propagation of changes: after each
    subscription to a fresh key, events of that key go out every 50 ms; the first to arrive gives
    the time from the write to the first event the new policy filtered. Then a subscription in
    the shared table, and one in the consumer's table that names another consumer, which the
    policy sync dead-letters."""
    sqs = client("sqs", endpoint)
    kinesis = client("kinesis", endpoint)
    # Named with the stack's ConsumerQueuePrefix, the consumer's id and an underscore: the queues
    # a consumer owns, and the only ones the dynamic filter's role may send to.
    queue = f"keyway-live_{uuid.uuid4().hex[:8]}"
    url = sqs.create_queue(QueueName=queue)["QueueUrl"]
    team_queue = f"keyway-team_{uuid.uuid4().hex[:8]}"
    team_url = sqs.create_queue(QueueName=team_queue)["QueueUrl"]
    env = dict(os.environ, AWS_ENDPOINT_URL=endpoint, AWS_REGION="us-east-1", AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test")

    def subscriptions(*args, table=consumer["PolicyTableName"], who="live"):
        command = [keyway, "subscriptions", "--table", table, "--consumer", who, *args]
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"e2e: keyway subscriptions {' '.join(args)}: {done.stderr}")
        return done.stdout

    def send(key, event_id, op="update"):
        event = {"id": event_id, "key": key, "op": op, "sent": time.time()}
        kinesis.put_record(StreamName=outputs["FilterEventsStreamName"], PartitionKey=key, Data=json.dumps(event).encode())

    def received(at=url):
        messages = sqs.receive_message(QueueUrl=at, MaxNumberOfMessages=10).get("Messages", [])
        for m in messages:
            sqs.delete_message(QueueUrl=at, ReceiptHandle=m["ReceiptHandle"])
        return [json.loads(m["Body"]) for m in messages]

    def first_arrival(key, written, prefix, at=url):
        """Sends events of `key` every 50 ms until one arrives at `at`; returns the seconds from
        `written` to the sending of the first that arrived."""
        deadline = written + 60
        n = 0
        while time.time() < deadline:
            send(key, f"{prefix}-{n}")
            n += 1
            time.sleep(0.05)
            arrived = [e for e in received(at) if e["key"] == key]
            if arrived:
                return min(e["sent"] for e in arrived) - written
        sys.exit(f"e2e: no event of {key} arrived within a minute of its subscription")

    subscriptions("subscribe", "--key", "sheet-1", "--queue", queue, "--pattern", json.dumps({"op": ["update"]}))
    first_arrival("sheet-1", time.time(), "warm-up")
    send("sheet-1", "a", "update")
    send("sheet-1", "b", "delete")
    send("sheet-2", "c", "update")
    got = []
    wait("the matching event", lambda: got.extend(e["id"] for e in received()) or "a" in got, timeout=60)
    time.sleep(2)
    got += [e["id"] for e in received()]
    if sorted(i for i in got if not i.startswith("warm-up")) != ["a"]:
        sys.exit(f"e2e: the queue received {got}, expected only a")
    listed = subscriptions("list")
    if '"sheet-1"' not in listed:
        sys.exit(f"e2e: keyway subscriptions list shows {listed}")

    subscriptions("unsubscribe", "--key", "sheet-1")
    unsubscribed = time.time()
    # Events sent until the removal reaches the filter may still arrive; after 5 s none may.
    time.sleep(5)
    received()
    send("sheet-1", "d", "update")
    time.sleep(3)
    late = [e["id"] for e in received()]
    if late:
        sys.exit(f"e2e: events arrived {time.time() - unsubscribed:.0f} s after unsubscribing: {late}")

    latencies = []
    for i in range(PROPAGATION_SAMPLES):
        key = f"probe-{uuid.uuid4().hex[:6]}"
        subscriptions("subscribe", "--key", key, "--queue", queue)
        latencies.append(first_arrival(key, time.time(), f"probe-{i}"))
        subscriptions("unsubscribe", "--key", key)
    latencies.sort()
    p95 = latencies[min(len(latencies) - 1, round(0.95 * (len(latencies) - 1)))]

    shared_key = f"shared-{uuid.uuid4().hex[:6]}"
    shared_table = outputs["PolicyTableName"]
    subscriptions("subscribe", "--key", shared_key, "--queue", team_queue, table=shared_table, who="team")
    first_arrival(shared_key, time.time(), "shared", at=team_url)
    subscriptions("unsubscribe", "--key", shared_key, table=shared_table, who="team")

    dead = outputs["DeadLetterQueueUrl"]
    dead_name = dead.rstrip("/").rsplit("/", 1)[-1]
    # The intruder names a queue of its own, which the client accepts: the policy sync refuses the
    # item for naming another consumer than its table's.
    subscriptions("subscribe", "--key", "sheet-9", "--queue", "keyway-intruder_x", who="intruder")
    # A hostile consumer writing the shared table by hand (the client would refuse it): live's
    # queue, and the stack's dead-letter queue.
    dynamodb = client("dynamodb", endpoint)
    for n, target in enumerate([queue, dead_name]):
        item = {
            "consumer": {"S": "mallory"},
            "subscription": {"S": f"key#loot-{n}"},
            "filterKey": {"S": f"loot-{n}"},
            "queue": {"S": target},
        }
        dynamodb.put_item(TableName=shared_table, Item=item)
    letters = []

    def refused():
        for m in sqs.receive_message(QueueUrl=dead, MaxNumberOfMessages=10).get("Messages", []):
            sqs.delete_message(QueueUrl=dead, ReceiptHandle=m["ReceiptHandle"])
            letters.append(json.loads(m["Body"]))
        intruder = any(
            letter.get("field") == "consumer" and 'of consumer "live"' in letter.get("problem", "") for letter in letters
        )
        stolen = [
            letter for letter in letters
            if letter.get("field") == "queue" and 'not a queue of consumer "mallory"' in letter.get("problem", "")
        ]
        return intruder and len(stolen) == 2

    wait("the dead letters of another consumer's subscription in live's table and of mallory's two", refused, timeout=60)
    for n in range(2):
        send(f"loot-{n}", f"loot-{n}")
    time.sleep(3)
    stray = [e["id"] for e in received() if e["id"].startswith("loot")]
    refused()
    events_in_dead = [letter for letter in letters if "field" not in letter]
    if stray or events_in_dead:
        sys.exit(f"e2e: mallory's subscriptions delivered: to live {stray}, to the dead-letter queue {events_in_dead}")
    print(
        f"e2e: {stack}: subscribed, filtered and unsubscribed through keyway subscriptions in the "
        "consumer's own table and in the shared one, another consumer's subscription in it refused, "
        "a hostile consumer's subscriptions to live's queue and to the dead-letter queue refused: ok; "
        f"propagation over {len(latencies)} changes: p50 {latencies[len(latencies) // 2] * 1000:.0f} ms, "
        f"p95 {p95 * 1000:.0f} ms, max {latencies[-1] * 1000:.0f} ms"
    )



def debezium(op, before, after):
    """A Debezium change event of `domains` (PostgreSQL, no schema envelope)."""
    source = {"connector": "postgresql", "db": "app", "schema": "public", "table": "domains", "snapshot": "false"}
    return {"before": before, "after": after, "source": source, "op": op, "ts_ms": 1767225600000}


def check_cdc(endpoint, stack, outputs):
    """Debezium changes of `domains` on the changes stream, `users` in the stack's DynamoDB table:
    the view table ends as the inner join domains.user_id = users.id of the final tables."""
    kinesis = client("kinesis", endpoint)
    dynamodb = client("dynamodb", endpoint)
    users_table = outputs["CdcUsersTableName"]
    users = {1: "alice", 2: "bob", 3: "carol"}
    for uid, name in users.items():
        dynamodb.put_item(TableName=users_table, Item={"id": {"N": str(uid)}, "name": {"S": name}})
    dynamodb.put_item(TableName=users_table, Item={"id": {"N": "2"}, "name": {"S": "robert"}})
    dynamodb.delete_item(TableName=users_table, Key={"id": {"N": "3"}})
    users = {1: {"id": 1, "name": "alice"}, 2: {"id": 2, "name": "robert"}}

    def domain(did, uid):
        return {"id": did, "name": f"d{did}.example", "user_id": uid}

    changes = [
        (101, debezium("c", None, domain(101, 1))),
        (102, debezium("c", None, domain(102, 2))),
        (103, debezium("c", None, domain(103, 3))),
        (104, debezium("c", None, domain(104, 1))),
        # The join key moves: domain 101 to user 2.
        (101, debezium("u", domain(101, 1), domain(101, 2))),
        (104, debezium("d", domain(104, 1), None)),
        (104, None),
        # The primary key changes: 102 becomes 105, as Debezium sends it.
        (102, debezium("d", domain(102, 2), None)),
        (102, None),
        (105, debezium("c", None, domain(105, 2))),
    ]
    for did, value in changes:
        data = b"" if value is None else json.dumps(value).encode()
        kinesis.put_record(StreamName=outputs["CdcChangesStreamName"], PartitionKey=json.dumps({"id": did}), Data=data)
    domains = {101: domain(101, 2), 103: domain(103, 3), 105: domain(105, 2)}
    expected = sorted(
        (str(did), str(row["user_id"]), json.dumps(row, sort_keys=True), json.dumps(users[row["user_id"]], sort_keys=True))
        for did, row in domains.items()
        if row["user_id"] in users
    )

    def view():
        items = dynamodb.scan(TableName=outputs["CdcViewTableName"], ConsistentRead=True)["Items"]
        rows = sorted(
            (i["pk"]["S"], i["sk"]["S"], json.dumps(json.loads(i["left"]["S"]), sort_keys=True), json.dumps(json.loads(i["right"]["S"]), sort_keys=True))
            for i in items
            if "deleted" not in i and "omitted" not in i
        )
        return rows

    put = time.time()
    got = view()
    while got != expected:
        if time.time() > put + 120:
            sys.exit(f"e2e: {stack}: the CDC view is {got}, the join of the final tables {expected}")
        time.sleep(1)
        got = view()
    print(f"e2e: {stack}: the CDC view equals the join of the final tables ({len(got)} rows) after {time.time() - put:.1f} s: ok")


if __name__ == "__main__":
    main()
