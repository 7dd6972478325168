// The stack of template.yaml, built with the CDK: the same tables, streams, queues and functions,
// with the same logical ids, environment and event source mapping settings. The test suite reads
// the wiring of both templates (crates/keyway-local/src/template/) and requires them to be equal,
// so choosing CDK over SAM never changes what is deployed.
import * as fs from 'fs';
import * as path from 'path';
import {
  CfnOutput,
  CfnCondition,
  CfnParameter,
  CfnParameterProps,
  CfnResource,
  Fn,
  Duration,
  RemovalPolicy,
  Stack,
  StackProps,
} from 'aws-cdk-lib';
import * as cloudwatch from 'aws-cdk-lib/aws-cloudwatch';
import * as dynamodb from 'aws-cdk-lib/aws-dynamodb';
import * as events from 'aws-cdk-lib/aws-events';
import * as targets from 'aws-cdk-lib/aws-events-targets';
import * as kinesis from 'aws-cdk-lib/aws-kinesis';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import * as iam from 'aws-cdk-lib/aws-iam';
import * as logs from 'aws-cdk-lib/aws-logs';
import { DynamoEventSource, KinesisEventSource, SqsDlq } from 'aws-cdk-lib/aws-lambda-event-sources';
import * as sqs from 'aws-cdk-lib/aws-sqs';
import { Construct, IConstruct } from 'constructs';
import { policyTable } from './policy-table';

export interface KeywayStackProps extends StackProps {
  /** The folder holding one folder per function with its `bootstrap` (cargo lambda build's
   * target/lambda). */
  readonly functionsDir: string;
}

/** Gives a construct's CloudFormation resource the logical id template.yaml gives it. */
function logicalId(construct: IConstruct, id: string): void {
  (construct.node.defaultChild as CfnResource).overrideLogicalId(id);
}

/** The code of a function built by `cargo lambda build --release --arm64` (or without --arm64 for
 * the x86_64 Architecture). */
function functionCode(functionsDir: string, binary: string): lambda.Code {
  const dir = path.join(functionsDir, binary);
  if (!fs.existsSync(path.join(dir, 'bootstrap'))) {
    throw new Error(
      `${dir}/bootstrap does not exist: build the functions first (cargo lambda build --release --arm64)`,
    );
  }
  return lambda.Code.fromAsset(dir);
}

/** The IAM actions of each port a function asks for and of what Lambda does with its role:
 * keyway::adapters::permissions lists the same, and tests/tests/permissions.rs holds this app's
 * roles and template.yaml's to it. */
const TABLE_READ = ['dynamodb:BatchGetItem', 'dynamodb:GetItem', 'dynamodb:Query', 'dynamodb:Scan'];
const TABLE_READ_WRITE = [...TABLE_READ, 'dynamodb:PutItem', 'dynamodb:UpdateItem', 'dynamodb:BatchWriteItem'];
const KINESIS_SINK = ['kinesis:PutRecords'];
const SQS_SINK = ['sqs:SendMessage'];
const KINESIS_TRIGGER = [
  'kinesis:DescribeStream',
  'kinesis:DescribeStreamSummary',
  'kinesis:GetRecords',
  'kinesis:GetShardIterator',
  'kinesis:ListShards',
];
const DYNAMODB_STREAM_TRIGGER = [
  'dynamodb:DescribeStream',
  'dynamodb:GetRecords',
  'dynamodb:GetShardIterator',
  'dynamodb:ListStreams',
];
const ON_FAILURE_QUEUE = ['sqs:SendMessage'];
const LOGS = ['logs:CreateLogStream', 'logs:PutLogEvents'];

/** Actions on one resource (an ARN). */
type Grant = [actions: string[], resource: string];

/** The statements of each function's role, which `grant` adds to. */
const roleStatements = new WeakMap<lambda.IFunction, object[]>();

/** Grants `fn` `actions` on `resource`, and nothing else: its role takes no grant but these. */
function grant(fn: lambda.IFunction, actions: string[], resource: string): void {
  const statements = roleStatements.get(fn);
  if (statements === undefined) {
    throw new Error(`${fn.node.id} has no role of rustFunction's`);
  }
  statements.push({ Effect: 'Allow', Action: actions, Resource: resource });
}

/** An event source with what Lambda needs of the function's role to read it. */
interface Trigger {
  readonly source: lambda.IEventSource;
  readonly grants: Grant[];
}

/** The settings of every stream trigger, as template.yaml gives them: partial batch responses
 * checkpoint at the lowest unapplied record, bisection isolates a record that fails the whole
 * function, and a failing batch is retried until its records are a day old (no retry limit:
 * keyway dead-letters what no retry can fix, so only an outage fails a batch), then described on
 * the failed-batches queue. */
function streamTrigger(
  stream: kinesis.IStream,
  failedBatches: sqs.IQueue,
  batchingWindowSeconds = 1,
): Trigger {
  const source = new KinesisEventSource(stream, {
    startingPosition: lambda.StartingPosition.TRIM_HORIZON,
    batchSize: 500,
    maxBatchingWindow: Duration.seconds(batchingWindowSeconds),
    reportBatchItemFailures: true,
    bisectBatchOnError: true,
    maxRecordAge: Duration.seconds(86400),
    parallelizationFactor: 2,
    onFailure: new SqsDlq(failedBatches),
  });
  return {
    source,
    grants: [
      [KINESIS_TRIGGER, stream.streamArn],
      [ON_FAILURE_QUEUE, failedBatches.queueArn],
    ],
  };
}

/** The trigger of a table's stream (a policy table's), with the same failure handling: one item's
 * changes in order, a hundred a batch, none waiting for a fuller batch. */
