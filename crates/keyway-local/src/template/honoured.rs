//! What the embedded runtime reproduces of a template, and the refusal of the rest. A setting read
//! past would let a test pass locally that fails on AWS: whatever the runtime accepts, it does as
//! AWS does, and anything else is an error at load time naming the resource, the property and the
//! value. Ranges and combinations are checked as Lambda's CreateEventSourceMapping checks them.

use serde_yaml::{Mapping, Value};

use super::{get, long_form, TemplateError};

/// Resource types the runtime creates and runs.
const RUN: &[&str] = &[
    "AWS::Serverless::Function",
    "AWS::Lambda::Function",
    "AWS::Lambda::EventSourceMapping",
    "AWS::DynamoDB::Table",
    "AWS::Kinesis::Stream",
    "AWS::SQS::Queue",
    // Only schedules: a rule with an event pattern is refused where its target is read.
    "AWS::Events::Rule",
];

/// Resource types that change nothing a function receives and nothing its records do:
/// permissions, monitoring, code layers, metadata. Accepted, and not run.
const INERT: &[&str] = &[
    "AWS::CDK::Metadata",
    "AWS::CloudWatch::Alarm",
    "AWS::CloudWatch::CompositeAlarm",
    "AWS::CloudWatch::Dashboard",
    "AWS::IAM::ManagedPolicy",
    "AWS::IAM::Policy",
    "AWS::IAM::Role",
    "AWS::KMS::Alias",
    "AWS::KMS::Key",
    "AWS::Lambda::LayerVersion",
    "AWS::Lambda::Permission",
    "AWS::Logs::LogGroup",
    "AWS::Logs::MetricFilter",
    "AWS::Serverless::LayerVersion",
    "AWS::SNS::Topic",
    "AWS::SNS::TopicPolicy",
    "AWS::SQS::QueuePolicy",
];

/// SAM event types the runtime runs: stream and queue triggers and rate schedules.
pub(super) const EVENT_TYPES: &[&str] = &["Kinesis", "DynamoDB", "SQS", "Schedule", "ScheduleV2"];

/// Properties of a Kinesis, DynamoDB Streams or SQS mapping the runtime honours (each source takes
/// its own of them); a SAM event and an `AWS::Lambda::EventSourceMapping` name them alike.
const HONOURED: &[&str] = &[
    "BatchSize",
    "BisectBatchOnFunctionError",
    "DestinationConfig",
    "Enabled",
    "FilterCriteria",
    "FunctionResponseTypes",
    "MaximumBatchingWindowInSeconds",
    "MaximumRecordAgeInSeconds",
    "MaximumRetryAttempts",
    "ParallelizationFactor",
    "ScalingConfig",
    "StartingPosition",
    "StartingPositionTimestamp",
];

/// Mapping properties that change nothing a function receives: the key that encrypts the filter
/// criteria, the mapping's own CloudWatch metrics, tags.
const INERT_PROPERTIES: &[&str] = &["KmsKeyArn", "MetricsConfig", "Tags"];

/// Refuses every resource whose type the runtime neither runs nor can leave out unnoticed.
pub(super) fn check_resource_types(resources: &Mapping) -> Result<(), TemplateError> {
    for (id, resource) in resources {
        let kind = get(resource, "Type")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if !RUN.contains(&kind) && !INERT.contains(&kind) {
            return Err(TemplateError::at(
                id.as_str().unwrap_or_default(),
                format!("resource type {kind:?} is not reproduced by the embedded runtime"),
            ));
        }
    }
    Ok(())
}

/// Refuses a property of a stream mapping the runtime does not honour; `source` names the ones
/// that say what it reads and runs (SAM's `Stream`; `EventSourceArn`, `FunctionName`).
pub(super) fn check_mapping_properties(
    path: &str,
    p: &Value,
    source: &[&str],
) -> Result<(), TemplateError> {
    for (key, value) in p.as_mapping().into_iter().flatten() {
        let key = key.as_str().unwrap_or_default();
        if !HONOURED.contains(&key) && !INERT_PROPERTIES.contains(&key) && !source.contains(&key) {
            return Err(TemplateError::at(
                format!("{path}.{key}"),
                format!(
                    "{} is not reproduced by the embedded runtime",
                    long_form(value)
                ),
            ));
        }
    }
    Ok(())
}

