//! Reads the wiring of the embedded runtime from the SAM template the stack is deployed with:
//! tables, streams, queues, and for each function its environment and its Kinesis and DynamoDB
//! event sources with their settings. Local and deployed wiring therefore cannot drift.
//!
//! The template is read as CloudFormation reads it, for what keyway stacks use: `Parameters`
//! with defaults, `Globals.Function`, `!Ref`, `!GetAtt`, `!Sub`, `Fn::Join` (and their `Ref`/`Fn::`
//! forms). Functions are either SAM's `AWS::Serverless::Function` with `Events`, or, as the CDK
//! app in infra/ synthesizes them, `AWS::Lambda::Function` with `AWS::Lambda::EventSourceMapping`
//! resources; JSON templates read as YAML does. What the runtime does not reproduce (a resource
//! type, an event source, a mapping property, a value outside Lambda's ranges) is refused when the
//! template is read, by name (`honoured`).

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::time::Duration;

use serde_yaml::Value;

mod honoured;

use super::mapping::{MappingSettings, StartingPosition, DYNAMODB_STREAM_RETENTION};
use super::services::dynamodb::StreamView;
use super::services::sqs::QueueConfig;
use crate::domain::pattern::{Dialect, Pattern};
use crate::lambda::Env;

/// A resource the embedded runtime creates.
#[derive(Clone, Debug, PartialEq)]
pub enum Resource {
    Table {
        name: String,
        hash_key: String,
        range_key: Option<String>,
        ttl_attribute: Option<String>,
        /// The stream's view type, when the table has a stream.
        stream: Option<StreamView>,
    },
    Stream {
        name: String,
        shards: usize,
        /// How long the stream keeps a record (RetentionPeriodHours, 24 by default).
        retention: Duration,
        /// MaxRecordSizeInKiB: 1,024 (1 MiB) unless the stream opts into larger records.
        max_record_kib: usize,
    },
    Queue {
        name: String,
        /// Its attributes; the redrive policy is in `dead_letter`.
        config: QueueConfig,
        /// RedrivePolicy: the dead-letter queue (a logical id, or an ARN given by value) and
        /// maxReceiveCount.
        dead_letter: Option<(String, u32)>,
    },
}

/// Where an event source reads from: the logical id of a stream or table.
#[derive(Clone, Debug, PartialEq)]
pub enum SourceRef {
    Kinesis(String),
    DynamoDb(String),
    Sqs(String),
}

/// A function's event source mapping, as the template defines it.
#[derive(Clone, Debug, PartialEq)]
pub struct EventDef {
    pub name: String,
    pub source: SourceRef,
    pub settings: MappingSettings,
    /// Logical id of the on-failure queue.
    pub on_failure: Option<String>,
}

/// A schedule that invokes a function (SAM's `Schedule` and `ScheduleV2` events, an
/// `AWS::Events::Rule` targeting it), as the template defines it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduleDef {
    pub name: String,
    /// A `rate(...)` expression's period.
    pub every: Duration,
}

#[derive(Clone, Debug, PartialEq)]
pub struct FunctionDef {
    pub logical_id: String,
    pub name: String,
    pub timeout: Duration,
    pub env: Env,
    pub events: Vec<EventDef>,
    pub schedules: Vec<ScheduleDef>,
}

/// An `AWS::Lambda::EventSourceMapping` of a function the template does not define: one another
/// stack deployed, as a consumer's stack maps its own table to the keyway stack's function.
#[derive(Clone, Debug, PartialEq)]
pub struct MappingDef {
    pub logical_id: String,
    /// The function's name or ARN, resolved (a parameter, usually).
    pub function: String,
    /// Its settings' function timeout is the default; the deployed function's replaces it.
    pub event: EventDef,
    /// The on-failure destination's ARN when the template gives it by value (a parameter) rather
    /// than as one of its queues.
    pub on_failure_arn: Option<String>,
}

/// Everything the runtime needs from the template.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Wiring {
    /// By logical id.
    pub resources: BTreeMap<String, Resource>,
    pub functions: Vec<FunctionDef>,
    pub mappings: Vec<MappingDef>,
}

/// Lambda's default function timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3);

impl Wiring {
    /// How long after a record's arrival `event` may still deliver it: its source's retention,
    /// or the mapping's MaximumRecordAgeInSeconds if shorter.
    pub fn redelivery_horizon(&self, event: &EventDef) -> Duration {
        let retention = match &event.source {
            SourceRef::Kinesis(id) => match self.resources.get(id) {
                Some(Resource::Stream { retention, .. }) => *retention,
                _ => DYNAMODB_STREAM_RETENTION,
            },
            SourceRef::DynamoDb(_) => DYNAMODB_STREAM_RETENTION,
            // A queue's messages carry no lineage: nothing to remember of them.
            SourceRef::Sqs(_) => Duration::ZERO,
        };
        event
            .settings
            .maximum_record_age
            .map_or(retention, |age| age.min(retention))
    }
}

/// How a reference to a resource resolves: its name, URL or ARN.
pub trait Resolver {
    /// `!Ref logical_id`
    fn reference(&self, logical_id: &str) -> Option<String>;
    /// `!GetAtt logical_id.attribute`
    fn attribute(&self, logical_id: &str, attribute: &str) -> Option<String>;
}

#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error("template: {0}")]
pub struct TemplateError(pub String);

fn err<T>(message: impl Into<String>) -> Result<T, TemplateError> {
    Err(TemplateError(message.into()))
}

fn get<'a>(value: &'a Value, key: &str) -> Option<&'a Value> {
    value.as_mapping().and_then(|m| m.get(key))
}

/// Parses a template's text into its wiring; references are resolved later, once the resources
/// exist, by `resolve`. Parameters take their defaults.
pub fn parse(text: &str) -> Result<(Wiring, Value), TemplateError> {
    parse_with(text, &BTreeMap::new())
}

