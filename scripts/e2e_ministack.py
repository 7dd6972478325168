"""The stack deployed on the AWS emulator, end to end, twice: from template.yaml and from the CDK app.

Deploys template.yaml through the emulator's CloudFormation (SAM transform) with the real
keyed-counter bootstrap binary, then the CDK app's synthesized template with its assets published
as `cdk deploy` publishes them. For each stack it puts clicks on the stack's Kinesis stream and
checks what comes out: one running count per click in the counts queue, one dead letter per
malformed click, and the counts in the state table under the operator's locked signature. Failure
semantics (partial batch responses, bisection, retries) are the embedded runtime's tests: the
emulator does not implement them.

Usage: e2e_ministack.py --endpoint URL --bootstrap PATH --template PATH --cdk-out DIR --lock PATH
"""

import argparse
import base64
import io
import json
import os
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


def create_stack(cfn, stack, template):
    """Creates the stack and waits for it; returns its outputs."""
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
    return outputs


def deploy_sam(endpoint, template_path, bootstrap, stack):
    """template.yaml through the emulator's SAM transform, its CodeUri pointing at the binary."""
    s3 = client("s3", endpoint)
    bucket = f"{stack}-code"
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="keyed-counter.zip", Body=zipped([("bootstrap", bootstrap, True)]))
    with open(template_path) as f:
        template = f.read()
    if "CodeUri: .\n" not in template:
        sys.exit("e2e: template.yaml no longer has 'CodeUri: .'; update this script")
    template = template.replace("CodeUri: .\n", f"CodeUri: s3://{bucket}/keyed-counter.zip\n")
    return create_stack(client("cloudformation", endpoint), stack, template)


def deploy_cdk(endpoint, cdk_out, stack):
    """The CDK app's synthesized stack, its file assets published as `cdk deploy` publishes them:
    each zipped into the bootstrap bucket under the key the template names."""
    with open(os.path.join(cdk_out, "keyway.assets.json")) as f:
        manifest = json.load(f)
    s3 = client("s3", endpoint)
    made = set()
    for asset in manifest["files"].values():
        source = os.path.join(cdk_out, asset["source"]["path"])
        if asset["source"]["packaging"] != "zip":
            continue  # the template itself: given to CloudFormation directly
        files = [
            (os.path.relpath(os.path.join(d, n), source), os.path.join(d, n), os.access(os.path.join(d, n), os.X_OK))
            for d, _, names in os.walk(source)
            for n in names
        ]
        for destination in asset["destinations"].values():
            bucket = destination["bucketName"].replace("${AWS::AccountId}", "000000000000").replace("${AWS::Region}", "us-east-1")
            if bucket not in made:
                s3.create_bucket(Bucket=bucket)
                made.add(bucket)
            s3.put_object(Bucket=bucket, Key=destination["objectKey"], Body=zipped(files))
    with open(os.path.join(cdk_out, "keyway.template.json")) as f:
        template = f.read()
    return create_stack(client("cloudformation", endpoint), stack, template)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--template", required=True)
    parser.add_argument("--cdk-out", required=True)
    parser.add_argument("--lock", required=True)
    args = parser.parse_args()
    run = uuid.uuid4().hex[:8]
    signature = locked_signature(args.lock, "keyed-counter")

    stack = f"keyway-e2e-sam-{run}"
    check(args.endpoint, stack, deploy_sam(args.endpoint, args.template, args.bootstrap, stack), signature)
    stack = f"keyway-e2e-cdk-{run}"
    check(args.endpoint, stack, deploy_cdk(args.endpoint, args.cdk_out, stack), signature)


def check(endpoint, stack, outputs, signature):
    """Puts clicks on the stack's stream and checks what the deployed function made of them."""
    # Clicks of ten users, two of them malformed.
    kinesis = client("kinesis", endpoint)
    clicks = [f"user-{i % 10}" for i in range(200)]
    records = [{"PartitionKey": key, "Data": json.dumps({"key": key}).encode()} for key in clicks]
    records += [{"PartitionKey": "user-x", "Data": b"{not json"}, {"PartitionKey": "user-y", "Data": b'{"key": 7}'}]
    for start in range(0, len(records), 100):
        response = kinesis.put_records(StreamName=outputs["ClicksStreamName"], Records=records[start : start + 100])
        if response.get("FailedRecordCount"):
            sys.exit(f"e2e: the stream refused records: {response}")

    sqs = client("sqs", endpoint)
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
    dynamodb = client("dynamodb", endpoint)
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

    client("cloudformation", endpoint).delete_stack(StackName=stack)
    print(f"e2e: {stack}: {len(clicks)} clicks counted by the deployed function, 2 dead letters, 10 keys of state: ok")


if __name__ == "__main__":
    main()