/// Checks that an integer property lies where Lambda accepts it: `None` when the template leaves
/// it out.
pub(super) fn ranged(
    key: &str,
    value: Option<i64>,
    allowed: &[std::ops::RangeInclusive<i64>],
) -> Result<Option<i64>, TemplateError> {
    match value {
        Some(v) if !allowed.iter().any(|r| r.contains(&v)) => {
            let ranges: Vec<String> = allowed
                .iter()
                .map(|r| match r.start() == r.end() {
                    true => r.start().to_string(),
                    false => format!("{}-{}", r.start(), r.end()),
                })
                .collect();
            Err(TemplateError::at(
                key,
                format!(
                    "{v} is outside what Lambda accepts ({})",
                    ranges.join(" or ")
                ),
            ))
        }
        other => Ok(other),
    }
}

/// A boolean property, or `default` when the template leaves it out.
pub(super) fn boolean(p: &Value, key: &str, default: bool) -> Result<bool, TemplateError> {
    match get(p, key) {
        None => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(Value::String(s)) if s == "true" || s == "false" => Ok(s == "true"),
        Some(other) => Err(TemplateError::at(
            key,
            format!("{} is not true or false", long_form(other)),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::super::{parse, Resource, StreamView};

    /// A stream, queues and a function whose Kinesis event has `extra` properties (one a line),
    /// with `resources` added to the template's.
    fn stack(extra: &[&str], resources: &str) -> String {
        let mut text = String::from(
            "Resources:
  Clicks:
    Type: AWS::Kinesis::Stream
    Properties: { ShardCount: 1 }
  Failed:
    Type: AWS::SQS::Queue
  Ordered:
    Type: AWS::SQS::Queue
    Properties: { FifoQueue: true }
  Alarms:
    Type: AWS::SNS::Topic
  Counter:
    Type: AWS::Serverless::Function
    Properties:
      Events:
        Clicks:
          Type: Kinesis
          Properties:
            Stream: !GetAtt Clicks.Arn
",
        );
        for line in extra {
            text.push_str(&format!("            {line}\n"));
        }
        text.push_str(resources);
        text
    }

    fn refused(extra: &[&str]) -> String {
        parse(&stack(extra, ""))
            .map(|_| panic!("{extra:?} was accepted"))
            .unwrap_err()
            .text()
    }

    /// CreateEventSourceMapping: "StartingPosition ... Required for Amazon Kinesis, Amazon
    /// DynamoDB, and Amazon MSK Streams sources. AT_TIMESTAMP is supported only for Amazon Kinesis
    /// streams".
    #[test]
    fn a_stream_mapping_without_a_starting_position_is_refused_naming_the_event() {
        assert_eq!(
            refused(&[]),
            "Counter.Clicks: StartingPosition: required for a Kinesis or DynamoDB Streams source"
        );
        let table = "  Live:
    Type: AWS::DynamoDB::Table
    Properties:
      KeySchema: [{ AttributeName: pk, KeyType: HASH }]
      StreamSpecification: { StreamViewType: NEW_AND_OLD_IMAGES }
  Sync:
    Type: AWS::Lambda::EventSourceMapping
    Properties:
      FunctionName: !Ref Counter
      EventSourceArn: !GetAtt Live.StreamArn
      StartingPosition: AT_TIMESTAMP
      StartingPositionTimestamp: 1767225600
";
        let e = parse(&stack(&["StartingPosition: LATEST"], table)).unwrap_err();
        assert!(
            e.text()
                .starts_with("Counter.Sync: StartingPosition: AT_TIMESTAMP is for Kinesis"),
            "{e}"
        );
    }

    /// CreateEventSourceMapping's parameter ranges for stream sources.
    #[test]
    fn settings_outside_lambdas_ranges_are_refused_naming_setting_and_value() {
        let at = "StartingPosition: LATEST";
        for (setting, range) in [
            ("BatchSize: 0", "(1-10000)"),
            ("BatchSize: 10001", "(1-10000)"),
            ("MaximumBatchingWindowInSeconds: 301", "(0-300)"),
            ("ParallelizationFactor: 11", "(1-10)"),
            ("ParallelizationFactor: 0", "(1-10)"),
            ("MaximumRecordAgeInSeconds: 59", "(-1 or 60-604800)"),
            ("MaximumRecordAgeInSeconds: 604801", "(-1 or 60-604800)"),
            ("MaximumRetryAttempts: -2", "(-1-10000)"),
            ("MaximumRetryAttempts: 10001", "(-1-10000)"),
        ] {
            let (key, value) = setting.split_once(": ").unwrap();
            assert_eq!(
                refused(&[at, setting]),
                format!("Counter.Clicks: {key}: {value} is outside what Lambda accepts {range}")
            );
        }
        let (wiring, _) = parse(&stack(
            &[
                at,
                "BatchSize: 10000",
                "MaximumRecordAgeInSeconds: -1",
                "MaximumRetryAttempts: -1",
                "ParallelizationFactor: 10",
                "MaximumBatchingWindowInSeconds: 300",
            ],
            "",
        ))
        .unwrap();
        let settings = &wiring.functions[0].events[0].settings;
        assert_eq!(settings.batch_size, 10_000);
        assert_eq!(settings.maximum_record_age, None);
        assert_eq!(settings.maximum_retry_attempts, None);
        assert_eq!(settings.parallelization_factor, 10);
        let e = refused(&[at, "BisectBatchOnFunctionError: yes please"]);
        assert_eq!(
            e,
            "Counter.Clicks: BisectBatchOnFunctionError: \"yes please\" is not true or false"
        );
    }

    #[test]
    fn a_mapping_property_the_runtime_does_not_reproduce_is_refused_naming_it_and_its_value() {
        let at = "StartingPosition: LATEST";
        assert_eq!(
            refused(&[at, "TumblingWindowInSeconds: 60"]),
            "Counter.Clicks.TumblingWindowInSeconds: 60 is not reproduced by the embedded runtime"
        );
        assert_eq!(
            refused(&[at, "StartingPositon: LATEST"]),
            "Counter.Clicks.StartingPositon: \"LATEST\" is not reproduced by the embedded runtime"
        );
        // What changes nothing a function receives is accepted.
        let inert = [
            "MetricsConfig: { Metrics: [EventCount] }",
            "KmsKeyArn: arn:aws:kms:k",
        ];
        assert!(parse(&stack(&[at, inert[0], inert[1]], "")).is_ok());
    }

    /// "Lambda doesn't support FIFO queues as on-failure destinations" (Lambda Developer Guide,
    /// "Retaining discarded batches for a Kinesis event source").
    #[test]
    fn an_on_failure_destination_other_than_a_standard_queue_is_refused() {
        let at = "StartingPosition: LATEST";
        let to = |queue: &str| {
            format!("DestinationConfig: {{ OnFailure: {{ Destination: !GetAtt {queue}.Arn }} }}")
        };
        let e = refused(&[at, &to("Ordered")]);
        assert!(
            e.starts_with(
                "Counter.Clicks.DestinationConfig: OnFailure.Destination Ordered: a FIFO queue"
            ),
            "{e}"
        );
        let e = refused(&[at, &to("Alarms")]);
        assert!(
            e.contains("a AWS::SNS::Topic is not an on-failure destination"),
            "{e}"
        );
        let sns = "DestinationConfig: { OnFailure: { Type: SNS, Destination: !Ref Alarms } }";
        assert!(refused(&[at, sns]).contains("OnFailure.Type SNS: only SQS"));
        let (wiring, _) = parse(&stack(&[at, &to("Failed")], "")).unwrap();
        assert_eq!(
            wiring.functions[0].events[0].on_failure.as_deref(),
            Some("Failed")
        );
    }

    #[test]
    fn an_event_source_or_resource_the_runtime_does_not_run_is_refused_naming_it() {
        let topic_event = "        Alerts:
          Type: SNS
          Properties: { Topic: !Ref Alarms }
";
        let text = stack(&["StartingPosition: LATEST"], "")
            .replace("      Events:\n", &format!("      Events:\n{topic_event}"));
        let e = parse(&text).unwrap_err();
        assert!(
            e.text().starts_with(
                "Counter.Alerts: event type \"SNS\" is not run by the embedded runtime"
            ),
            "{e}"
        );
        let consumer = "  Fanout:
    Type: AWS::Kinesis::StreamConsumer
    Properties: { ConsumerName: fan, StreamARN: !GetAtt Clicks.Arn }
";
        let e = parse(&stack(&["StartingPosition: LATEST"], consumer)).unwrap_err();
        assert_eq!(
            e.text(),
            "Fanout: resource type \"AWS::Kinesis::StreamConsumer\" is not reproduced by the embedded runtime"
        );
        let mapping = |source: &str| {
            format!(
                "  Drain:
    Type: AWS::Lambda::EventSourceMapping
    Properties:
      FunctionName: !Ref Counter
      EventSourceArn: !GetAtt {source}.Arn
"
            )
        };
        let e = parse(&stack(&["StartingPosition: LATEST"], &mapping("Alarms"))).unwrap_err();
        assert!(
            e.text()
                .starts_with("Drain.EventSourceArn: a AWS::SNS::Topic source is not run"),
            "{e}"
        );
        // A queue is a source the runtime runs.
        let (wiring, _) = parse(&stack(&["StartingPosition: LATEST"], &mapping("Failed"))).unwrap();
        let drain = wiring.functions[0]
            .events
            .iter()
            .find(|e| e.name == "Drain");
        assert_eq!(
            drain.map(|e| &e.source),
            Some(&super::super::SourceRef::Sqs("Failed".into()))
        );
    }

    #[test]
    fn enabled_false_is_read_and_anything_but_a_boolean_refused() {
        let at = "StartingPosition: LATEST";
        let (wiring, _) = parse(&stack(&[at, "Enabled: false"], "")).unwrap();
        assert!(!wiring.functions[0].events[0].settings.enabled);
        let (wiring, _) = parse(&stack(&[at], "")).unwrap();
        assert!(wiring.functions[0].events[0].settings.enabled);
        assert!(refused(&[at, "Enabled: 0"]).contains("Enabled: 0 is not true or false"));
    }

    #[test]
    fn a_tables_stream_view_type_is_read_and_an_unknown_one_refused() {
        let table = |view: &str| {
            format!(
                "  Live:
    Type: AWS::DynamoDB::Table
    Properties:
      KeySchema: [{{ AttributeName: pk, KeyType: HASH }}]
      StreamSpecification: {{ StreamViewType: {view} }}
"
            )
        };
        let at = ["StartingPosition: LATEST"];
        let (wiring, _) = parse(&stack(&at, &table("KEYS_ONLY"))).unwrap();
        let Resource::Table { stream, .. } = &wiring.resources["Live"] else {
            panic!("a table")
        };
        assert_eq!(*stream, Some(StreamView::KeysOnly));
        let e = parse(&stack(&at, &table("NEW_IMAGES"))).unwrap_err();
        assert_eq!(
            e.text(),
            "Live.StreamSpecification.StreamViewType: \"NEW_IMAGES\" is not one of KEYS_ONLY, NEW_IMAGE, OLD_IMAGE, NEW_AND_OLD_IMAGES"
        );
    }
}