/// Parses a template as `parse` does, with `parameters` given values, as a deployment would give
/// them; each must be one the template declares.
pub fn parse_with(
    text: &str,
    parameters: &BTreeMap<String, String>,
) -> Result<(Wiring, Value), TemplateError> {
    let mut template: Value =
        serde_yaml::from_str(text).map_err(|e| TemplateError(format!("not YAML: {e}")))?;
    for (name, value) in parameters {
        let declared = template
            .get_mut("Parameters")
            .and_then(|p| p.get_mut(name.as_str()))
            .and_then(Value::as_mapping_mut)
            .ok_or_else(|| TemplateError(format!("parameter {name}: not in the template")))?;
        declared.insert("Default".into(), Value::String(value.clone()));
    }
    let resources = get(&template, "Resources")
        .and_then(Value::as_mapping)
        .ok_or_else(|| TemplateError("no Resources".into()))?;
    honoured::check_resource_types(resources)?;
    let mut wiring = Wiring::default();
    for (id, resource) in resources {
        let id = id
            .as_str()
            .ok_or_else(|| TemplateError("a resource id is not a string".into()))?
            .to_owned();
        let kind = get(resource, "Type")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let props = get(resource, "Properties").cloned().unwrap_or(Value::Null);
        // A name the template gives: literal, or made of parameters (`!Sub "${Prefix}x"`).
        let literal = |key: &str| {
            get(&props, key)
                .map(|v| resolve(v, &template, &ParametersOnly))
                .transpose()
                .map_err(|e| TemplateError(format!("{id}.{key}: {}", e.0)))
        };
        match kind {
            "AWS::DynamoDB::Table" => {
                let schema = get(&props, "KeySchema")
                    .and_then(Value::as_sequence)
                    .cloned()
                    .unwrap_or_default();
                let key_of = |role: &str| {
                    schema
                        .iter()
                        .find(|k| get(k, "KeyType").and_then(Value::as_str) == Some(role))
                        .and_then(|k| get(k, "AttributeName"))
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                };
                let hash_key = key_of("HASH")
                    .ok_or_else(|| TemplateError(format!("{id}: KeySchema has no HASH key")))?;
                let ttl = get(&props, "TimeToLiveSpecification");
                let ttl_attribute = ttl
                    .filter(|t| get(t, "Enabled").and_then(Value::as_bool) == Some(true))
                    .and_then(|t| get(t, "AttributeName"))
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                let stream = stream_view(&id, &props)?;
                let name = literal("TableName")?.unwrap_or_else(|| id.clone());
                wiring.resources.insert(
                    id.clone(),
                    Resource::Table {
                        name,
                        hash_key,
                        range_key: key_of("RANGE"),
                        ttl_attribute,
                        stream,
                    },
                );
            }
            "AWS::Kinesis::Stream" => {
                let shards = match get(&props, "ShardCount") {
                    Some(count) => whole_number(count, &template)
                        .ok_or_else(|| TemplateError(format!("{id}.ShardCount: not a number")))?,
                    None => 1,
                } as usize;
                let name = literal("Name")?.unwrap_or_else(|| id.clone());
                let hours = get(&props, "RetentionPeriodHours")
                    .and_then(Value::as_u64)
                    .unwrap_or(24);
                let retention = Duration::from_secs(hours * 3600);
                let max_record_kib = int_setting(&props, "MaxRecordSizeInKiB", &[1024..=10_240])
                    .map_err(|e| TemplateError(format!("{id}.{}", e.0)))?
                    .unwrap_or(1024) as usize;
                wiring.resources.insert(
                    id.clone(),
                    Resource::Stream {
                        name,
                        shards,
                        retention,
                        max_record_kib,
                    },
                );
            }
            "AWS::SQS::Queue" => {
                let fifo = is_fifo(&props);
                let name = literal("QueueName")?.unwrap_or_else(|| {
                    if fifo {
                        format!("{id}.fifo")
                    } else {
                        id.clone()
                    }
                });
                let (config, dead_letter) = queue_attributes(&id, &props, &template)?;
                wiring.resources.insert(
                    id.clone(),
                    Resource::Queue {
                        name,
                        config,
                        dead_letter,
                    },
                );
            }
            _ => {}
        }
    }
    for (id, resource) in resources {
        let id = id.as_str().unwrap_or_default();
        match get(resource, "Type").and_then(Value::as_str) {
            Some("AWS::Serverless::Function") => wiring
                .functions
                .push(sam_function(&template, id, resource)?),
            Some("AWS::Lambda::Function") => wiring
                .functions
                .push(lambda_function(&template, resources, id, resource)?),
            _ => {}
        }
    }
    wiring.mappings = external_mappings(&template, resources, &wiring)?;
    Ok((wiring, template))
}

