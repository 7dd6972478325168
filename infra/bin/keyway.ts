// The CDK app: `npx cdk synth` (or deploy) in infra/, after `cargo lambda build --release`.
// Only wires: the stack is in lib/keyway-stack.ts.
import * as path from 'path';
import { App, DefaultStackSynthesizer } from 'aws-cdk-lib';
import { KeywayStack } from '../lib/keyway-stack';

const app = new App({ analyticsReporting: false });
new KeywayStack(app, 'keyway', {
  description:
    'keyway: keyed stream processing on Lambda, Kinesis, DynamoDB and SQS (the stack of template.yaml).',
  functionsDir:
    app.node.tryGetContext('functionsDir') ??
    path.join(__dirname, '..', '..', 'target', 'lambda'),
  // `-c bootstrapCheck=false` leaves out the check of the CDK bootstrap stack's version, for
  // environments without one, such as a local emulator of AWS's APIs.
  synthesizer: new DefaultStackSynthesizer({
    generateBootstrapVersionRule: app.node.tryGetContext('bootstrapCheck') !== 'false',
  }),
});
