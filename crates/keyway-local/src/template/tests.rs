//! The template reader's tests: what a SAM template and its synthesized form wire, parameters,
//! mapping settings, filter criteria and schedules, and each refusal naming what it refuses.

use super::*;

const TEMPLATE: &str = r#"
Transform: AWS::Serverless-2016-10-31
Parameters:
  Stage:
    Type: String
    Default: dev
Globals:
  Function:
    Timeout: 30
    Environment:
      Variables:
        STAGE: !Ref Stage
Resources:
  State:
    Type: AWS::DynamoDB::Table
    Properties:
      KeySchema:
        - { AttributeName: pk, KeyType: HASH }
        - { AttributeName: sk, KeyType: RANGE }
      TimeToLiveSpecification: { AttributeName: ttl, Enabled: true }
  Clicks:
    Type: AWS::Kinesis::Stream
    Properties: { ShardCount: 2 }
  Failed:
    Type: AWS::SQS::Queue
  Counter:
    Type: AWS::Serverless::Function
    Properties:
      Environment:
        Variables:
          STATE_TABLE: !Ref State
          OUT: !Sub "sqs:${Failed}"
      Events:
        Clicks:
          Type: Kinesis
          Properties:
            Stream: !GetAtt Clicks.Arn
            StartingPosition: LATEST
            BatchSize: 500
            MaximumBatchingWindowInSeconds: 2
            FunctionResponseTypes: [ReportBatchItemFailures]
            BisectBatchOnFunctionError: true
            MaximumRetryAttempts: 5
            MaximumRecordAgeInSeconds: -1
            ParallelizationFactor: 4
            DestinationConfig:
              OnFailure:
                Destination: !GetAtt Failed.Arn
"#;

struct Names;
impl Resolver for Names {
    fn reference(&self, id: &str) -> Option<String> {
        Some(format!("ref-of-{id}"))
    }
    fn attribute(&self, id: &str, attr: &str) -> Option<String> {
        Some(format!("{attr}-of-{id}"))
    }
}

#[test]
fn parameters_given_at_deployment_replace_their_defaults_and_an_unknown_one_is_named() {
    let text = TEMPLATE
        .replace(
            "    Default: dev\n",
            "    Default: dev\n  Shards:\n    Type: Number\n    Default: 2\n",
        )
        .replace("{ ShardCount: 2 }", "{ ShardCount: !Ref Shards }");
    let (wiring, _) = parse(&text).unwrap();
    let shards = |wiring: &Wiring| match &wiring.resources["Clicks"] {
        Resource::Stream { shards, .. } => *shards,
        other => panic!("{other:?}"),
    };
    assert_eq!(shards(&wiring), 2, "the default");
    let given: BTreeMap<String, String> = [
        ("Shards".to_owned(), "16".to_owned()),
        ("Stage".to_owned(), "prod".to_owned()),
    ]
    .into();
    let (wiring, template) = parse_with(&text, &given).unwrap();
    assert_eq!(shards(&wiring), 16);
    let value: Value = serde_yaml::from_str("!Ref Stage").unwrap();
    struct Nothing;
    impl Resolver for Nothing {
        fn reference(&self, _: &str) -> Option<String> {
            None
        }
        fn attribute(&self, _: &str, _: &str) -> Option<String> {
            None
        }
    }
    assert_eq!(resolve(&value, &template, &Nothing).unwrap(), "prod");
    let unknown: BTreeMap<String, String> = [("Region".to_owned(), "x".to_owned())].into();
    assert_eq!(
        parse_with(&text, &unknown).unwrap_err().text(),
        "parameter Region: not in the template"
    );
}

