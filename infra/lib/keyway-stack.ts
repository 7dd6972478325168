// The stack of template.yaml, built with the CDK: the same tables, streams, queues and functions,
// with the same logical ids, environment and event source mapping settings. The test suite reads
// the wiring of both templates (crates/keyway/src/local/template.rs) and requires them to be equal,
// so choosing CDK over SAM never changes what is deployed.
import * as fs from 'fs';
import * as path from 'path';
import { CfnOutput, CfnResource, Duration, RemovalPolicy, Stack, StackProps } from 'aws-cdk-lib';
import * as dynamodb from 'aws-cdk-lib/aws-dynamodb';
import * as kinesis from 'aws-cdk-lib/aws-kinesis';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import { KinesisEventSource, SqsDlq } from 'aws-cdk-lib/aws-lambda-event-sources';
import * as sqs from 'aws-cdk-lib/aws-sqs';
import { Construct, IConstruct } from 'constructs';

export interface KeywayStackProps extends StackProps {
  /** The folder holding one folder per function with its `bootstrap` (cargo lambda build's
   * target/lambda). */
  readonly functionsDir: string;
}

/** Gives a construct's CloudFormation resource the logical id template.yaml gives it. */
function logicalId(construct: IConstruct, id: string): void {
  (construct.node.defaultChild as CfnResource).overrideLogicalId(id);
}

/** The code of a function built by `cargo lambda build --release`. */
function functionCode(functionsDir: string, binary: string): lambda.Code {
  const dir = path.join(functionsDir, binary);
  if (!fs.existsSync(path.join(dir, 'bootstrap'))) {
    throw new Error(
      `${dir}/bootstrap does not exist: build the functions first (cargo lambda build --release)`,
    );
  }
  return lambda.Code.fromAsset(dir);
}

export class KeywayStack extends Stack {
  constructor(scope: Construct, id: string, props: KeywayStackProps) {
    super(scope, id, props);

    // One table for every operator's state: keys are `operator#signature#key` / `head` or a
    // segment, expired state is deleted by TTL (see the DynamoDB store's module doc).
    const stateTable = new dynamodb.Table(this, 'StateTable', {
      billingMode: dynamodb.BillingMode.PAY_PER_REQUEST,
      partitionKey: { name: 'pk', type: dynamodb.AttributeType.STRING },
      sortKey: { name: 'sk', type: dynamodb.AttributeType.STRING },
      timeToLiveAttribute: 'ttl',
      // State outlives the stack, as a stream engine's savepoints do: deleting the stack by
      // mistake must not lose every key's state.
      removalPolicy: RemovalPolicy.RETAIN,
    });
    logicalId(stateTable, 'StateTable');

    const clicks = new kinesis.Stream(this, 'ClicksStream', {
      shardCount: 2,
      streamMode: kinesis.StreamMode.PROVISIONED,
      encryption: kinesis.StreamEncryption.MANAGED,
      // Records live 24 hours and a shard costs by the hour: the stream goes with the stack.
      removalPolicy: RemovalPolicy.DESTROY,
    });
    logicalId(clicks, 'ClicksStream');

    const counts = new sqs.Queue(this, 'CountsQueue');
    logicalId(counts, 'CountsQueue');
    const deadLetters = new sqs.Queue(this, 'DeadLetterQueue', {
      retentionPeriod: Duration.days(14),
    });
    logicalId(deadLetters, 'DeadLetterQueue');
    const failedBatches = new sqs.Queue(this, 'FailedBatchesQueue', {
      retentionPeriod: Duration.days(14),
    });
    logicalId(failedBatches, 'FailedBatchesQueue');

    const keyedCounter = new lambda.Function(this, 'KeyedCounterFunction', {
      description: "Counts events per key and emits each key's running count.",
      runtime: lambda.Runtime.PROVIDED_AL2023,
      handler: 'bootstrap',
      architecture: lambda.Architecture.X86_64,
      memorySize: 256,
      timeout: Duration.seconds(30),
      code: functionCode(props.functionsDir, 'keyed-counter'),
      environment: {
        STATE_TABLE: stateTable.tableName,
        COUNTS_SINK: `sqs:${counts.queueUrl}`,
        DEAD_LETTER_SINK: `sqs:${deadLetters.queueUrl}`,
        // Watermarks must outlive every redelivery: the stream keeps records 24 hours and the
        // mapping's MaximumRecordAgeInSeconds is a day; an hour more covers clock skew.
        KEYWAY_REDELIVERY_WINDOW_SECONDS: '90000',
      },
    });
    logicalId(keyedCounter, 'KeyedCounterFunction');
    stateTable.grantReadWriteData(keyedCounter);
    counts.grantSendMessages(keyedCounter);
    deadLetters.grantSendMessages(keyedCounter);

    // The settings the executor is built for: partial batch responses checkpoint at the lowest
    // unapplied record, bisection isolates a record that fails the whole function, and what still
    // fails after its retries is described on the failed-batches queue.
    const source = new KinesisEventSource(clicks, {
      startingPosition: lambda.StartingPosition.TRIM_HORIZON,
      batchSize: 500,
      maxBatchingWindow: Duration.seconds(1),
      reportBatchItemFailures: true,
      bisectBatchOnError: true,
      retryAttempts: 10,
      maxRecordAge: Duration.seconds(86400),
      parallelizationFactor: 2,
      onFailure: new SqsDlq(failedBatches),
    });
    keyedCounter.addEventSource(source);
    // SAM names a function's event source mapping <function><event>: the event is `Clicks`.
    const mapping = keyedCounter.node.children.find((c) => c instanceof lambda.EventSourceMapping);
    if (mapping === undefined) {
      throw new Error('KeyedCounterFunction: the Kinesis event source made no event source mapping');
    }
    logicalId(mapping, 'KeyedCounterFunctionClicks');

    new CfnOutput(this, 'ClicksStreamName', { value: clicks.streamName });
    new CfnOutput(this, 'CountsQueueUrl', { value: counts.queueUrl });
    new CfnOutput(this, 'DeadLetterQueueUrl', { value: deadLetters.queueUrl });
    new CfnOutput(this, 'FailedBatchesQueueUrl', { value: failedBatches.queueUrl });
    new CfnOutput(this, 'StateTableName', { value: stateTable.tableName });
  }
}