/// The resources of type `kind`: logical id and properties.
fn of_type<'a>(
    resources: &'a serde_yaml::Mapping,
    kind: &'a str,
) -> impl Iterator<Item = (&'a str, Value)> + 'a {
    resources
        .iter()
        .filter(move |(_, r)| get(r, "Type").and_then(Value::as_str) == Some(kind))
        .map(|(id, r)| {
            let props = get(r, "Properties").cloned().unwrap_or(Value::Null);
            (id.as_str().unwrap_or_default(), props)
        })
}

/// Whether a queue's properties make it FIFO (CloudFormation takes `true` or `"true"`).
fn is_fifo(props: &Value) -> bool {
    get(props, "FifoQueue").is_some_and(|v| v.as_bool() == Some(true) || v.as_str() == Some("true"))
}

/// A queue's attributes that change what its consumers meet, each checked against SQS's ranges;
/// a delay, which the runtime does not reproduce, is refused.
fn queue_attributes(
    id: &str,
    props: &Value,
    template: &Value,
) -> Result<(QueueConfig, Option<(String, u32)>), TemplateError> {
    let seconds = |key: &str, allowed: RangeInclusive<i64>| {
        int_setting(props, key, &[allowed])
            .map(|v| v.map(|v| Duration::from_secs(v as u64)))
            .map_err(|e| TemplateError(format!("{id}.{}", e.0)))
    };
    if seconds("DelaySeconds", 0..=900)?.is_some_and(|d| !d.is_zero()) {
        return err(format!(
            "{id}.DelaySeconds: delayed messages are not reproduced by the embedded runtime"
        ));
    }
    let defaults = QueueConfig::default();
    let config = QueueConfig {
        visibility_timeout: seconds("VisibilityTimeout", 0..=43_200)?
            .unwrap_or(defaults.visibility_timeout),
        retention: seconds("MessageRetentionPeriod", 60..=1_209_600)?.unwrap_or(defaults.retention),
        content_based_deduplication: honoured::boolean(props, "ContentBasedDeduplication", false)
            .map_err(|e| TemplateError(format!("{id}.{}", e.0)))?,
        redrive: None,
    };
    let Some(policy) = get(props, "RedrivePolicy") else {
        return Ok((config, None));
    };
    // CloudFormation takes the policy as an object or as its JSON text.
    let policy: Value = match policy.as_str() {
        Some(text) => serde_yaml::from_str(text)
            .map_err(|e| TemplateError(format!("{id}.RedrivePolicy: not JSON: {e}")))?,
        None => policy.clone(),
    };
    let target = get(&policy, "deadLetterTargetArn")
        .ok_or_else(|| TemplateError(format!("{id}.RedrivePolicy: no deadLetterTargetArn")))?;
    let target = match logical_id(target) {
        Some(queue) => queue,
        None => resolve(target, template, &ParametersOnly).map_err(|e| {
            TemplateError(format!("{id}.RedrivePolicy.deadLetterTargetArn: {}", e.0))
        })?,
    };
    let most = int_setting(&policy, "maxReceiveCount", &[1..=1_000])
        .map_err(|e| TemplateError(format!("{id}.RedrivePolicy.{}", e.0)))?
        .ok_or_else(|| TemplateError(format!("{id}.RedrivePolicy: no maxReceiveCount")))?;
    Ok((config, Some((target, most as u32))))
}

/// What an `AWS::Lambda::EventSourceMapping` names its source and its function by.
const ESM_SOURCE: &[&str] = &["EventSourceArn", "FunctionName"];

/// A table's `StreamSpecification.StreamViewType`, which CloudFormation requires of a stream.
fn stream_view(id: &str, props: &Value) -> Result<Option<StreamView>, TemplateError> {
    let Some(specification) = get(props, "StreamSpecification") else {
        return Ok(None);
    };
    let view = get(specification, "StreamViewType").and_then(Value::as_str);
    match view.and_then(StreamView::parse) {
        Some(view) => Ok(Some(view)),
        None => err(format!(
            "{id}.StreamSpecification.StreamViewType: {} is not one of {}",
            view.map_or("nothing".to_owned(), |v| format!("{v:?}")),
            StreamView::ALL.map(StreamView::name).join(", ")
        )),
    }
}

/// Resolves nothing but parameters and pseudo parameters.
struct ParametersOnly;

impl Resolver for ParametersOnly {
    fn reference(&self, _: &str) -> Option<String> {
        None
    }
    fn attribute(&self, _: &str, _: &str) -> Option<String> {
        None
    }
}

/// The event source mappings of functions `wiring` does not hold: their `FunctionName` is a
/// parameter or a literal name, and the function must exist where the template is deployed.
fn external_mappings(
    template: &Value,
    resources: &serde_yaml::Mapping,
    wiring: &Wiring,
) -> Result<Vec<MappingDef>, TemplateError> {
    let mut mappings = Vec::new();
    for (mapping_id, p) in of_type(resources, "AWS::Lambda::EventSourceMapping") {
        let function = get(&p, "FunctionName")
            .ok_or_else(|| TemplateError(format!("{mapping_id}: no FunctionName")))?;
        let referenced = logical_id(function);
        if referenced
            .as_deref()
            .is_some_and(|id| resources.contains_key(id))
        {
            continue; // the mapping of one of this template's functions
        }
        let function = resolve(function, template, &ParametersOnly)
            .map_err(|e| TemplateError(format!("{mapping_id}.FunctionName: {}", e.0)))?;
        let source = mapping_source(resources, mapping_id, &p)?;
        honoured::check_mapping_properties(mapping_id, &p, ESM_SOURCE)?;
        let mut event = event_def(
            template,
            mapping_id,
            mapping_id.to_owned(),
            source,
            &p,
            DEFAULT_TIMEOUT,
        )?;
        // A destination that is none of this template's queues is given by value (a parameter).
        let destination = get(&p, "DestinationConfig")
            .and_then(|d| get(d, "OnFailure"))
            .and_then(|o| get(o, "Destination"));
        let mut on_failure_arn = None;
        if let (Some(queue), Some(destination)) = (&event.on_failure, destination) {
            if !wiring.resources.contains_key(queue) {
                let arn = resolve(destination, template, &ParametersOnly).map_err(|e| {
                    TemplateError(format!("{mapping_id}.DestinationConfig: {}", e.0))
                })?;
                if arn.ends_with(".fifo") {
                    return err(format!(
                        "{mapping_id}.DestinationConfig: {arn} is a FIFO queue, which Lambda refuses as an on-failure destination"
                    ));
                }
                on_failure_arn = Some(arn);
                event.on_failure = None;
            }
        }
        mappings.push(MappingDef {
            logical_id: mapping_id.to_owned(),
            function,
            event,
            on_failure_arn,
        });
    }
    Ok(mappings)
}

/// The stream or table a mapping reads; any other source is refused by name.
fn mapping_source(
    resources: &serde_yaml::Mapping,
    mapping_id: &str,
    p: &Value,
) -> Result<SourceRef, TemplateError> {
    let source_id = get(p, "EventSourceArn")
        .and_then(logical_id)
        .ok_or_else(|| {
            TemplateError(format!(
                "{mapping_id}.EventSourceArn: expected !GetAtt of a stream or table"
            ))
        })?;
    Ok(
        match resources
            .get(source_id.as_str())
            .and_then(|r| get(r, "Type"))
            .and_then(Value::as_str)
        {
            Some("AWS::Kinesis::Stream") => SourceRef::Kinesis(source_id),
            Some("AWS::DynamoDB::Table") => SourceRef::DynamoDb(source_id),
            Some("AWS::SQS::Queue") => SourceRef::Sqs(source_id),
            Some(kind) => {
                return err(format!(
                    "{mapping_id}.EventSourceArn: a {kind} source is not run by the embedded runtime (it runs Kinesis streams, DynamoDB tables' streams and SQS queues)"
                ))
            }
            None => {
                return err(format!(
                    "{mapping_id}.EventSourceArn: {source_id} is not a resource of the template"
                ))
            }
        },
    )
}

/// What a function's definition gives, whichever its resource type.
struct FunctionProps {
    timeout: Duration,
    name: String,
    env: Env,
}

impl FunctionProps {
    fn into_function(
        self,
        id: &str,
        events: Vec<EventDef>,
        schedules: Vec<ScheduleDef>,
    ) -> FunctionDef {
        FunctionDef {
            logical_id: id.to_owned(),
            name: self.name,
            timeout: self.timeout,
            env: self.env,
            events,
            schedules,
        }
    }
}

/// Reads timeout, name and environment from the function's properties, over `globals` (SAM's
/// `Globals.Function`; nothing for a plain `AWS::Lambda::Function`).
fn function_props(id: &str, props: &Value, globals: &Value) -> FunctionProps {
    let pick = |key: &str| get(props, key).or_else(|| get(globals, key)).cloned();
    let mut env = Env::new();
    for source in [globals, props] {
        let variables = get(source, "Environment")
            .and_then(|e| get(e, "Variables"))
            .and_then(Value::as_mapping);
        for (k, v) in variables.into_iter().flatten() {
            // Kept unresolved here: `FunctionDef::resolved_env` resolves them once resources exist.
            env.insert(
                k.as_str().unwrap_or_default().to_owned(),
                serde_yaml::to_string(v).unwrap_or_default(),
            );
        }
    }
    FunctionProps {
        timeout: pick("Timeout")
            .and_then(|v| v.as_u64())
            .map_or(DEFAULT_TIMEOUT, Duration::from_secs),
        name: get(props, "FunctionName")
            .and_then(Value::as_str)
            .unwrap_or(id)
            .to_owned(),
        env,
    }
}

/// An event source mapping's settings and on-failure queue: SAM's event properties and
/// `AWS::Lambda::EventSourceMapping`'s properties share these names.
fn event_def(
    template: &Value,
    id: &str,
    name: String,
    source: SourceRef,
    p: &Value,
    timeout: Duration,
) -> Result<EventDef, TemplateError> {
    // A mapping resource's path is its logical id; a SAM event's, its function's and its own.
    let path = match id == name {
        true => id.to_owned(),
        false => format!("{id}.{name}"),
    };
    let p = &with_parameters(p, template);
    let settings = match &source {
        SourceRef::Sqs(queue) => {
            let fifo = get(template, "Resources")
                .and_then(|r| get(r, queue))
                .and_then(|q| get(q, "Properties"))
                .is_some_and(is_fifo);
            queue_settings(p, fifo, timeout)
        }
        _ => settings(p, &source, timeout),
    }
    .map_err(|e| TemplateError(format!("{path}: {}", e.0)))?;
    let on_failure = on_failure_queue(template, p)
        .map_err(|e| TemplateError(format!("{path}.DestinationConfig: {}", e.0)))?;
    Ok(EventDef {
        name,
        source,
        settings,
        on_failure,
    })
}

/// The logical id of a mapping's on-failure queue. Lambda sends a discarded batch's description to
/// an SQS queue, an SNS topic or an S3 bucket, but never to a FIFO queue; the runtime reproduces
/// the SQS queue. A destination given by value (a parameter) is the caller's to resolve.
fn on_failure_queue(template: &Value, p: &Value) -> Result<Option<String>, TemplateError> {
    let Some(on_failure) = get(p, "DestinationConfig").and_then(|d| get(d, "OnFailure")) else {
        return Ok(None);
    };
    // SAM's form names the kind of destination.
    match get(on_failure, "Type").and_then(Value::as_str) {
        None | Some("SQS") => {}
        Some(other) => {
            return err(format!(
                "OnFailure.Type {other}: only SQS on-failure destinations are reproduced by the embedded runtime"
            ))
        }
    }
    let Some(destination) = get(on_failure, "Destination") else {
        return err("OnFailure needs a Destination");
    };
    let id = logical_id(destination)
        .ok_or_else(|| TemplateError("OnFailure.Destination must reference a queue".into()))?;
    let Some(resource) = get(template, "Resources").and_then(|r| get(r, &id)) else {
        // A parameter's value: an external mapping resolves it.
        return Ok(Some(id));
    };
    let props = get(resource, "Properties");
    match get(resource, "Type").and_then(Value::as_str) {
        Some("AWS::SQS::Queue") if props.is_some_and(is_fifo) => {
            err(format!(
                "OnFailure.Destination {id}: a FIFO queue, which Lambda refuses as an on-failure destination"
            ))
        }
        Some("AWS::SQS::Queue") => Ok(Some(id)),
        other => err(format!(
            "OnFailure.Destination {id}: a {} is not an on-failure destination the embedded runtime reproduces (an SQS queue is)",
            other.unwrap_or("resource of no type")
        )),
    }
}

fn sam_function(
    template: &Value,
    id: &str,
    resource: &Value,
) -> Result<FunctionDef, TemplateError> {
    let globals = get(template, "Globals")
        .and_then(|g| get(g, "Function"))
        .cloned()
        .unwrap_or(Value::Null);
    let props = get(resource, "Properties").cloned().unwrap_or(Value::Null);
    let function = function_props(id, &props, &globals);
    let timeout = function.timeout;
    let mut events = Vec::new();
    let mut schedules = Vec::new();
    for (event_name, event) in get(&props, "Events")
        .and_then(Value::as_mapping)
        .into_iter()
        .flatten()
    {
        let event_name = event_name.as_str().unwrap_or_default().to_owned();
        let kind = get(event, "Type")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let p = get(event, "Properties").cloned().unwrap_or(Value::Null);
        let stream = || -> Result<String, TemplateError> {
            let value = get(&p, "Stream")
                .ok_or_else(|| TemplateError(format!("{id}.{event_name}: no Stream")))?;
            logical_id(value).ok_or_else(|| {
                TemplateError(format!(
                    "{id}.{event_name}.Stream: expected !GetAtt or !Ref of a resource"
                ))
            })
        };
        let source = match kind {
            "Kinesis" => SourceRef::Kinesis(stream()?),
            "DynamoDB" => SourceRef::DynamoDb(stream()?),
            "SQS" => {
                let queue = get(&p, "Queue")
                    .ok_or_else(|| TemplateError(format!("{id}.{event_name}: no Queue")))?;
                SourceRef::Sqs(logical_id(queue).ok_or_else(|| {
                    TemplateError(format!(
                        "{id}.{event_name}.Queue: expected !GetAtt of a queue of the template"
                    ))
                })?)
            }
            "Schedule" | "ScheduleV2" => {
                let field = if kind == "Schedule" {
                    "Schedule"
                } else {
                    "ScheduleExpression"
                };
                let path = format!("{id}.{event_name}.{field}");
                if let Some(every) = schedule(&p, field, "Enabled", &path)? {
                    schedules.push(ScheduleDef {
                        name: event_name,
                        every,
                    });
                }
                continue;
            }
            other => {
                return err(format!(
                    "{id}.{event_name}: event type {other:?} is not run by the embedded runtime (it runs {})",
                    honoured::EVENT_TYPES.join(", ")
                ))
            }
        };
        honoured::check_mapping_properties(
            &format!("{id}.{event_name}"),
            &p,
            &["Stream", "Queue"],
        )?;
        events.push(event_def(template, id, event_name, source, &p, timeout)?);
    }
    // A SAM function may also be mapped by an `AWS::Lambda::EventSourceMapping` resource.
    if let Some(resources) = get(template, "Resources").and_then(Value::as_mapping) {
        events.extend(mappings_of(template, resources, id, timeout)?);
    }
    Ok(function.into_function(id, events, schedules))
}

/// A plain CloudFormation function (what the CDK synthesizes): its event sources are the
/// `AWS::Lambda::EventSourceMapping` resources whose `FunctionName` references it.
fn lambda_function(
    template: &Value,
    resources: &serde_yaml::Mapping,
    id: &str,
    resource: &Value,
) -> Result<FunctionDef, TemplateError> {
    let props = get(resource, "Properties").cloned().unwrap_or(Value::Null);
    let function = function_props(id, &props, &Value::Null);
    let events = mappings_of(template, resources, id, function.timeout)?;
    let schedules = rules_targeting(resources, id)?;
    Ok(function.into_function(id, events, schedules))
}

/// The `AWS::Lambda::EventSourceMapping` resources whose `FunctionName` references the function
/// `id` (a SAM function's as well as a plain one's).
fn mappings_of(
    template: &Value,
    resources: &serde_yaml::Mapping,
    id: &str,
    timeout: Duration,
) -> Result<Vec<EventDef>, TemplateError> {
    let mut events = Vec::new();
    for (mapping_id, p) in of_type(resources, "AWS::Lambda::EventSourceMapping") {
        if get(&p, "FunctionName").and_then(logical_id).as_deref() != Some(id) {
            continue;
        }
        let source = mapping_source(resources, mapping_id, &p)?;
        honoured::check_mapping_properties(mapping_id, &p, ESM_SOURCE)?;
        // SAM names a function's mappings <function><event>: the CDK app keeps those names.
        let name = mapping_id
            .strip_prefix(id)
            .filter(|n| !n.is_empty())
            .unwrap_or(mapping_id);
        events.push(event_def(
            template,
            id,
            name.to_owned(),
            source,
            &p,
            timeout,
        )?);
    }
    Ok(events)
}

/// The schedules of the `AWS::Events::Rule` resources with a target that references `function`.
fn rules_targeting(
    resources: &serde_yaml::Mapping,
    function: &str,
) -> Result<Vec<ScheduleDef>, TemplateError> {
    let mut schedules = Vec::new();
    for (rule_id, p) in of_type(resources, "AWS::Events::Rule") {
        let targets_it = get(&p, "Targets")
            .and_then(Value::as_sequence)
            .into_iter()
            .flatten()
            .any(|t| get(t, "Arn").and_then(logical_id).as_deref() == Some(function));
        if !targets_it {
            continue;
        }
        let path = format!("{rule_id}.ScheduleExpression");
        if let Some(every) = schedule(&p, "ScheduleExpression", "State", &path)? {
            let name = rule_id
                .strip_prefix(function)
                .filter(|n| !n.is_empty())
                .unwrap_or(rule_id);
            schedules.push(ScheduleDef {
                name: name.to_owned(),
                every,
            });
        }
    }
    Ok(schedules)
}

/// The period of the schedule in `p[field]`, or `None` when `p[switch]` turns it off (SAM's
/// `Enabled: false`, a rule's `State: DISABLED`). Only `rate(...)` expressions run locally.
fn schedule(
    p: &Value,
    field: &str,
    switch: &str,
    path: &str,
) -> Result<Option<Duration>, TemplateError> {
    match get(p, switch) {
        Some(Value::Bool(false)) => return Ok(None),
        Some(v) if matches!(v.as_str(), Some("DISABLED")) => return Ok(None),
        _ => {}
    }
    let expression = get(p, field)
        .and_then(Value::as_str)
        .ok_or_else(|| TemplateError(format!("{path}: expected a schedule expression")))?;
    parse_rate(expression)
        .map(Some)
        .ok_or_else(|| {
            TemplateError(format!(
                "{path}: {expression:?} is not rate(<n> minute[s]|hour[s]|day[s]); the embedded runtime runs only rate() schedules"
            ))
        })
}

/// The period of `rate(<n> <unit>)`, with the unit singular for 1 and plural otherwise, as
/// EventBridge requires.
fn parse_rate(expression: &str) -> Option<Duration> {
    let inner = expression.strip_prefix("rate(")?.strip_suffix(')')?;
    let (count, unit) = inner.trim().split_once(' ')?;
    let count: u64 = count.parse().ok().filter(|&n| n > 0)?;
    let seconds = match (unit.trim(), count) {
        ("minute", 1) | ("minutes", 2..) => 60,
        ("hour", 1) | ("hours", 2..) => 3600,
        ("day", 1) | ("days", 2..) => 86_400,
        _ => return None,
    };
    Some(Duration::from_secs(count * seconds))
}

/// A stream mapping's settings, each checked against what Lambda accepts.
fn settings(
    p: &Value,
    source: &SourceRef,
    timeout: Duration,
) -> Result<MappingSettings, TemplateError> {
    let int = |key: &str, allowed: &[RangeInclusive<i64>]| int_setting(p, key, allowed);
    if get(p, "ScalingConfig").is_some() {
        return err("ScalingConfig: a setting of SQS event sources only");
    }
    // -1 is Lambda's "no limit".
    let limit = |v: i64| u64::try_from(v).ok();
    Ok(MappingSettings {
        batch_size: int("BatchSize", &[1..=10_000])?.map_or(100, |v| v as usize),
        maximum_batching_window: int("MaximumBatchingWindowInSeconds", &[0..=300])?
            .map_or(Duration::ZERO, |v| Duration::from_secs(v as u64)),
        starting_position: starting_position(p, source)?,
        report_batch_item_failures: function_response_types(p)?,
        bisect_batch_on_function_error: honoured::boolean(p, "BisectBatchOnFunctionError", false)?,
        maximum_retry_attempts: int("MaximumRetryAttempts", &[-1..=10_000])?
            .and_then(limit)
            .map(|v| v as u32),
        maximum_record_age: int("MaximumRecordAgeInSeconds", &[-1..=-1, 60..=604_800])?
            .and_then(limit)
            .map(Duration::from_secs),
        on_failure: None,
        parallelization_factor: int("ParallelizationFactor", &[1..=10])?.map_or(1, |v| v as u32),
        function_timeout: timeout,
        filters: filter_criteria(p)?,
        enabled: honoured::boolean(p, "Enabled", true)?,
    })
}

/// An integer property within the ranges Lambda or SQS accept; `None` when it is left out. One
/// that is there but no whole number (an unresolved reference) is refused, not passed over for
/// its default.
fn int_setting(
    p: &Value,
    key: &str,
    allowed: &[RangeInclusive<i64>],
) -> Result<Option<i64>, TemplateError> {
    let value = get(p, key)
        .map(|v| {
            v.as_i64()
                .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
                .ok_or_else(|| TemplateError(format!("{key}: {v:?} is not a whole number")))
        })
        .transpose()?;
    honoured::ranged(key, value, allowed)
}

/// Properties of stream mappings that an SQS mapping does not take (CreateEventSourceMapping
/// refuses them).
const STREAM_ONLY: &[&str] = &[
    "StartingPosition",
    "StartingPositionTimestamp",
    "ParallelizationFactor",
    "BisectBatchOnFunctionError",
    "MaximumRetryAttempts",
    "MaximumRecordAgeInSeconds",
    "DestinationConfig",
];

/// An SQS mapping's settings, checked as Lambda checks them: BatchSize 1-10,000 (10 by default;
/// above 10 only with a batching window of a second or more, and never above 10 on a FIFO
/// queue), MaximumBatchingWindowInSeconds 0-300, ScalingConfig's MaximumConcurrency 2-1,000.
fn queue_settings(
    p: &Value,
    fifo: bool,
    timeout: Duration,
) -> Result<MappingSettings, TemplateError> {
    if let Some(key) = STREAM_ONLY.iter().find(|key| get(p, key).is_some()) {
        return err(format!(
            "{key}: a setting of stream event sources, not of an SQS queue"
        ));
    }
    let batch_size = int_setting(p, "BatchSize", &[1..=10_000])?.unwrap_or(10);
    let window = int_setting(p, "MaximumBatchingWindowInSeconds", &[0..=300])?.unwrap_or(0);
    if fifo && batch_size > 10 {
        return err(format!(
            "BatchSize: {batch_size} is more than a FIFO queue's 10"
        ));
    }
    if batch_size > 10 && window < 1 {
        return err(format!(
            "BatchSize: {batch_size} needs a MaximumBatchingWindowInSeconds of at least 1"
        ));
    }
    if let Some(scaling) = get(p, "ScalingConfig") {
        int_setting(scaling, "MaximumConcurrency", &[2..=1_000])
            .map_err(|e| TemplateError(format!("ScalingConfig.{}", e.0)))?;
    }
    Ok(MappingSettings {
        batch_size: batch_size as usize,
        maximum_batching_window: Duration::from_secs(window as u64),
        report_batch_item_failures: function_response_types(p)?,
        function_timeout: timeout,
        filters: filter_criteria(p)?,
        enabled: honoured::boolean(p, "Enabled", true)?,
        ..MappingSettings::default()
    })
}

/// `StartingPosition`, which Lambda requires of a stream mapping; `AT_TIMESTAMP` only for Kinesis.
fn starting_position(p: &Value, source: &SourceRef) -> Result<StartingPosition, TemplateError> {
    match get(p, "StartingPosition").and_then(Value::as_str) {
        Some("TRIM_HORIZON") => Ok(StartingPosition::TrimHorizon),
        Some("LATEST") => Ok(StartingPosition::Latest),
        Some("AT_TIMESTAMP") if matches!(source, SourceRef::DynamoDb(_)) => {
            err("StartingPosition: AT_TIMESTAMP is for Kinesis streams only; DynamoDB Streams take TRIM_HORIZON or LATEST")
        }
        Some("AT_TIMESTAMP") => {
            let t = get(p, "StartingPositionTimestamp")
                .and_then(Value::as_f64)
                .ok_or_else(|| {
                    TemplateError("AT_TIMESTAMP needs StartingPositionTimestamp".into())
                })?;
            Ok(StartingPosition::AtTimestamp((t * 1000.0) as i64))
        }
        Some(other) => err(format!(
            "StartingPosition {other:?} is not TRIM_HORIZON, LATEST or AT_TIMESTAMP"
        )),
        None => err("StartingPosition: required for a Kinesis or DynamoDB Streams source"),
    }
}

/// Whether `FunctionResponseTypes` asks for partial batch responses.
fn function_response_types(p: &Value) -> Result<bool, TemplateError> {
    let mut report_batch_item_failures = false;
    for value in get(p, "FunctionResponseTypes")
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
    {
        match value.as_str() {
            Some("ReportBatchItemFailures") => report_batch_item_failures = true,
            // Linters accept any string here; Lambda does not.
            other => {
                return err(format!(
                    "FunctionResponseTypes: {other:?} is not ReportBatchItemFailures"
                ))
            }
        }
    }
    Ok(report_batch_item_failures)
}

/// Lambda allows five filters a mapping unless a quota increase says otherwise.
const MAX_FILTERS: usize = 5;

/// `FilterCriteria.Filters[].Pattern`: each pattern a JSON string, as the template writes it.
fn filter_criteria(p: &Value) -> Result<Vec<Pattern>, TemplateError> {
    let Some(criteria) = get(p, "FilterCriteria") else {
        return Ok(Vec::new());
    };
    let Some(filters) = get(criteria, "Filters").and_then(Value::as_sequence) else {
        return err("FilterCriteria needs a list of Filters");
    };
    if filters.len() > MAX_FILTERS {
        return err(format!(
            "FilterCriteria has {} filters; Lambda allows {MAX_FILTERS}",
            filters.len()
        ));
    }
    filters
        .iter()
        .enumerate()
        .map(|(i, filter)| {
            let text = get(filter, "Pattern")
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    TemplateError(format!(
                        "FilterCriteria.Filters[{i}].Pattern must be a JSON string"
                    ))
                })?;
            Pattern::parse_str(text, Dialect::EventBridge)
                .map_err(|e| TemplateError(format!("FilterCriteria.Filters[{i}].Pattern: {e}")))
        })
        .collect()
}

