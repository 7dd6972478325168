//! Least privilege. Each function's role grants exactly what the function needs, on exactly the
//! resources it needs it on, in template.yaml, in template.yaml as SAM transforms it, and in the
//! CDK app as it synthesizes:
//! - the actions of every port its wiring asks its platform for (the actions each adapter's SDK
//!   calls take are listed in one place, `keyway::adapters::permissions`), on the resource the
//!   port is on; a function is built on a recording platform to learn which ports it asks for;
//! - what Lambda does with the role: read the function's event sources, describe a discarded
//!   batch on its on-failure queue, write its log group.
//!
//! No action or resource is `*`; the only wildcards are a name prefix for what other stacks own
//! (consumers' queues and policy tables). No managed policy is attached: its grants could not be
//! checked here.
//!
//! The test command makes the SAM-transformed template (`scripts/sam_transform.py`, named by
//! `KEYWAY_SAM_TRANSFORMED`) and the CDK app's (`KEYWAY_CDK_OUT`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use keyway::adapters::permissions::{
    DYNAMODB_STREAM_TRIGGER, KINESIS_TRIGGER, LOGS, ON_FAILURE_QUEUE, SQS_TRIGGER,
};
use keyway::lambda::{Reach, Recording, SinkTarget};
use keyway_local::template::{long_form, parse, resources_of_type, SourceRef};
use keyway_local::{Factory, FaultPlan, LocalRuntime, LocalServices};
use serde_json::Value;

const EPOCH: i64 = 1_767_225_600_000;

/// Consumers' queues, which the dynamic filter's sink maker sends to: named with the stack's
/// ConsumerQueuePrefix, the consumer's id and an underscore (`QueueOwnership`).
const CONSUMER_QUEUES: &str =
    "arn:${AWS::Partition}:sqs:${AWS::Region}:${AWS::AccountId}:${ConsumerQueuePrefix}*_*";
/// The streams of consumers' policy tables, which consumers' stacks (consumer.yaml) map to the
/// function the FilterPolicySyncFunctionArn output names: their tables are named by the
/// PolicyTablePrefix output.
const CONSUMER_POLICY_STREAMS: &str = "arn:${AWS::Partition}:dynamodb:${AWS::Region}:${AWS::AccountId}:table/${AWS::StackName}-policies-*/stream/*";

/// One grant: an action on a resource (`Id.Attribute`, or the text of a `Fn::Sub`).
type Grants = BTreeSet<(String, String)>;

fn template_yaml() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../template.yaml"))
        .expect("template.yaml")
}

/// The templates the test command made, or an explanation of why there are none.
fn made_template(variable: &str, file: &str) -> Option<String> {
    match std::env::var(variable) {
        Ok(path) => {
            let path = if file.is_empty() {
                path
            } else {
                format!("{path}/{file}")
            };
            Some(std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}")))
        }
        Err(_) if std::env::var("KEYWAY_REQUIRE_CDK").is_ok() => {
            panic!(
                "{variable} is not set, but KEYWAY_REQUIRE_CDK says the templates must be checked"
            )
        }
        Err(_) => {
            eprintln!(
                "{variable} is not set: that template was not checked (./scripts/test checks it)"
            );
            None
        }
    }
}

/// The ports each function of `text` asks for, by logical id, with the deployed stack's name
/// or URL of every resource, by logical id.
fn reached(text: &str) -> (BTreeMap<String, Vec<Reach>>, BTreeMap<String, String>) {
    let reached: Arc<Mutex<BTreeMap<String, Vec<Reach>>>> = Arc::default();
    let factories: BTreeMap<String, Factory> = keyway_stack::functions()
        .into_iter()
        .map(|(id, factory)| {
            let (reached, function) = (reached.clone(), id.clone());
            let recording: Factory = Box::new(move |platform, env| {
                let recording = Recording::new(platform);
                let handler = factory(&recording, env)?;
                reached
                    .lock()
                    .unwrap()
                    .insert(function.clone(), recording.reached());
                Ok(handler)
            });
            (id, recording)
        })
        .collect();
    let services = LocalServices::new(EPOCH, FaultPlan::default());
    let runtime = LocalRuntime::from_template(text, services, &factories).expect("deploys");
    let (wiring, _) = parse(text).unwrap();
    let names = wiring
        .resources
        .keys()
        .map(|id| (runtime.resource(id).expect("created"), id.clone()))
        .collect();
    let reached = reached.lock().unwrap().clone();
    (reached, names)
}