function tableTrigger(table: dynamodb.ITable, failedBatches: sqs.IQueue): Trigger {
  const source = new DynamoEventSource(table, {
    startingPosition: lambda.StartingPosition.TRIM_HORIZON,
    batchSize: 100,
    maxBatchingWindow: Duration.seconds(0),
    reportBatchItemFailures: true,
    bisectBatchOnError: true,
    maxRecordAge: Duration.seconds(86400),
    onFailure: new SqsDlq(failedBatches),
  });
  if (table.tableStreamArn === undefined) {
    throw new Error(`${table.node.id} has no stream`);
  }
  return {
    source,
    grants: [
      [DYNAMODB_STREAM_TRIGGER, table.tableStreamArn],
      [ON_FAILURE_QUEUE, failedBatches.queueArn],
    ],
  };
}

/** Adds `trigger` to `fn` under the logical id SAM gives it, <function><event>, and grants what
 * Lambda needs to read it (the event source's own grants go nowhere: the role is immutable). */
function addTrigger(
  fn: lambda.Function,
  fnId: string,
  event: string,
  trigger: Trigger,
): lambda.CfnEventSourceMapping {
  const before = new Set(fn.node.children);
  fn.addEventSource(trigger.source);
  const mapping = fn.node.children.find((c) => !before.has(c) && c instanceof lambda.EventSourceMapping);
  if (mapping === undefined) {
    throw new Error(`${fnId}: the event source ${event} made no event source mapping`);
  }
  for (const [actions, resource] of trigger.grants) {
    grant(fn, actions, resource);
  }
  logicalId(mapping, `${fnId}${event}`);
  return mapping.node.defaultChild as lambda.CfnEventSourceMapping;
}

/** The stack's parameter `id`, made with `props` by the first function that asks for it. */
function functionsParameter(scope: Construct, id: string, props: CfnParameterProps): CfnParameter {
  const stack = Stack.of(scope);
  const made = stack.node.tryFindChild(id) as CfnParameter | undefined;
  return made ?? new CfnParameter(stack, id, props);
}

/** The Architecture parameter's value. */
function architecture(scope: Construct): string {
  return functionsParameter(scope, 'Architecture', {
    type: 'String',
    default: 'arm64',
    allowedValues: ['arm64', 'x86_64'],
    description:
      "The functions' instruction set. arm64 (Graviton) costs less per second of the same work; " +
      'build for it with `cargo lambda build --release --arm64`, for x86_64 without the flag.',
  }).valueAsString;
}

/** The LogRetentionDays parameter's value. */
function logRetentionDays(scope: Construct): number {
  return functionsParameter(scope, 'LogRetentionDays', {
    type: 'Number',
    // A string, as allowedValues are: cfn-lint compares the two as written.
    default: '30',
    allowedValues: [1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653].map(String),
    description: "How long each function's log group keeps its logs, in days.",
  }).valueAsNumber;
}

/** A function of this workspace as template.yaml's Globals make them: the cargo-lambda build of
 * `binary` on provided.al2023, under the logical id template.yaml gives it, with its own log group
 * and a role that grants writing to it and what `grant` adds, nothing more. */
function rustFunction(
  scope: Construct,
  id: string,
  binary: string,
  functionsDir: string,
  description: string,
  environment: Record<string, string>,
): lambda.Function {
  const logGroup = new logs.CfnLogGroup(scope, `${id}LogGroup`, {
    retentionInDays: logRetentionDays(scope),
  });
  logGroup.overrideLogicalId(`${id}LogGroup`);
  const statements: object[] = [];
  const role = new iam.CfnRole(scope, `${id}Role`, {
    assumeRolePolicyDocument: {
      Version: '2012-10-17',
      Statement: [
        { Effect: 'Allow', Principal: { Service: 'lambda.amazonaws.com' }, Action: 'sts:AssumeRole' },
      ],
    },
    policies: [
      { policyName: binary, policyDocument: { Version: '2012-10-17', Statement: statements } },
    ],
  });
  role.overrideLogicalId(`${id}Role`);
  const made = new lambda.Function(scope, id, {
    description,
    runtime: lambda.Runtime.PROVIDED_AL2023,
    handler: 'bootstrap',
    architecture: lambda.Architecture.custom(architecture(scope)),
    memorySize: 256,
    timeout: Duration.seconds(30),
    code: functionCode(functionsDir, binary),
    environment,
    // Not mutable: a construct's grant (an event source's, a table's) changes nothing.
    role: iam.Role.fromRoleArn(scope, `${id}RoleArn`, role.attrArn, { mutable: false }),
    logGroup: logs.LogGroup.fromLogGroupName(scope, `${id}LogGroupName`, logGroup.ref),
  });
  logicalId(made, id);
  roleStatements.set(made, statements);
  grant(made, LOGS, logGroup.attrArn);
  return made;
}

/** A Kinesis stream as template.yaml declares them: provisioned, encrypted with the AWS key. */
function stream(scope: Construct, id: string, shardCount: number): kinesis.Stream {
  const made = new kinesis.Stream(scope, id, {
    shardCount,
    streamMode: kinesis.StreamMode.PROVISIONED,
    encryption: kinesis.StreamEncryption.MANAGED,
    // Records live 24 hours and a shard costs by the hour: the stream goes with the stack.
    removalPolicy: RemovalPolicy.DESTROY,
  });
  logicalId(made, id);
  return made;
}

/** A table keyed `pk` and `sk` with TTL on `ttl`, as template.yaml declares the state tables:
 * retained with the stack by default, as a stream engine keeps its savepoints. */
function keyedTable(
  scope: Construct,
  id: string,
  removalPolicy: RemovalPolicy = RemovalPolicy.RETAIN,
): dynamodb.Table {
  const made = new dynamodb.Table(scope, id, {
    billingMode: dynamodb.BillingMode.PAY_PER_REQUEST,
    partitionKey: { name: 'pk', type: dynamodb.AttributeType.STRING },
    sortKey: { name: 'sk', type: dynamodb.AttributeType.STRING },
    timeToLiveAttribute: 'ttl',
    removalPolicy,
    // Encrypted at rest under the account's AWS managed key, restorable to any second of the
    // last 35 days.
    encryption: dynamodb.TableEncryption.AWS_MANAGED,
    pointInTimeRecoverySpecification: { pointInTimeRecoveryEnabled: true },
  });
  logicalId(made, id);
  return made;
}