#[test]
fn a_mapping_setting_made_a_parameter_takes_its_value_and_one_no_number_is_refused_by_name() {
    let text = TEMPLATE
        .replace(
            "    Default: dev\n",
            "    Default: dev\n  MaxAge:\n    Type: Number\n    Default: 3600\n",
        )
        .replace(
            "MaximumRecordAgeInSeconds: -1",
            "MaximumRecordAgeInSeconds: !Ref MaxAge",
        );
    let age = |wiring: &Wiring| wiring.functions[0].events[0].settings.maximum_record_age;
    assert_eq!(
        age(&parse(&text).unwrap().0),
        Some(Duration::from_secs(3600))
    );
    let given: BTreeMap<String, String> = [("MaxAge".to_owned(), "600".to_owned())].into();
    let (wiring, _) = parse_with(&text, &given).unwrap();
    assert_eq!(age(&wiring), Some(Duration::from_secs(600)));
    let attribute = text.replace("!Ref MaxAge", "!GetAtt Failed.Arn");
    let e = parse(&attribute).unwrap_err();
    assert!(
        e.text().contains("Counter.Clicks") && e.text().contains("MaximumRecordAgeInSeconds"),
        "{e}"
    );
}

#[test]
fn a_sam_template_gives_resources_functions_and_mapping_settings() {
    let (wiring, template) = parse(TEMPLATE).unwrap();
    assert_eq!(
        wiring.resources["State"],
        Resource::Table {
            name: "State".into(),
            hash_key: "pk".into(),
            range_key: Some("sk".into()),
            ttl_attribute: Some("ttl".into()),
            stream: None
        }
    );
    assert_eq!(
        wiring.resources["Clicks"],
        Resource::Stream {
            name: "Clicks".into(),
            shards: 2,
            retention: Duration::from_secs(24 * 3600),
            max_record_kib: 1024,
        }
    );
    let f = &wiring.functions[0];
    assert_eq!(f.timeout, Duration::from_secs(30));
    let event = &f.events[0];
    assert_eq!(event.source, SourceRef::Kinesis("Clicks".into()));
    assert_eq!(event.on_failure.as_deref(), Some("Failed"));
    let s = &event.settings;
    assert_eq!(
        (s.batch_size, s.maximum_batching_window, s.starting_position),
        (500, Duration::from_secs(2), StartingPosition::Latest)
    );
    assert!(s.report_batch_item_failures && s.bisect_batch_on_function_error);
    assert_eq!(
        (
            s.maximum_retry_attempts,
            s.maximum_record_age,
            s.parallelization_factor
        ),
        (Some(5), None, 4)
    );
    let env = f.resolved_env(&template, &Names).unwrap();
    let env = |k: &str| env[k].clone();
    assert_eq!(env("STATE_TABLE"), "ref-of-State");
    assert_eq!(env("OUT"), "sqs:ref-of-Failed");
    assert_eq!(
        env("STAGE"),
        "ref-of-Stage",
        "a resolver is asked before parameters"
    );
}

/// TEMPLATE as the CDK synthesizes it: JSON, plain functions, a separate mapping resource,
/// `Fn::Join` for interpolations, and no Globals.
const CLOUDFORMATION: &str = r#"{
  "Resources": {
    "State": {"Type": "AWS::DynamoDB::Table", "Properties": {
      "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
      "TimeToLiveSpecification": {"AttributeName": "ttl", "Enabled": true}}},
    "Clicks": {"Type": "AWS::Kinesis::Stream", "Properties": {"ShardCount": 2}},
    "Failed": {"Type": "AWS::SQS::Queue"},
    "CounterServiceRole": {"Type": "AWS::IAM::Role"},
    "Counter": {"Type": "AWS::Lambda::Function", "Properties": {
      "Timeout": 30,
      "Role": {"Fn::GetAtt": ["CounterServiceRole", "Arn"]},
      "Environment": {"Variables": {
        "STAGE": {"Ref": "Stage"},
        "STATE_TABLE": {"Ref": "State"},
        "OUT": {"Fn::Join": ["", ["sqs:", {"Ref": "Failed"}]]}}}}},
    "CounterClicks": {"Type": "AWS::Lambda::EventSourceMapping", "Properties": {
      "FunctionName": {"Ref": "Counter"},
      "EventSourceArn": {"Fn::GetAtt": ["Clicks", "Arn"]},
      "StartingPosition": "LATEST",
      "BatchSize": 500,
      "MaximumBatchingWindowInSeconds": 2,
      "FunctionResponseTypes": ["ReportBatchItemFailures"],
      "BisectBatchOnFunctionError": true,
      "MaximumRetryAttempts": 5,
      "MaximumRecordAgeInSeconds": -1,
      "ParallelizationFactor": 4,
      "DestinationConfig": {"OnFailure": {"Destination": {"Fn::GetAtt": ["Failed", "Arn"]}}}}}
  }
}"#;