/// The resources of type `kind` by logical id, in CloudFormation's long form (see `long_form`),
/// their `Condition` included and the CDK's `Metadata` left out: what a deployment creates.
pub fn resources_of_type(template: &Value, kind: &str) -> BTreeMap<String, serde_json::Value> {
    let Some(resources) = get(template, "Resources").and_then(Value::as_mapping) else {
        return BTreeMap::new();
    };
    resources
        .iter()
        .filter(|(_, r)| get(r, "Type").and_then(Value::as_str) == Some(kind))
        .filter_map(|(id, r)| {
            let mut resource = long_form(r);
            resource.as_object_mut()?.remove("Metadata");
            Some((id.as_str()?.to_owned(), resource))
        })
        .collect()
}

/// A template's value as JSON with its short tags written out as CloudFormation's long form
/// (`!Ref X` as `{"Ref": "X"}`, `!GetAtt X.Y` as `{"Fn::GetAtt": ["X", "Y"]}`, `!Sub`,
/// `!Equals` and the other functions as `{"Fn::<name>": ...}`): a template written by hand and
/// one the CDK synthesizes compare equal when they say the same.
pub fn long_form(value: &Value) -> serde_json::Value {
    use serde_json::Value as Json;
    match value {
        Value::Null => Json::Null,
        Value::Bool(b) => Json::Bool(*b),
        Value::Number(n) => serde_json::to_value(n).unwrap_or(Json::Null),
        Value::String(s) => Json::String(s.clone()),
        Value::Sequence(items) => Json::Array(items.iter().map(long_form).collect()),
        Value::Mapping(m) => Json::Object(
            m.iter()
                .map(|(k, v)| (k.as_str().unwrap_or_default().to_owned(), long_form(v)))
                .collect(),
        ),
        Value::Tagged(tagged) => {
            let tag = tagged.tag.to_string();
            let name = tag.trim_start_matches('!');
            let inner = long_form(&tagged.value);
            match (name, inner) {
                ("Ref", inner) => serde_json::json!({ "Ref": inner }),
                ("GetAtt", Json::String(path)) => {
                    let parts: Vec<&str> = path.splitn(2, '.').collect();
                    serde_json::json!({ "Fn::GetAtt": parts })
                }
                (name, inner) => serde_json::json!({ format!("Fn::{name}"): inner }),
            }
        }
    }
}