export class KeywayStack extends Stack {
  constructor(scope: Construct, id: string, props: KeywayStackProps) {
    super(scope, id, props);

    // One table for every operator's state: keys are `operator#signature#key` / `head` or a
    // segment, expired state is deleted by TTL (see the DynamoDB store's module doc).
    // State outlives the stack, as a stream engine's savepoints do: deleting the stack by
    // mistake must not lose every key's state.
    const stateTable = keyedTable(this, 'StateTable');

    const customerMap = new CfnParameter(this, 'CustomerMap', {
      type: 'String',
      default: '{}',
      description:
        "The identity enricher's customers: a JSON object of account id to customer id. Accounts " +
        'of one customer share its partitions, so role chains across them resolve; an account ' +
        'left out is its own customer.',
    });
    const bufferTtl = new CfnParameter(this, 'BufferTtlSeconds', {
      type: 'Number',
      default: 900,
      description:
        "How long a CloudTrail record waits for the resolution of its caller's access key before " +
        'the identity enricher sends it out unresolved.',
    });
    const maxChainDepth = new CfnParameter(this, 'MaxChainDepth', {
      type: 'Number',
      default: 10,
      minValue: 1,
      maxValue: 100,
      description:
        'The most roles the identity enricher follows a role chain through. The records of a key ' +
        'issued deeper go out at once, unresolved, saying the limit was reached, with the original ' +
        'actor and the chain up to its first role past the limit.',
    });
    const recordMaxAge = new CfnParameter(this, 'RecordMaxAgeSeconds', {
      type: 'Number',
      default: 86400,
      minValue: 60,
      maxValue: 604800,
      description:
        "The oldest record the identity enricher's mappings deliver, in seconds after it reached its " +
        'stream (an older one goes to the failed-batches queue). The enricher keeps a key\'s ' +
        "watermarks and state that long past their last change, and an identity that long past its " +
        "credentials' expiration and grace; then the key's items go.",
    });

    const cloudTrailShards = new CfnParameter(this, 'CloudTrailShards', {
      type: 'Number',
      default: 4,
      description: 'Shards of the CloudTrail stream, which the enricher reads in parallel.',
    });
    const feedbackShards = new CfnParameter(this, 'FeedbackShards', {
      type: 'Number',
      default: 2,
      description: 'Shards of the feedback stream, which carries one resolution per issued key.',
    });

    const clicks = stream(this, 'ClicksStream', 2);
    // CloudTrail records, partitioned by customer#accessKeyId of their caller; resolutions of
    // issued keys, partitioned by customer#issuedAccessKeyId; the enriched records.
    const cloudTrail = stream(this, 'CloudTrailStream', cloudTrailShards.valueAsNumber);
    const feedback = stream(this, 'FeedbackStream', feedbackShards.valueAsNumber);
    const enriched = stream(this, 'EnrichedStream', 2);

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

    const keyedCounter = rustFunction(
      this,
      'KeyedCounterFunction',
      'keyed-counter',
      props.functionsDir,
      "Counts events per key and emits each key's running count.",
      {
        STATE_TABLE: stateTable.tableName,
        COUNTS_SINK: `sqs:${counts.queueUrl}`,
        // "every": the count after each event; "latest": each key's count after its last event
        // of an invocation, one message a key a batch.
        COUNTS_EMIT: 'every',
        DEAD_LETTER_SINK: `sqs:${deadLetters.queueUrl}`,
        // Watermarks must outlive every redelivery: the stream keeps records 24 hours and the
        // mapping's MaximumRecordAgeInSeconds is a day; an hour more covers clock skew.
        KEYWAY_REDELIVERY_WINDOW_SECONDS: '90000',
      },
    );
    grant(keyedCounter, TABLE_READ_WRITE, stateTable.tableArn);
    grant(keyedCounter, SQS_SINK, counts.queueArn);
    grant(keyedCounter, SQS_SINK, deadLetters.queueArn);

    addTrigger(keyedCounter, 'KeyedCounterFunction', 'Clicks', streamTrigger(clicks, failedBatches));

    const enricher = rustFunction(
      this,
      'IdentityEnricherFunction',
      'identity-enricher',
      props.functionsDir,
      'Traces every CloudTrail action through role chains to its original actor.',
      {
        STATE_TABLE: stateTable.tableName,
        EVENTS_STREAM: cloudTrail.streamName,
        FEEDBACK_STREAM: feedback.streamName,
        ENRICHED_SINK: `kinesis:${enriched.streamName}`,
        DEAD_LETTER_SINK: `sqs:${deadLetters.queueUrl}`,
        CUSTOMER_MAP: customerMap.valueAsString,
        BUFFER_TTL_SECONDS: bufferTtl.valueAsString,
        MAX_CHAIN_DEPTH: maxChainDepth.valueAsString,
        KEYWAY_REDELIVERY_WINDOW_SECONDS: recordMaxAge.valueAsString,
      },
    );
    grant(enricher, TABLE_READ_WRITE, stateTable.tableArn);
    grant(enricher, KINESIS_SINK, feedback.streamArn);
    grant(enricher, KINESIS_SINK, enriched.streamArn);
    grant(enricher, SQS_SINK, deadLetters.queueArn);
    // A parameter, which the event source's own range check cannot read: set on the mapping.
    for (const [event, stream] of [['CloudTrail', cloudTrail], ['Feedback', feedback]] as const) {
      const mapping = addTrigger(enricher, 'IdentityEnricherFunction', event, streamTrigger(stream, failedBatches));
      mapping.maximumRecordAgeInSeconds = recordMaxAge.valueAsNumber;
    }
    // Keyed timers fire from a due-time index this schedule sweeps: a buffered record goes out
    // unresolved within the buffer TTL and a minute, even when its key hears nothing more.
    const sweep = new events.Rule(this, 'IdentityEnricherFunctionSweepTimers', {
      schedule: events.Schedule.rate(Duration.minutes(1)),
      targets: [new targets.LambdaFunction(enricher)],
    });
    logicalId(sweep, 'IdentityEnricherFunctionSweepTimers');

    const filtering = this.filtering(stateTable, deadLetters, failedBatches, props.functionsDir);
    const cdc = this.cdcJoin(stateTable, deadLetters, failedBatches, props.functionsDir);
    const aggregation = this.aggregation(stateTable, deadLetters, failedBatches, props.functionsDir);
    operations(
      this,
      {
        KeyedCounter: keyedCounter,
        IdentityEnricher: enricher,
        ...filtering,
        ...cdc,
        ...aggregation,
      },
      { DeadLetterQueue: deadLetters, FailedBatchesQueue: failedBatches },
    );

    new CfnOutput(this, 'ClicksStreamName', { value: clicks.streamName });
    new CfnOutput(this, 'CloudTrailStreamName', { value: cloudTrail.streamName });
    new CfnOutput(this, 'FeedbackStreamName', { value: feedback.streamName });
    new CfnOutput(this, 'EnrichedStreamName', { value: enriched.streamName });
    new CfnOutput(this, 'CountsQueueUrl', { value: counts.queueUrl });
    new CfnOutput(this, 'DeadLetterQueueUrl', { value: deadLetters.queueUrl });
    new CfnOutput(this, 'FailedBatchesQueueUrl', { value: failedBatches.queueUrl });
    new CfnOutput(this, 'StateTableName', { value: stateTable.tableName });
  }