#[test]
fn a_synthesized_cloudformation_template_wires_as_its_sam_form_does() {
    let (sam, sam_template) = parse(TEMPLATE).unwrap();
    let (cfn, cfn_template) = parse(CLOUDFORMATION).unwrap();
    assert_eq!(cfn.resources, sam.resources);
    let (s, c) = (&sam.functions[0], &cfn.functions[0]);
    assert_eq!(cfn.functions.len(), 1, "the role is not a function");
    assert_eq!(
        (&c.logical_id, &c.name, c.timeout, &c.events),
        (&s.logical_id, &s.name, s.timeout, &s.events)
    );
    assert_eq!(
        c.events[0].name, "Clicks",
        "the function's prefix is dropped"
    );
    assert_eq!(
        c.resolved_env(&cfn_template, &Names).unwrap(),
        s.resolved_env(&sam_template, &Names).unwrap()
    );
}

const CONSUMER: &str = r#"
Parameters:
  Target: { Type: String }
  Failed: { Type: String, Default: "arn:aws:sqs:us-east-1:000000000000:failed" }
  Prefix: { Type: String, Default: "p-" }
Resources:
  Table:
    Type: AWS::DynamoDB::Table
    Properties:
      TableName: !Sub "${Prefix}live"
      KeySchema: [{ AttributeName: pk, KeyType: HASH }]
      StreamSpecification: { StreamViewType: NEW_AND_OLD_IMAGES }
  Sync:
    Type: AWS::Lambda::EventSourceMapping
    Properties:
      FunctionName: !Ref Target
      EventSourceArn: !GetAtt Table.StreamArn
      StartingPosition: TRIM_HORIZON
      BatchSize: 100
      DestinationConfig: { OnFailure: { Destination: !Ref Failed } }
"#;

#[test]
fn a_mapping_of_another_stacks_function_is_read_with_the_parameters_that_name_it() {
    let target = "arn:aws:lambda:us-east-1:000000000000:function:sync";
    let parameters = BTreeMap::from([("Target".to_owned(), target.to_owned())]);
    let (wiring, _) = parse_with(CONSUMER, &parameters).unwrap();
    assert!(wiring.functions.is_empty());
    assert!(matches!(
        &wiring.resources["Table"],
        Resource::Table { name, stream: Some(StreamView::NewAndOldImages), .. } if name == "p-live"
    ));
    let mapping = &wiring.mappings[0];
    assert_eq!(
        (mapping.logical_id.as_str(), mapping.function.as_str()),
        ("Sync", target)
    );
    assert_eq!(mapping.event.source, SourceRef::DynamoDb("Table".into()));
    assert_eq!(mapping.event.settings.batch_size, 100);
    assert_eq!(
        (
            mapping.event.on_failure.as_deref(),
            mapping.on_failure_arn.as_deref()
        ),
        (None, Some("arn:aws:sqs:us-east-1:000000000000:failed"))
    );

    let e = parse(CONSUMER).unwrap_err();
    assert_eq!(
        e.to_string(),
        "template: Sync.FunctionName: !Ref Target: no such resource or parameter"
    );
}

#[test]
fn a_mapping_whose_source_is_not_a_resource_is_an_error_naming_it() {
    let broken = CLOUDFORMATION.replace(
        r#""EventSourceArn": {"Fn::GetAtt": ["Clicks", "Arn"]}"#,
        r#""EventSourceArn": "arn:aws:kinesis:us-east-1:000000000000:stream/x""#,
    );
    let e = parse(&broken).unwrap_err();
    assert!(e.text().contains("CounterClicks.EventSourceArn"), "{e}");
}