/// A mapping's properties with each one that is a parameter (`!Ref P`, `{Ref: P}`) given the
/// parameter's value, as CloudFormation passes it: a setting made a parameter is read, not
/// passed over.
fn with_parameters(p: &Value, template: &Value) -> Value {
    let Some(properties) = p.as_mapping() else {
        return p.clone();
    };
    let parameter = |value: &Value| {
        let name = match value {
            Value::Tagged(tagged) if tagged.tag == "Ref" => tagged.value.as_str()?,
            Value::Mapping(m) if m.len() == 1 => m.get("Ref")?.as_str()?,
            _ => return None,
        };
        let text = scalar(get(get(get(template, "Parameters")?, name)?, "Default")?);
        Some(match text.parse::<i64>() {
            Ok(n) => Value::Number(n.into()),
            Err(_) => Value::String(text),
        })
    };
    let resolved = properties
        .iter()
        .map(|(k, v)| (k.clone(), parameter(v).unwrap_or_else(|| v.clone())))
        .collect();
    Value::Mapping(resolved)
}

/// The logical id a `!GetAtt X.Attr`, `!Ref X` or their long forms point at.
fn logical_id(value: &Value) -> Option<String> {
    match value {
        Value::Tagged(tagged) => {
            let inner = tagged.value.as_str()?;
            Some(inner.split('.').next().unwrap_or(inner).to_owned())
        }
        Value::Mapping(m) => {
            if let Some(r) = m.get("Ref").and_then(Value::as_str) {
                return Some(r.to_owned());
            }
            match m.get("Fn::GetAtt")? {
                Value::Sequence(parts) => parts.first()?.as_str().map(str::to_owned),
                Value::String(s) => Some(s.split('.').next().unwrap_or(s).to_owned()),
                _ => None,
            }
        }
        _ => None,
    }
}

