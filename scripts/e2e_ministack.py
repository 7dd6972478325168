"""The stack of template.yaml deployed on the AWS emulator, end to end.

Deploys template.yaml through the emulator's CloudFormation (SAM transform) with the real
keyed-counter bootstrap binary, puts clicks on the stack's Kinesis stream, and checks what comes
out: one running count per click in the counts queue, one dead letter per malformed click, and the
counts in the state table. Failure semantics (partial batch responses, bisection, retries) are the
embedded runtime's tests: the emulator does not implement them.

Usage: e2e_ministack.py --endpoint URL --bootstrap PATH --template PATH --lock PATH
"""

import argparse
import base64
import io
import json
import sys
import time
import uuid
import zipfile

import boto3


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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--template", required=True)
    parser.add_argument("--lock", required=True)
    args = parser.parse_args()
    run = uuid.uuid4().hex[:8]

    # The function's code: the bootstrap binary, zipped, in the emulator's S3.
    code = io.BytesIO()
    with zipfile.ZipFile(code, "w", zipfile.ZIP_DEFLATED) as archive:
        info = zipfile.ZipInfo("bootstrap")
        info.external_attr = 0o755 << 16
        with open(args.bootstrap, "rb") as binary:
            archive.writestr(info, binary.read())
    s3 = client("s3", args.endpoint)
    bucket = f"keyway-code-{run}"
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="keyed-counter.zip", Body=code.getvalue())

    with open(args.template) as f:
        template = f.read()
    if "CodeUri: .\n" not in template:
        sys.exit("e2e: template.yaml no longer has 'CodeUri: .'; update this script")
    template = template.replace("CodeUri: .\n", f"CodeUri: s3://{bucket}/keyed-counter.zip\n")

    cfn = client("cloudformation", args.endpoint)
    stack = f"keyway-e2e-{run}"
    cfn.create_stack(StackName=stack, TemplateBody=template, Capabilities=["CAPABILITY_IAM", "CAPABILITY_AUTO_EXPAND"])

    def created():
        status = cfn.describe_stacks(StackName=stack)["Stacks"][0]
        if status["StackStatus"].endswith("FAILED") or "ROLLBACK" in status["StackStatus"]:
            events = cfn.describe_stack_events(StackName=stack)["StackEvents"]
            reasons = [e.get("ResourceStatusReason") for e in events if e.get("ResourceStatusReason")]
            sys.exit(f"e2e: stack {status['StackStatus']}: {reasons[:5]}")
        return status if status["StackStatus"] == "CREATE_COMPLETE" else None

    outputs = {o["OutputKey"]: o["OutputValue"] for o in wait("the stack", created)["Outputs"]}
    print(f"e2e: stack {stack} created: {outputs}")

    # Clicks of ten users, two of them malformed.
    kinesis = client("kinesis", args.endpoint)
    clicks = [f"user-{i % 10}" for i in range(200)]
    records = [{"PartitionKey": key, "Data": json.dumps({"key": key}).encode()} for key in clicks]
    records += [{"PartitionKey": "user-x", "Data": b"{not json"}, {"PartitionKey": "user-y", "Data": b'{"key": 7}'}]
    for start in range(0, len(records), 100):
        response = kinesis.put_records(StreamName=outputs["ClicksStreamName"], Records=records[start : start + 100])
        if response.get("FailedRecordCount"):
            sys.exit(f"e2e: the stream refused records: {response}")

    sqs = client("sqs", args.endpoint)
    counts = {}
    outputs_seen = set()

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
    for m in updates:
        body = json.loads(m["Body"])
        outputs_seen.add(m["MessageAttributes"]["outputId"]["StringValue"])
        counts[body["key"]] = max(counts.get(body["key"], 0), body["count"])
    expected = {f"user-{i}": 20 for i in range(10)}
    if counts != expected:
        sys.exit(f"e2e: counts {counts}, expected {expected}")
    if len(outputs_seen) != len(clicks):
        sys.exit(f"e2e: {len(outputs_seen)} distinct outputs for {len(clicks)} clicks")

    letters = []
    wait("two dead letters", lambda: drain(outputs["DeadLetterQueueUrl"], letters) is not None and len(letters) >= 2, timeout=60)
    fields = sorted(json.loads(m["Body"])["field"] for m in letters)
    if fields != ["data", "data"]:
        sys.exit(f"e2e: dead letters name {fields}")

    # State lives under the operator's locked signature; beside it, the operator's signature
    # history (one item of its own) records that this signature is the one deployed.
    signature = locked_signature(args.lock, "keyed-counter")
    dynamodb = client("dynamodb", args.endpoint)
    items = dynamodb.scan(TableName=outputs["StateTableName"], ConsistentRead=True)["Items"]
    heads = [i for i in items if i["sk"]["S"] == "head" and i["pk"]["S"].startswith(f"keyed-counter#{signature}#")]
    if len(heads) != 10:
        sys.exit(f"e2e: {len(heads)} keys under signature {signature} in the state table, expected 10")
    history = [i for i in items if i["pk"]["S"] == "keyed-counter#signature-history#signature-history"]
    if len(history) != 1 or signature not in json.dumps(history[0]):
        sys.exit(f"e2e: the signature history does not record {signature}: {history}")
    others = [i["pk"]["S"] for i in items if i not in heads and i not in history and i["sk"]["S"] == "head"]
    if others:
        sys.exit(f"e2e: unexpected keys in the state table: {others}")

    cfn.delete_stack(StackName=stack)
    print(f"e2e: {len(clicks)} clicks counted by the deployed function, 2 dead letters, 10 keys of state: ok")


if __name__ == "__main__":
    main()