  /** Real-time dynamic filtering: the policy table, the filter state, the events stream, and the
   * two functions between them. */
  private filtering(
    stateTable: dynamodb.ITable,
    deadLetters: sqs.IQueue,
    failedBatches: sqs.IQueue,
    functionsDir: string,
  ): Record<string, lambda.Function> {
    const filterShards = new CfnParameter(this, 'FilterShards', {
      type: 'Number',
      default: 4,
      description: 'Shards of the stream of events the dynamic filter reads, partitioned by filter key.',
    });
    const keyPointer = new CfnParameter(this, 'FilterKeyPointer', {
      type: 'String',
      default: '/key',
      description: 'Where an event holds its filter key (a JSON pointer).',
    });
    const consumerQueues = new CfnParameter(this, 'ConsumerQueues', {
      type: 'String',
      default: '',
      description:
        'Narrows the queues each consumer may deliver to: a JSON object of consumer id to a list of ' +
        'its queue names (each named as ConsumerQueuePrefix says). Empty leaves each consumer every ' +
        'queue named as its own.',
    });

    const consumerQueuePrefix = new CfnParameter(this, 'ConsumerQueuePrefix', {
      type: 'String',
      default: 'keyway-',
      minLength: 1,
      allowedPattern: '[A-Za-z0-9_-]+',
      description:
        'A consumer owns the queues named with this prefix, its id and an underscore ' +
        '(keyway-live_events for consumer live): the filter delivers to no other, and its role may ' +
        'send to those queues only. No queue of the stack has an underscore in its name.',
    });

    // The dynamic filter's state: every subscription as of its last change, and the journal of
    // changes the filter catches up from once a batch (functions/dynamic-filter/src/store.rs).
    const filterState = keyedTable(this, 'FilterStateTable');
    // Subscriptions, one item each, written by consumers through the subscription client: the table
    // consumers may share. A consumer that owns its table (consumer-stack.ts, deployed once per
    // consumer) keeps its subscriptions, permissions and traffic apart from the others'.
    const policies = policyTable(this, 'PolicyTable');
    const events = stream(this, 'FilterEventsStream', filterShards.valueAsNumber);

    // The stack's name as deployed (a token), which may differ from the one synthesized.
    const policyTablePrefix = Fn.sub('${AWS::StackName}-policies-');
    const sync = rustFunction(
      this,
      'FilterPolicySyncFunction',
      'filter-policy-sync',
      functionsDir,
      "Applies consumers' subscription changes to the dynamic filter's state.",
      {
        STATE_TABLE: stateTable.tableName,
        FILTER_STATE_TABLE: filterState.tableName,
        DEAD_LETTER_SINK: `sqs:${deadLetters.queueUrl}`,
        CONSUMER_QUEUE_PREFIX: consumerQueuePrefix.valueAsString,
        CONSUMER_QUEUES: consumerQueues.valueAsString,
        // Consumers' own policy tables are named by this prefix and the consumer's id.
        POLICY_TABLE_PREFIX: policyTablePrefix,
        // A DynamoDB stream keeps changes 24 hours; an hour more covers clock skew.
        KEYWAY_REDELIVERY_WINDOW_SECONDS: '90000',
      },
    );
    grant(sync, TABLE_READ_WRITE, stateTable.tableArn);
    grant(sync, TABLE_READ_WRITE, filterState.tableArn);
    grant(sync, SQS_SINK, deadLetters.queueArn);
    addTrigger(sync, 'FilterPolicySyncFunction', 'Policies', tableTrigger(policies, failedBatches));
    // The streams of consumers' own policy tables, which their stacks (consumer-stack.ts) map to
    // this function: only tables named by the prefix.
    grant(
      sync,
      DYNAMODB_STREAM_TRIGGER,
      Fn.sub('arn:${AWS::Partition}:dynamodb:${AWS::Region}:${AWS::AccountId}:table/${AWS::StackName}-policies-*/stream/*'),
    );

    const filter = rustFunction(
      this,
      'DynamicFilterFunction',
      'dynamic-filter',
      functionsDir,
      'Sends each event to the queues of the consumers whose subscriptions match it.',
      {
        FILTER_STATE_TABLE: filterState.tableName,
        DEAD_LETTER_SINK: `sqs:${deadLetters.queueUrl}`,
        QUEUE_URL_PREFIX: `https://sqs.${this.region}.amazonaws.com/${this.account}/`,
        FILTER_KEY_POINTER: keyPointer.valueAsString,
        CONSUMER_QUEUE_PREFIX: consumerQueuePrefix.valueAsString,
        CONSUMER_QUEUES: consumerQueues.valueAsString,
      },
    );
    grant(filter, TABLE_READ, filterState.tableArn);
    grant(filter, SQS_SINK, deadLetters.queueArn);
    // Consumers' queues, named with the prefix, the consumer's id and an underscore: no queue
    // CloudFormation names for the stack has one, so this reaches none of them.
    grant(
      filter,
      SQS_SINK,
      Fn.sub('arn:${AWS::Partition}:sqs:${AWS::Region}:${AWS::AccountId}:${ConsumerQueuePrefix}*_*'),
    );
    // Events go out as they come: a consumer of live collaboration waits for none.
    addTrigger(filter, 'DynamicFilterFunction', 'Events', streamTrigger(events, failedBatches, 0));

    new CfnOutput(this, 'PolicyTableName', { value: policies.tableName });
    // What a consumer's own stack (consumer-stack.ts) is deployed with.
    new CfnOutput(this, 'PolicyTablePrefix', { value: policyTablePrefix });
    new CfnOutput(this, 'FilterPolicySyncFunctionArn', { value: sync.functionArn });
    new CfnOutput(this, 'FailedBatchesQueueArn', { value: failedBatches.queueArn });
    new CfnOutput(this, 'FilterStateTableName', { value: filterState.tableName });
    new CfnOutput(this, 'FilterEventsStreamName', { value: events.streamName });
    return { FilterPolicySync: sync, DynamicFilter: filter };
  }