/// Resolves a value as CloudFormation would: references, attributes, substitutions, parameters.
pub fn resolve(
    value: &Value,
    template: &Value,
    resolver: &dyn Resolver,
) -> Result<String, TemplateError> {
    let parameter = |name: &str| {
        get(template, "Parameters")
            .and_then(|p| get(p, name))
            .and_then(|p| get(p, "Default"))
            .map(scalar)
    };
    let reference = |name: &str| -> Result<String, TemplateError> {
        match name {
            "AWS::Region" => Ok("us-east-1".into()),
            "AWS::AccountId" => Ok("000000000000".into()),
            "AWS::StackName" => Ok("keyway-local".into()),
            "AWS::Partition" => Ok("aws".into()),
            _ => resolver
                .reference(name)
                .or_else(|| parameter(name))
                .ok_or_else(|| {
                    TemplateError(format!("!Ref {name}: no such resource or parameter"))
                }),
        }
    };
    let attribute = |path: &str| -> Result<String, TemplateError> {
        let (id, attr) = path
            .split_once('.')
            .ok_or_else(|| TemplateError(format!("!GetAtt {path}: expected Resource.Attribute")))?;
        resolver
            .attribute(id, attr)
            .ok_or_else(|| TemplateError(format!("!GetAtt {path}: unknown")))
    };
    let substitute = |text: &str| -> Result<String, TemplateError> {
        let mut out = String::new();
        let mut rest = text;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let end = rest[start..]
                .find('}')
                .ok_or_else(|| TemplateError(format!("!Sub {text:?}: unclosed ${{")))?
                + start;
            let name = &rest[start + 2..end];
            out.push_str(&if name.contains('.') && !name.starts_with("AWS::") {
                attribute(name)?
            } else {
                reference(name)?
            });
            rest = &rest[end + 1..];
        }
        out.push_str(rest);
        Ok(out)
    };
    match value {
        Value::Tagged(tagged) => {
            let tag = tagged.tag.to_string();
            let inner = tagged
                .value
                .as_str()
                .ok_or_else(|| TemplateError(format!("{tag}: expected a string")))?;
            match tag.as_str() {
                "!Ref" => reference(inner),
                "!GetAtt" => attribute(inner),
                "!Sub" => substitute(inner),
                other => err(format!("{other} is not supported here")),
            }
        }
        Value::Mapping(m) => {
            if let Some(name) = m.get("Ref").and_then(Value::as_str) {
                reference(name)
            } else if let Some(v) = m.get("Fn::GetAtt") {
                match v {
                    Value::Sequence(parts) => attribute(
                        &parts
                            .iter()
                            .filter_map(Value::as_str)
                            .collect::<Vec<_>>()
                            .join("."),
                    ),
                    other => attribute(other.as_str().unwrap_or_default()),
                }
            } else if let Some(text) = m.get("Fn::Sub").and_then(Value::as_str) {
                substitute(text)
            } else if let Some(join) = m.get("Fn::Join") {
                // [delimiter, [values...]], as the CDK writes string interpolations.
                let parts = join.as_sequence().filter(|p| p.len() == 2);
                let (delimiter, values) = match parts.map(|p| (p[0].as_str(), p[1].as_sequence())) {
                    Some((Some(d), Some(v))) => (d, v),
                    _ => return err("Fn::Join: expected [delimiter, [values]]"),
                };
                Ok(values
                    .iter()
                    .map(|v| resolve(v, template, resolver))
                    .collect::<Result<Vec<_>, _>>()?
                    .join(delimiter))
            } else {
                err(format!("unsupported value {value:?}"))
            }
        }
        other => Ok(scalar(other)),
    }
}