fn grant(grants: &mut Grants, actions: &[&str], resource: impl Into<String>) {
    let resource = resource.into();
    for action in actions {
        grants.insert(((*action).to_owned(), resource.clone()));
    }
}

/// What each function of `text` needs, by logical id.
fn needed(text: &str) -> BTreeMap<String, Grants> {
    let (reached, names) = reached(text);
    let (wiring, template) = parse(text).unwrap();
    let template = long_form(&template);
    let id_of = |name: &str| -> String {
        names
            .get(name)
            .unwrap_or_else(|| panic!("{name} is none of the template's resources"))
            .clone()
    };
    let mut needed = BTreeMap::new();
    for function in &wiring.functions {
        let mut grants = Grants::new();
        for reach in &reached[&function.logical_id] {
            let resource = match reach {
                Reach::StateStore { table } | Reach::Table { table, .. } => id_of(table),
                Reach::Sink(SinkTarget::Kinesis(stream)) => id_of(stream),
                Reach::Sink(SinkTarget::Sqs(url)) => id_of(url),
                Reach::SinkMaker => {
                    grant(&mut grants, reach.actions(), CONSUMER_QUEUES);
                    continue;
                }
            };
            grant(&mut grants, reach.actions(), format!("{resource}.Arn"));
        }
        for event in &function.events {
            match &event.source {
                SourceRef::Kinesis(id) => grant(&mut grants, KINESIS_TRIGGER, format!("{id}.Arn")),
                SourceRef::DynamoDb(id) => grant(
                    &mut grants,
                    DYNAMODB_STREAM_TRIGGER,
                    format!("{id}.StreamArn"),
                ),
                SourceRef::Sqs(id) => grant(&mut grants, SQS_TRIGGER, format!("{id}.Arn")),
            }
            if let Some(queue) = &event.on_failure {
                grant(&mut grants, ON_FAILURE_QUEUE, format!("{queue}.Arn"));
            }
        }
        let properties = &template["Resources"][&function.logical_id]["Properties"];
        let log_group = properties["LoggingConfig"]["LogGroup"]["Ref"]
            .as_str()
            .unwrap_or_else(|| {
                panic!(
                    "{}: LoggingConfig names no log group of the stack",
                    function.logical_id
                )
            });
        grant(&mut grants, LOGS, format!("{log_group}.Arn"));
        if mapped_from_consumer_stacks(&template, &function.logical_id) {
            grant(
                &mut grants,
                DYNAMODB_STREAM_TRIGGER,
                CONSUMER_POLICY_STREAMS,
            );
        }
        needed.insert(function.logical_id.clone(), grants);
    }
    needed
}

/// Whether consumers' stacks map their policy tables to `function`: the stack outputs its ARN
/// for them, beside the prefix their tables are named by.
fn mapped_from_consumer_stacks(template: &Value, function: &str) -> bool {
    let outputs = &template["Outputs"];
    let arn = &outputs["FilterPolicySyncFunctionArn"]["Value"]["Fn::GetAtt"];
    if arn[0] != function {
        return false;
    }
    assert_eq!(
        outputs["PolicyTablePrefix"]["Value"]["Fn::Sub"], "${AWS::StackName}-policies-",
        "the prefix consumers' policy tables are named by"
    );
    true
}