  /** The CDC join: Debezium's changes on a stream and a DynamoDB table's on its own, re-keyed by
   * join key onto the changelog stream, joined into the joined changelog and the view table. */
  private cdcJoin(
    stateTable: dynamodb.ITable,
    deadLetters: sqs.IQueue,
    failedBatches: sqs.IQueue,
    functionsDir: string,
  ): Record<string, lambda.Function> {
    const join = new CfnParameter(this, 'CdcJoin', {
      type: 'String',
      default: 'domains.user_id=users.id',
      allowedPattern: '[^.=]+\\.[^.=]+=[^.=]+\\.[^.=]+',
      description:
        "The CDC join's equi-join, LEFT_TABLE.COLUMN=RIGHT_TABLE.COLUMN. Tables are named as their " +
        "changes name them (Debezium's source.table); the stack's DynamoDB source table is `users`.",
    });
    const kind = new CfnParameter(this, 'CdcJoinKind', {
      type: 'String',
      default: 'inner',
      allowedValues: ['inner', 'left'],
      description:
        'inner keeps joined rows only; left also keeps each left row without a partner, joined ' +
        'with null.',
    });
    const filter = new CfnParameter(this, 'CdcFilter', {
      type: 'String',
      default: '',
      description:
        'The rows that take part in the CDC join: conditions on either table\'s columns joined by ' +
        'AND, values as JSON (domains.status = "active" AND users.tier >= 2); empty for every row.',
    });

    // Debezium change events (Debezium Server's Kinesis sink: partitioned by record key, every
    // table routed to this stream), read by the re-key.
    const changes = stream(this, 'CdcChangesStream', 2);
    // A source table of the join on DynamoDB: its stream's changes are re-keyed like Debezium's.
    const users = new dynamodb.Table(this, 'CdcUsersTable', {
      billingMode: dynamodb.BillingMode.PAY_PER_REQUEST,
      partitionKey: { name: 'id', type: dynamodb.AttributeType.NUMBER },
      stream: dynamodb.StreamViewType.NEW_AND_OLD_IMAGES,
      removalPolicy: RemovalPolicy.RETAIN,
      encryption: dynamodb.TableEncryption.AWS_MANAGED,
      pointInTimeRecoverySpecification: { pointInTimeRecoveryEnabled: true },
    });
    logicalId(users, 'CdcUsersTable');
    // The source rows' changes as deletes and inserts, partitioned by join key; the joined changelog.
    const changelog = stream(this, 'CdcChangelogStream', 2);
    const joined = stream(this, 'CdcJoinedStream', 2);
    // The join of the current source rows, a row per joined pair (pk: the left row, sk: the right
    // row or "-"); a deleted row stays as a tombstone until its TTL (functions/cdc-join view_table).
    const view = keyedTable(this, 'CdcViewTable');

    const rekey = rustFunction(
      this,
      'CdcRekeyFunction',
      'cdc-rekey',
      functionsDir,
      "Re-publishes source rows' changes as deletes and inserts by join key.",
      {
        JOIN: join.valueAsString,
        JOIN_KIND: kind.valueAsString,
        FILTER: filter.valueAsString,
        STATE_TABLE: stateTable.tableName,
        CHANGELOG_SINK: `kinesis:${changelog.streamName}`,
        DEAD_LETTER_SINK: `sqs:${deadLetters.queueUrl}`,
        TABLE_NAMES: `{"${users.tableName}": "users"}`,
        // "sometimes": the re-key stores each row, for changes without a whole before image
        // (PostgreSQL's REPLICA IDENTITY DEFAULT) and for truncates; "always" when every update
        // and delete carries one: no row is stored, read or written.
        BEFORE_IMAGES: 'sometimes',
        // The streams keep records 24 hours; an hour more covers clock skew.
        KEYWAY_REDELIVERY_WINDOW_SECONDS: '90000',
      },
    );
    grant(rekey, TABLE_READ_WRITE, stateTable.tableArn);
    grant(rekey, KINESIS_SINK, changelog.streamArn);
    grant(rekey, SQS_SINK, deadLetters.queueArn);
    addTrigger(rekey, 'CdcRekeyFunction', 'Changes', streamTrigger(changes, failedBatches));
    addTrigger(rekey, 'CdcRekeyFunction', 'Users', tableTrigger(users, failedBatches));
    // A truncated table's rows that no change touches again are retracted by a sweep this
    // schedule runs (functions/cdc-join/src/truncate.rs).
    const sweepTruncates = new events.Rule(this, 'CdcRekeyFunctionSweepTruncates', {
      schedule: events.Schedule.rate(Duration.minutes(1)),
      targets: [new targets.LambdaFunction(rekey)],
    });
    logicalId(sweepTruncates, 'CdcRekeyFunctionSweepTruncates');

    const joiner = rustFunction(
      this,
      'CdcJoinFunction',
      'cdc-join',
      functionsDir,
      "Joins the two tables' changes per join key into a joined changelog and a view.",
      {
        JOIN: join.valueAsString,
        JOIN_KIND: kind.valueAsString,
        STATE_TABLE: stateTable.tableName,
        JOINED_SINK: `kinesis:${joined.streamName}`,
        VIEW_TABLE: view.tableName,
        DEAD_LETTER_SINK: `sqs:${deadLetters.queueUrl}`,
        // The changelog keeps records 24 hours; an hour more covers clock skew. A deleted view
        // row's tombstone stays as long.
        KEYWAY_REDELIVERY_WINDOW_SECONDS: '90000',
      },
    );
    grant(joiner, TABLE_READ_WRITE, stateTable.tableArn);
    grant(joiner, TABLE_READ_WRITE, view.tableArn);
    grant(joiner, KINESIS_SINK, joined.streamArn);
    grant(joiner, SQS_SINK, deadLetters.queueArn);
    addTrigger(joiner, 'CdcJoinFunction', 'Changelog', streamTrigger(changelog, failedBatches));

    new CfnOutput(this, 'CdcChangesStreamName', { value: changes.streamName });
    new CfnOutput(this, 'CdcUsersTableName', { value: users.tableName });
    new CfnOutput(this, 'CdcChangelogStreamName', { value: changelog.streamName });
    new CfnOutput(this, 'CdcJoinedStreamName', { value: joined.streamName });
    new CfnOutput(this, 'CdcViewTableName', { value: view.tableName });
    return { CdcRekey: rekey, CdcJoin: joiner };
  }