/// The template's `Outputs`, each value resolved. A resource the runtime does not make (an IAM
/// policy) is named by its logical id: nothing the runtime runs can use it.
pub fn outputs(
    template: &Value,
    resolver: &dyn Resolver,
) -> Result<BTreeMap<String, String>, TemplateError> {
    struct Declared<'a> {
        made: &'a dyn Resolver,
        resources: Option<&'a Value>,
    }
    impl Resolver for Declared<'_> {
        fn reference(&self, id: &str) -> Option<String> {
            self.made.reference(id).or_else(|| {
                self.resources
                    .and_then(|r| get(r, id))
                    .map(|_| id.to_owned())
            })
        }
        fn attribute(&self, id: &str, attribute: &str) -> Option<String> {
            self.made.attribute(id, attribute)
        }
    }
    let resolver = &Declared {
        made: resolver,
        resources: get(template, "Resources"),
    };
    let outputs = get(template, "Outputs").and_then(Value::as_mapping);
    outputs
        .into_iter()
        .flatten()
        .map(|(name, output)| {
            let name = name.as_str().unwrap_or_default().to_owned();
            let value = get(output, "Value")
                .ok_or_else(|| TemplateError(format!("Outputs.{name}: no Value")))?;
            let resolved = resolve(value, template, resolver)
                .map_err(|e| TemplateError(format!("Outputs.{name}: {}", e.0)))?;
            Ok((name, resolved))
        })
        .collect()
}

