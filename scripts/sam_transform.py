"""Prints a SAM template as CloudFormation deploys it: the AWS::Serverless transform applied by
the SAM translator that `sam deploy` uses, offline. Each function's CodeUri becomes an S3 location,
as `sam package` makes it; the transform needs one, and reads nothing there.

    python scripts/sam_transform.py template.yaml > transformed.json
"""
import json
import os
import sys

from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse


class NoManagedPolicies:
    """The translator asks IAM for managed policies only when a template names one by name; this
    stack names none, and no call leaves the machine."""

    def load(self):
        return {}


def main(path):
    # The pseudo-parameters' region: the translator asks for one and uses it in no ARN it writes.
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    with open(path) as f:
        template = yaml_parse(f.read())
    for logical_id, resource in template["Resources"].items():
        if resource["Type"] == "AWS::Serverless::Function":
            resource["Properties"]["CodeUri"] = f"s3://functions/{logical_id}.zip"
    print(json.dumps(transform(template, {}, NoManagedPolicies()), indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