#[test]
fn a_misspelled_response_type_is_an_error_naming_the_event() {
    let broken = TEMPLATE.replace("[ReportBatchItemFailures]", "[ReportBatchItemFailure]");
    let e = parse(&broken).unwrap_err();
    assert!(
        e.text().contains("Counter.Clicks") && e.text().contains("ReportBatchItemFailure"),
        "{e}"
    );
}

#[test]
fn filter_criteria_are_compiled_and_a_malformed_pattern_is_refused_naming_event_and_place() {
    let with = |pattern: &str| {
        TEMPLATE.replacen(
            "FunctionResponseTypes: [ReportBatchItemFailures]",
            &format!(
                "FunctionResponseTypes: [ReportBatchItemFailures]\n            \
                 FilterCriteria:\n              Filters:\n                \
                 - Pattern: '{pattern}'"
            ),
            1,
        )
    };
    let (wiring, _) = parse(&with(r#"{"data": {"kind": ["click"]}}"#)).unwrap();
    let filters = &wiring.functions[0].events[0].settings.filters;
    assert_eq!(filters.len(), 1);
    assert!(filters[0].matches(&serde_json::json!({"data": {"kind": "click"}})));
    assert!(!filters[0].matches(&serde_json::json!({"data": {"kind": "view"}})));
    let e = parse(&with(r#"{"data": {"kind": [{"prefx": "c"}]}}"#)).unwrap_err();
    assert!(
        e.text().contains("Counter.Clicks")
            && e.text().contains("Filters[0]")
            && e.text().contains("/data/kind/0/prefx")
            && e.text().contains("unknown operator"),
        "{e}"
    );
}

#[test]
fn rate_schedules_are_read_and_a_cron_or_misspelled_rate_is_refused_naming_the_event() {
    assert_eq!(parse_rate("rate(1 minute)"), Some(Duration::from_secs(60)));
    assert_eq!(
        parse_rate("rate(5 minutes)"),
        Some(Duration::from_secs(300))
    );
    assert_eq!(parse_rate("rate(2 hours)"), Some(Duration::from_secs(7200)));
    assert_eq!(parse_rate("rate(1 day)"), Some(Duration::from_secs(86_400)));
    for wrong in [
        "rate(1 minutes)",
        "rate(5 minute)",
        "rate(0 days)",
        "rate(1 week)",
    ] {
        assert_eq!(parse_rate(wrong), None, "{wrong}");
    }
    let with = |schedule: &str| {
        TEMPLATE.replace(
            "      Events:\n",
            &format!(
                "      Events:\n        Sweep:\n          Type: Schedule\n          Properties:\n            Schedule: {schedule}\n"
            ),
        )
    };
    let (wiring, _) = parse(&with("rate(1 minute)")).unwrap();
    let counter = &wiring.functions[0];
    assert_eq!(
        counter.schedules,
        [ScheduleDef {
            name: "Sweep".into(),
            every: Duration::from_secs(60)
        }]
    );
    assert_eq!(counter.events.len(), 1, "a schedule is no stream event");
    let e = parse(&with("cron(0 12 * * ? *)")).unwrap_err();
    assert!(
        e.text().starts_with("Counter.Sweep.Schedule:") && e.text().contains("cron(0 12"),
        "{e}"
    );
    let off = with("rate(1 minute)\n            Enabled: false");
    assert!(parse(&off).unwrap().0.functions[0].schedules.is_empty());
}

#[test]
fn a_stream_opting_into_large_records_is_read_and_a_size_outside_kinesis_range_refused() {
    let stream = |kib: &str| {
        format!("Resources:\n  Big:\n    Type: AWS::Kinesis::Stream\n    Properties:\n      MaxRecordSizeInKiB: {kib}\n")
    };
    let (wiring, _) = parse(&stream("4096")).unwrap();
    assert!(matches!(
        wiring.resources["Big"],
        Resource::Stream {
            max_record_kib: 4096,
            ..
        }
    ));
    let e = parse(&stream("512")).unwrap_err();
    assert!(
        e.text()
            .starts_with("Big.MaxRecordSizeInKiB: 512 is outside"),
        "{e}"
    );
}