/// A whole number written in the template: literally, as text, or as `!Ref` of a parameter.
fn whole_number(value: &Value, template: &Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => {
            let parameter = logical_id(value)?;
            let default = get(template, "Parameters")
                .and_then(|p| get(p, &parameter))
                .and_then(|p| get(p, "Default"))?;
            scalar(default).parse().ok()
        }
    }
}

fn scalar(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        _ => String::new(),
    }
}

impl FunctionDef {
    /// The function's environment with every reference resolved, as Lambda would see it.
    pub fn resolved_env(
        &self,
        template: &Value,
        resolver: &dyn Resolver,
    ) -> Result<Env, TemplateError> {
        self.env
            .iter()
            .map(|(name, raw)| {
                let value: Value = serde_yaml::from_str(raw)
                    .map_err(|e| TemplateError(format!("{}.{name}: {e}", self.logical_id)))?;
                let resolved = resolve(&value, template, resolver)
                    .map_err(|e| TemplateError(format!("{}.{name}: {}", self.logical_id, e.0)))?;
                Ok((name.clone(), resolved))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
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
            parse_with(&text, &unknown).unwrap_err().0,
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
            e.0.contains("Counter.Clicks") && e.0.contains("MaximumRecordAgeInSeconds"),
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
        assert!(e.0.contains("CounterClicks.EventSourceArn"), "{e}");
    }

    #[test]
    fn a_misspelled_response_type_is_an_error_naming_the_event() {
        let broken = TEMPLATE.replace("[ReportBatchItemFailures]", "[ReportBatchItemFailure]");
        let e = parse(&broken).unwrap_err();
        assert!(
            e.0.contains("Counter.Clicks") && e.0.contains("ReportBatchItemFailure"),
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
            e.0.contains("Counter.Clicks")
                && e.0.contains("Filters[0]")
                && e.0.contains("/data/kind/0/prefx")
                && e.0.contains("unknown operator"),
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
            e.0.starts_with("Counter.Sweep.Schedule:") && e.0.contains("cron(0 12"),
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
            e.0.starts_with("Big.MaxRecordSizeInKiB: 512 is outside"),
            "{e}"
        );
    }
}
