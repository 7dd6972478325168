// A policy table, as the keyway stack's shared one and each consumer's own are made.
import { CfnResource, RemovalPolicy } from 'aws-cdk-lib';
import * as dynamodb from 'aws-cdk-lib/aws-dynamodb';
import { Construct } from 'constructs';

/** Subscriptions, one item each, keyed by consumer and subscription; their changes stream with
 * both images to the policy sync. Kept when the stack goes: subscriptions are the consumers'. */
export function policyTable(scope: Construct, id: string, tableName?: string): dynamodb.Table {
  const table = new dynamodb.Table(scope, id, {
    tableName,
    billingMode: dynamodb.BillingMode.PAY_PER_REQUEST,
    partitionKey: { name: 'consumer', type: dynamodb.AttributeType.STRING },
    sortKey: { name: 'subscription', type: dynamodb.AttributeType.STRING },
    stream: dynamodb.StreamViewType.NEW_AND_OLD_IMAGES,
    removalPolicy: RemovalPolicy.RETAIN,
    // Encrypted at rest under the account's AWS managed key, restorable to any second of the
    // last 35 days.
    encryption: dynamodb.TableEncryption.AWS_MANAGED,
    pointInTimeRecoverySpecification: { pointInTimeRecoveryEnabled: true },
  });
  (table.node.defaultChild as CfnResource).overrideLogicalId(id);
  return table;
}