/// A resource of a statement, as `needed` names them.
fn resource_name(value: &Value) -> String {
    if let Some(text) = value.as_str() {
        return text.to_owned();
    }
    match (&value["Fn::GetAtt"], &value["Fn::Sub"]) {
        (Value::Array(parts), _) if parts.len() == 2 => {
            format!(
                "{}.{}",
                parts[0].as_str().unwrap(),
                parts[1].as_str().unwrap()
            )
        }
        (Value::String(dotted), _) => dotted.clone(),
        (_, Value::String(text)) => text.clone(),
        _ => value.to_string(),
    }
}

fn one_or_many(value: &Value) -> Vec<Value> {
    match value {
        Value::Array(items) => items.clone(),
        Value::Null => Vec::new(),
        other => vec![other.clone()],
    }
}

/// What the role of each function of `text` grants, by the function's logical id. Fails on a
/// managed policy, a Deny or a condition, which this comparison would not see.
fn granted(text: &str) -> BTreeMap<String, Grants> {
    let (_, yaml) = parse(text).unwrap();
    let template = long_form(&yaml);
    let resources = template["Resources"].as_object().unwrap();
    let mut functions = resources_of_type(&yaml, "AWS::Serverless::Function");
    functions.extend(resources_of_type(&yaml, "AWS::Lambda::Function"));
    let mut granted = BTreeMap::new();
    for (id, function) in functions {
        let role_id = function["Properties"]["Role"]["Fn::GetAtt"][0]
            .as_str()
            .unwrap_or_else(|| panic!("{id}: its role is not a role of the stack"))
            .to_owned();
        let role = &resources[&role_id]["Properties"];
        assert!(
            one_or_many(&role["ManagedPolicyArns"]).is_empty(),
            "{id}: {role_id} attaches managed policies: {}",
            role["ManagedPolicyArns"]
        );
        let mut documents: Vec<Value> = one_or_many(&role["Policies"])
            .iter()
            .map(|p| p["PolicyDocument"].clone())
            .collect();
        for policy in resources.values() {
            let attached = one_or_many(&policy["Properties"]["Roles"])
                .iter()
                .any(|r| r["Ref"] == role_id.as_str());
            if policy["Type"] == "AWS::IAM::Policy" && attached {
                documents.push(policy["Properties"]["PolicyDocument"].clone());
            }
        }
        let mut grants = Grants::new();
        for statement in documents.iter().flat_map(|d| one_or_many(&d["Statement"])) {
            assert_eq!(statement["Effect"], "Allow", "{id}: {statement}");
            assert!(statement["Condition"].is_null(), "{id}: {statement}");
            for action in one_or_many(&statement["Action"]) {
                for resource in one_or_many(&statement["Resource"]) {
                    let action = action.as_str().expect("an action is a string").to_owned();
                    grants.insert((action, resource_name(&resource)));
                }
            }
        }
        granted.insert(id, grants);
    }
    granted
}

/// Every grant of `text` is needed, and every need granted; no action or resource is a
/// wildcard, and a resource's only wildcard ends another stack's name prefix.
fn check(label: &str, text: &str) {
    let needed = needed(text);
    let granted = granted(text);
    assert_eq!(
        granted.keys().collect::<Vec<_>>(),
        needed.keys().collect::<Vec<_>>(),
        "{label}: the functions"
    );
    for (function, grants) in &granted {
        for (action, resource) in grants {
            assert!(
                !action.contains('*'),
                "{label}: {function} is granted {action}"
            );
            assert!(
                !resource.contains('*')
                    || [CONSUMER_QUEUES, CONSUMER_POLICY_STREAMS].contains(&resource.as_str()),
                "{label}: {function} is granted {action} on {resource}"
            );
        }
        let need = &needed[function];
        let more: Vec<_> = grants.difference(need).collect();
        let missing: Vec<_> = need.difference(grants).collect();
        assert!(
            more.is_empty() && missing.is_empty(),
            "{label}: {function}'s role\n  grants what no code of it calls: {more:#?}\n  lacks what it needs: {missing:#?}"
        );
    }
}