  /** Keyed aggregation (functions/keyed-aggregate): the events, partitioned by key or by a bucket
   * of a salted key; the first phase's partials, partitioned by key; the results. */
  private aggregation(
    stateTable: dynamodb.ITable,
    deadLetters: sqs.IQueue,
    failedBatches: sqs.IQueue,
    functionsDir: string,
  ): Record<string, lambda.Function> {
    const keyPointer = new CfnParameter(this, 'AggregateKeyPointer', {
      type: 'String',
      default: '/key',
      description: 'Where each event of the aggregation stream holds its key (a JSON pointer).',
    });
    const valuePointer = new CfnParameter(this, 'AggregateValuePointer', {
      type: 'String',
      default: '',
      description:
        'Where each event holds its value (a JSON pointer), for sum, min, max and mean; empty when ' +
        'only counting.',
    });
    const aggregates = new CfnParameter(this, 'Aggregates', {
      type: 'String',
      default: 'count',
      allowedPattern: '(count|sum|min|max|mean)(,(count|sum|min|max|mean))*',
      description: 'The aggregates each result reports, comma-separated.',
    });
    const windowSeconds = new CfnParameter(this, 'AggregateWindowSeconds', {
      type: 'String',
      default: '',
      allowedPattern: '[0-9]*',
      description: 'Tumbling event-time windows of this many seconds; empty for running totals per key.',
    });
    const timePointer = new CfnParameter(this, 'AggregateTimePointer', {
      type: 'String',
      default: '/time',
      description:
        'Where each event holds its event time (a JSON pointer to epoch milliseconds or an RFC 3339 ' +
        'string), when aggregating in windows.',
    });
    const lateness = new CfnParameter(this, 'AggregateLatenessSeconds', {
      type: 'Number',
      default: 60,
      minValue: 0,
      description:
        'How long after its end a window still takes events; a later event is late and goes to ' +
        'the dead-letter queue with the reason.',
    });
    const flush = new CfnParameter(this, 'AggregateFlushSeconds', {
      type: 'Number',
      default: 60,
      minValue: 1,
      description:
        "How long a key's running total (without windows) waits after its first change before it " +
        'goes to the merge: results lag the stream by this and up to a minute of the timer sweep.',
    });
    const hotKeyPeriod = new CfnParameter(this, 'HotKeyPeriodSeconds', {
      type: 'Number',
      default: 10,
      minValue: 1,
      description:
        'How often the keyed aggregation decides which keys are hot, from the records of the ' +
        'period that ended: producers salt the keys HotKeysTable lists.',
    });
    // The adaptive hot-key registry: each batch's heavy keys, and the keys hot now, which
    // producers read to salt them. Reports expire after a day; the list is remade every period.
    const hotKeys = keyedTable(this, 'HotKeysTable', RemovalPolicy.DESTROY);
    const input = stream(this, 'AggregateEventsStream', 4);
    const partials = stream(this, 'AggregatePartialsStream', 2);
    const results = stream(this, 'AggregateResultsStream', 2);

    const aggregate = rustFunction(
      this,
      'KeyedAggregateFunction',
      'keyed-aggregate',
      functionsDir,
      'Aggregates each key, or each bucket of a salted key, into partials.',
      {
        STATE_TABLE: stateTable.tableName,
        PARTIALS_SINK: `kinesis:${partials.streamName}`,
        DEAD_LETTER_SINK: `sqs:${deadLetters.queueUrl}`,
        KEY_POINTER: keyPointer.valueAsString,
        VALUE_POINTER: valuePointer.valueAsString,
        AGGREGATES: aggregates.valueAsString,
        WINDOW_SECONDS: windowSeconds.valueAsString,
        TIME_POINTER: timePointer.valueAsString,
        ALLOWED_LATENESS_SECONDS: lateness.valueAsString,
        FLUSH_SECONDS: flush.valueAsString,
        HOT_KEYS_TABLE: hotKeys.tableName,
        HOT_KEYS_PERIOD_SECONDS: hotKeyPeriod.valueAsString,
        // The stream keeps records 24 hours; an hour more covers clock skew.
        KEYWAY_REDELIVERY_WINDOW_SECONDS: '90000',
      },
    );
    grant(aggregate, TABLE_READ_WRITE, stateTable.tableArn);
    grant(aggregate, TABLE_READ_WRITE, hotKeys.tableArn);
    grant(aggregate, KINESIS_SINK, partials.streamArn);
    grant(aggregate, SQS_SINK, deadLetters.queueArn);
    addTrigger(aggregate, 'KeyedAggregateFunction', 'Events', streamTrigger(input, failedBatches));
    // Partials go to the merge on the keys' timers: a window's when it closes, a running total's
    // a minute after its first change since the last.
    const sweep = new events.Rule(this, 'KeyedAggregateFunctionSweepTimers', {
      schedule: events.Schedule.rate(Duration.minutes(1)),
      targets: [new targets.LambdaFunction(aggregate)],
    });
    logicalId(sweep, 'KeyedAggregateFunctionSweepTimers');

    const merge = rustFunction(
      this,
      'AggregateMergeFunction',
      'aggregate-merge',
      functionsDir,
      "Merges each key's partials from all its buckets into its result.",
      {
        STATE_TABLE: stateTable.tableName,
        RESULTS_SINK: `kinesis:${results.streamName}`,
        DEAD_LETTER_SINK: `sqs:${deadLetters.queueUrl}`,
        AGGREGATES: aggregates.valueAsString,
        KEYWAY_REDELIVERY_WINDOW_SECONDS: '90000',
      },
    );
    grant(merge, TABLE_READ_WRITE, stateTable.tableArn);
    grant(merge, KINESIS_SINK, results.streamArn);
    grant(merge, SQS_SINK, deadLetters.queueArn);
    addTrigger(merge, 'AggregateMergeFunction', 'Partials', streamTrigger(partials, failedBatches));

    new CfnOutput(this, 'HotKeysTableName', { value: hotKeys.tableName });
    new CfnOutput(this, 'AggregateEventsStreamName', { value: input.streamName });
    new CfnOutput(this, 'AggregatePartialsStreamName', { value: partials.streamName });
    new CfnOutput(this, 'AggregateResultsStreamName', { value: results.streamName });
    return { KeyedAggregate: aggregate, AggregateMerge: merge };
  }
}

