// The CDK app: `npx cdk synth` (or deploy) in infra/, after `cargo lambda build --release`.
// Only wires: the stacks are in lib/: keyway-stack.ts, and consumer-stack.ts, deployed once per
// consumer of the dynamic filter that owns its policy table.
import * as path from 'path';
import { App, DefaultStackSynthesizer } from 'aws-cdk-lib';
import { ConsumerStack } from '../lib/consumer-stack';
import { KeywayStack } from '../lib/keyway-stack';

const app = new App({ analyticsReporting: false });
// `-c bootstrapCheck=false` leaves out the check of the CDK bootstrap stack's version, for
// environments without one, such as a local emulator of AWS's APIs.
const synthesizer = () =>
  new DefaultStackSynthesizer({
    generateBootstrapVersionRule: app.node.tryGetContext('bootstrapCheck') !== 'false',
  });
new KeywayStack(app, 'keyway', {
  description:
    'keyway: keyed stream processing on Lambda, Kinesis, DynamoDB and SQS (the stack of template.yaml).',
  functionsDir:
    app.node.tryGetContext('functionsDir') ??
    path.join(__dirname, '..', '..', 'target', 'lambda'),
  synthesizer: synthesizer(),
});
// One deployment a consumer: `-c consumerStackName=keyway-live` names each its own stack.
new ConsumerStack(app, 'keyway-consumer', {
  stackName: app.node.tryGetContext('consumerStackName'),
  description:
    'keyway: one consumer of the dynamic filter, with its own policy table (the stack of consumer.yaml).',
  synthesizer: synthesizer(),
});