#[test]
fn template_yaml_grants_each_function_exactly_what_its_code_and_its_triggers_call() {
    check("template.yaml", &template_yaml());
}

#[test]
fn template_yaml_as_sam_transforms_it_grants_each_function_exactly_what_it_needs() {
    if let Some(text) = made_template("KEYWAY_SAM_TRANSFORMED", "") {
        check("template.yaml, transformed by SAM", &text);
    }
}

#[test]
fn the_cdk_app_grants_each_function_exactly_what_it_needs() {
    if let Some(text) = made_template("KEYWAY_CDK_OUT", "keyway.template.json") {
        check("the CDK app's template", &text);
    }
}

#[test]
fn a_role_granting_an_action_more_or_one_less_or_a_wildcard_fails_the_check() {
    let text = template_yaml();
    let line = "                  - dynamodb:Scan\n";
    let role = text.find("  KeyedCounterFunctionRole:").unwrap();
    let scan = role + text[role..].find(line).unwrap();
    let less = format!("{}{}", &text[..scan], &text[scan + line.len()..]);
    let more = format!(
        "{}                  - dynamodb:DeleteItem\n{}",
        &text[..scan],
        &text[scan..]
    );
    let star = text.replacen("Resource: !GetAtt CountsQueue.Arn", "Resource: \"*\"", 1);
    assert_ne!(star, text);
    let cases = [
        (
            "one less",
            less,
            "lacks what it needs: [\n    (\n        \"dynamodb:Scan\"",
        ),
        (
            "one more",
            more,
            "grants what no code of it calls: [\n    (\n        \"dynamodb:DeleteItem\"",
        ),
        ("a wildcard", star, "is granted sqs:SendMessage on *"),
    ];
    for (what, text, said) in cases {
        let failed = std::panic::catch_unwind(|| check(what, &text))
            .expect_err(&format!("a role granting {what} passed the check"));
        let message = failed.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(message.contains(said), "{what}: {message}");
    }
}

/// Whether `name` matches an IAM resource pattern in which `*` stands for any run of characters.
fn iam_matches(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, rest)) => {
            let Some(name) = name.strip_prefix(head) else {
                return false;
            };
            (0..=name.len())
                .filter(|&i| name.is_char_boundary(i))
                .any(|i| iam_matches(rest, &name[i..]))
        }
    }
}

#[test]
fn the_filters_grant_on_consumers_queues_reaches_no_queue_cloudformation_names_for_the_stack() {
    // CloudFormation names a queue without a QueueName `<stack>-<logical id>-<12 random
    // letters and digits>`, and a stack's name is letters, digits and hyphens: none holds an
    // underscore, which the grant asks of every name after the prefix.
    let template = template_yaml();
    let lines: Vec<&str> = template.lines().collect();
    let queues: Vec<String> = lines
        .windows(2)
        .filter(|pair| pair[1].trim() == "Type: AWS::SQS::Queue")
        .map(|pair| pair[0].trim().trim_end_matches(':').to_owned())
        .collect();
    assert!(queues.contains(&"DeadLetterQueue".to_owned()), "{queues:?}");
    for (stack, prefix) in [
        ("keyway", "keyway-"),
        ("keyway-prod", "keyway-"),
        ("k", "k"),
    ] {
        let grant = CONSUMER_QUEUES
            .rsplit(':')
            .next()
            .unwrap()
            .replace("${ConsumerQueuePrefix}", prefix);
        for queue in &queues {
            let name = format!("{stack}-{queue}-1A2B3C4D5E6F");
            assert!(!iam_matches(&grant, &name), "{grant} reaches {name}");
        }
        assert!(iam_matches(&grant, &format!("{prefix}live_events")));
    }
}