/** What each function's alarm calls it, by the name its alarms' logical ids start with. */
const ALARMED: Record<string, string> = {
  KeyedCounter: 'keyed counter',
  IdentityEnricher: 'identity enricher',
  FilterPolicySync: 'filter policy sync',
  DynamicFilter: 'dynamic filter',
  CdcRekey: 'CDC re-key',
  CdcJoin: 'CDC join',
  KeyedAggregate: 'keyed aggregation',
  AggregateMerge: 'aggregation merge',
};

/** What each queue's depth alarm says. */
const QUEUE_ALARMS: Record<string, string> = {
  DeadLetterQueue: 'Records no retry could apply wait in the dead-letter queue.',
  FailedBatchesQueue: 'Batches Lambda gave up on are described in the failed-batches queue.',
};

/** The alarms of template.yaml's operations section: each stream-triggered function's iterator
 * age, errors and throttles; the depth of the dead-letter and failed-batches queues; and the
 * skew of the keyed counter's and keyed aggregation's streams over their shards, from the
 * records per shard their metric lines report (created where MetricMathAlarms is "true"). */
function operations(
  stack: Stack,
  functions: Record<string, lambda.Function>,
  queues: Record<string, sqs.IQueue>,
): void {
  const ageMillis = new CfnParameter(stack, 'IteratorAgeAlarmMillis', {
    type: 'Number',
    default: 300000,
    minValue: 1000,
    description:
      'A stream-triggered function whose oldest record has waited longer than this (IteratorAge, ' +
      'its maximum in each of three minutes running) raises its alarm: the function falls behind.',
  });
  const metricMath = new CfnParameter(stack, 'MetricMathAlarms', {
    type: 'String',
    default: 'true',
    allowedValues: ['true', 'false'],
    description:
      'Whether to create the alarms that compute their metric (the skew alarm, on the coefficient ' +
      'of variation of records per shard). An emulator whose CloudFormation takes only standard ' +
      'metric alarms deploys the stack with "false".',
  });
  const withMetricMath = new CfnCondition(stack, 'WithMetricMathAlarms', {
    expression: Fn.conditionEquals(metricMath.valueAsString, 'true'),
  });
  for (const [name, fn] of Object.entries(functions)) {
    const alarm = new cloudwatch.Alarm(stack, `${name}IteratorAgeAlarm`, {
      alarmDescription: `The ${ALARMED[name]} falls behind its stream${name === 'CdcRekey' ? 's' : ''}.`,
      metric: fn.metric('IteratorAge', { statistic: 'Maximum', period: Duration.minutes(1) }),
      evaluationPeriods: 3,
      threshold: ageMillis.valueAsNumber,
      comparisonOperator: cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
      treatMissingData: cloudwatch.TreatMissingData.NOT_BREACHING,
    });
    logicalId(alarm, `${name}IteratorAgeAlarm`);
  }
  for (const [name, fn] of Object.entries(functions)) {
    const failing = [
      ['Errors', 'fails whole invocations'],
      ['Throttles', 'is throttled'],
    ];
    for (const [metric, what] of failing) {
      const alarm = new cloudwatch.Alarm(stack, `${name}${metric}Alarm`, {
        alarmDescription: `The ${ALARMED[name]} ${what}.`,
        metric: fn.metric(metric, { statistic: 'Sum', period: Duration.minutes(1) }),
        evaluationPeriods: 3,
        threshold: 0,
        comparisonOperator: cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
        treatMissingData: cloudwatch.TreatMissingData.NOT_BREACHING,
      });
      logicalId(alarm, `${name}${metric}Alarm`);
    }
  }
  for (const [name, queue] of Object.entries(queues)) {
    const alarm = new cloudwatch.Alarm(stack, `${name}DepthAlarm`, {
      alarmDescription: QUEUE_ALARMS[name],
      metric: queue.metricApproximateNumberOfMessagesVisible({
        statistic: 'Maximum',
        period: Duration.minutes(1),
      }),
      evaluationPeriods: 1,
      threshold: 0,
      comparisonOperator: cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
      treatMissingData: cloudwatch.TreatMissingData.NOT_BREACHING,
    });
    logicalId(alarm, `${name}DepthAlarm`);
  }
  dashboard(stack, Object.keys(functions));

  skewAlarm(
    stack,
    'KeyedCounterSkewAlarm',
    functions.KeyedCounter,
    'keyed-counter',
    2,
    "One shard of the clicks stream carries much more than the other: the coefficient of variation of the keyed counter's records per shard is above 0.5.",
    withMetricMath,
  );
  skewAlarm(
    stack,
    'KeyedAggregateSkewAlarm',
    functions.KeyedAggregate,
    'keyed-aggregate',
    4,
    "The aggregation stream's load spreads unevenly over its four shards (a hot key no producer salts): the coefficient of variation of the first phase's records per shard is above 0.5.",
    withMetricMath,
  );
}

