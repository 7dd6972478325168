// One consumer of the dynamic filter, the stack of consumer.yaml built with the CDK: the consumer's
// own policy table, whose stream the keyway stack's filter-policy-sync reads, and the policy its
// subscribers are given. The test suite requires its wiring to equal consumer.yaml's.
import {
  CfnOutput,
  CfnParameter,
  CfnResource,
  Duration,
  Fn,
  Stack,
  StackProps,
} from 'aws-cdk-lib';
import * as iam from 'aws-cdk-lib/aws-iam';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import { Construct, IConstruct } from 'constructs';
import { policyTable } from './policy-table';

/** Gives a construct's CloudFormation resource the logical id consumer.yaml gives it. */
function logicalId(construct: IConstruct, id: string): void {
  (construct.node.defaultChild as CfnResource).overrideLogicalId(id);
}

export class ConsumerStack extends Stack {
  constructor(scope: Construct, id: string, props?: StackProps) {
    super(scope, id, props);

    const consumer = new CfnParameter(this, 'Consumer', {
      type: 'String',
      allowedPattern: '[A-Za-z0-9-]+',
      maxLength: 40,
      description:
        "The consumer's id (letters, digits and hyphens), which its subscriptions name, its policy " +
        "table's name ends with and its queues' names hold (the keyway stack's ConsumerQueuePrefix, " +
        'the id, an underscore and a name). The policy sync refuses a subscription in this table ' +
        "that names another consumer or a queue not named as this one's.",
    });
    const prefix = new CfnParameter(this, 'PolicyTablePrefix', {
      type: 'String',
      description: "The keyway stack's PolicyTablePrefix output.",
    });
    const syncArn = new CfnParameter(this, 'PolicySyncFunctionArn', {
      type: 'String',
      description: "The keyway stack's FilterPolicySyncFunctionArn output.",
    });
    const failedBatchesArn = new CfnParameter(this, 'FailedBatchesQueueArn', {
      type: 'String',
      description: "The keyway stack's FailedBatchesQueueArn output.",
    });

    // The consumer's subscriptions, one item each, written through the subscription client.
    // Named by the keyway stack's prefix: the policy sync may read the streams of tables so
    // named, and knows the consumer from the name.
    const policies = policyTable(
      this,
      'PolicyTable',
      Fn.join('', [prefix.valueAsString, consumer.valueAsString]),
    );

    // The table's changes into the keyway stack's policy sync, with the settings of the keyway
    // stack's own policy table. The function is another stack's: its role already reads tables
    // named by the prefix and writes to the failed-batches queue.
    const mapping = new lambda.CfnEventSourceMapping(this, 'PolicySync', {
      functionName: syncArn.valueAsString,
      eventSourceArn: policies.tableStreamArn,
      startingPosition: 'TRIM_HORIZON',
      batchSize: 100,
      maximumBatchingWindowInSeconds: 0,
      functionResponseTypes: ['ReportBatchItemFailures'],
      bisectBatchOnFunctionError: true,
      maximumRecordAgeInSeconds: Duration.days(1).toSeconds(),
      destinationConfig: { onFailure: { destination: failedBatchesArn.valueAsString } },
    });
    mapping.overrideLogicalId('PolicySync');

    // What the consumer's applications (and `keyway subscriptions`) are given: its own table only.
    const subscriber = new iam.ManagedPolicy(this, 'SubscriberPolicy', {
      description: 'Manage the subscriptions of one consumer of the keyway dynamic filter.',
      statements: [
        new iam.PolicyStatement({
          actions: ['dynamodb:PutItem', 'dynamodb:DeleteItem', 'dynamodb:Query'],
          resources: [policies.tableArn],
        }),
      ],
    });
    logicalId(subscriber, 'SubscriberPolicy');

    new CfnOutput(this, 'PolicyTableName', { value: policies.tableName });
    new CfnOutput(this, 'SubscriberPolicyArn', { value: subscriber.managedPolicyArn });
  }
}