/** The outcome metrics of keyway's metric lines a function's dashboard widget graphs. */
const OUTCOMES = ['RecordsIn', 'Applied', 'DuplicatesSkipped', 'DeadLetters', 'RecordsLeftForRetry'];

/** template.yaml's dashboard: per function (by its name in ALARMED), what its batches did,
 * searched across its operators, beside Lambda's iterator age, errors and throttles; and what
 * waits in the dead-letter and failed-batches queues. Its body is a Fn::Sub string, as there. */
function dashboard(stack: Stack, names: string[]): void {
  const widget = (x: number, y: number, width: number, properties: object) => ({
    type: 'metric',
    x,
    y,
    width,
    height: 6,
    properties: { region: '${AWS::Region}', view: 'timeSeries', period: 60, ...properties },
  });
  const widgets = names.flatMap((name, i) => {
    const fn = `\${${name}Function}`;
    const search = (metric: string) =>
      `SEARCH('{keyway,Function,Operator} Function="${fn}" MetricName="${metric}"', 'Sum', 60)`;
    return [
      widget(0, i * 6, 12, {
        title: `${ALARMED[name]}: records`,
        metrics: OUTCOMES.map((metric, j) => [{ expression: search(metric), id: `m${j}`, label: metric }]),
      }),
      widget(12, i * 6, 12, {
        title: `${ALARMED[name]}: iterator age, errors, throttles`,
        metrics: [
          ['AWS/Lambda', 'IteratorAge', 'FunctionName', fn, { stat: 'Maximum' }],
          ['AWS/Lambda', 'Errors', 'FunctionName', fn, { stat: 'Sum', yAxis: 'right' }],
          ['AWS/Lambda', 'Throttles', 'FunctionName', fn, { stat: 'Sum', yAxis: 'right' }],
        ],
      }),
    ];
  });
  widgets.push(
    widget(0, names.length * 6, 24, {
      title: 'messages waiting in the failure queues',
      stat: 'Maximum',
      metrics: ['DeadLetterQueue', 'FailedBatchesQueue'].map((queue) => [
        'AWS/SQS',
        'ApproximateNumberOfMessagesVisible',
        'QueueName',
        `\${${queue}.QueueName}`,
      ]),
    }),
  );
  const board = new cloudwatch.CfnDashboard(stack, 'Dashboard', {
    dashboardBody: Fn.sub(JSON.stringify({ widgets })),
  });
  board.overrideLogicalId('Dashboard');
}

/** An alarm on the coefficient of variation of the records per shard that `fn`'s metric lines
 * report for `operator`, over its stream's first `shards` shards: above 0.5 for three minutes. */
function skewAlarm(
  stack: Stack,
  id: string,
  fn: lambda.Function,
  operator: string,
  shards: number,
  description: string,
  condition: CfnCondition,
): void {
  // An idle shard counts as load 0 (FILL), which is what makes it skew.
  const shardRecords = (shard: number) =>
    new cloudwatch.MathExpression({
      expression: `FILL(s${shard}, 0)`,
      usingMetrics: {
        [`s${shard}`]: new cloudwatch.Metric({
          namespace: 'keyway',
          metricName: 'Records',
          dimensionsMap: {
            Function: fn.functionName,
            Operator: operator,
            Shard: `shardId-${String(shard).padStart(12, '0')}`,
          },
          statistic: 'Sum',
          period: Duration.minutes(1),
        }),
      },
      period: Duration.minutes(1),
    });
  const ids = Array.from({ length: shards }, (_, i) => `f${i}`).join(', ');
  const usingMetrics: Record<string, cloudwatch.IMetric> = {};
  for (let shard = 0; shard < shards; shard++) {
    usingMetrics[`f${shard}`] = shardRecords(shard);
  }
  const skew = new cloudwatch.Alarm(stack, id, {
    alarmDescription: description,
    metric: new cloudwatch.MathExpression({
      expression: `STDDEV([${ids}]) / AVG([${ids}])`,
      usingMetrics,
      label: 'Coefficient of variation of records per shard',
      period: Duration.minutes(1),
    }),
    evaluationPeriods: 3,
    threshold: 0.5,
    comparisonOperator: cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
    treatMissingData: cloudwatch.TreatMissingData.NOT_BREACHING,
  });
  logicalId(skew, id);
  const resource = skew.node.defaultChild as CfnResource;
  resource.cfnOptions.condition = condition;
  // The id template.yaml gives the expression the alarm watches (the CDK numbers its own).
  resource.addPropertyOverride('Metrics.0.Id', 'cov');
}
