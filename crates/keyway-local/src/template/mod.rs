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
//! template is read, by name (`honoured`). `resources` reads tables, streams and queues,
//! `functions` the functions and their event sources, `settings` a mapping's settings, and
//! `intrinsics` resolves a template's values.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::time::Duration;

use serde_yaml::Value;

mod functions;
mod honoured;
mod intrinsics;
mod resources;
mod settings;
#[cfg(test)]
mod tests;

use functions::*;
use intrinsics::*;
pub use intrinsics::{long_form, outputs, resolve};
pub use resources::resources_of_type;
use resources::*;
use settings::*;

use super::mapping::{MappingSettings, StartingPosition, DYNAMODB_STREAM_RETENTION};
use super::services::dynamodb::StreamView;
use super::services::sqs::QueueConfig;
use keyway::domain::pattern::{Dialect, Pattern};
use keyway::lambda::Env;

/// A resource the embedded runtime creates.
#[derive(Clone, Debug, PartialEq)]
pub enum Resource {
    /// An `AWS::DynamoDB::Table`.
    Table {
        /// TableName, or the logical id when the template gives none.
        name: String,
        /// The HASH key attribute of its KeySchema.
        hash_key: String,
        /// The RANGE key attribute, if the KeySchema has one.
        range_key: Option<String>,
        /// The TimeToLiveSpecification's attribute, when TTL is enabled.
        ttl_attribute: Option<String>,
        /// The stream's view type, when the table has a stream.
        stream: Option<StreamView>,
    },
    /// An `AWS::Kinesis::Stream`.
    Stream {
        /// Name, or the logical id when the template gives none.
        name: String,
        /// ShardCount (1 by default).
        shards: usize,
        /// How long the stream keeps a record (RetentionPeriodHours, 24 by default).
        retention: Duration,
        /// MaxRecordSizeInKiB: 1,024 (1 MiB) unless the stream opts into larger records.
        max_record_kib: usize,
    },
    /// An `AWS::SQS::Queue`.
    Queue {
        /// QueueName, or the logical id (with `.fifo` for a FIFO queue) when the template gives
        /// none.
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
    /// A Kinesis stream, by logical id.
    Kinesis(String),
    /// The stream of a DynamoDB table, by the table's logical id.
    DynamoDb(String),
    /// An SQS queue, by logical id.
    Sqs(String),
}

/// A function's event source mapping, as the template defines it.
#[derive(Clone, Debug, PartialEq)]
pub struct EventDef {
    /// The event's name under a SAM function's `Events`, or an
    /// `AWS::Lambda::EventSourceMapping`'s logical id less the function's as a prefix.
    pub name: String,
    /// What the mapping reads.
    pub source: SourceRef,
    /// Its settings, Lambda's defaults where the template gives none, the function's timeout
    /// among them.
    pub settings: MappingSettings,
    /// Logical id of the on-failure queue.
    pub on_failure: Option<String>,
}

/// A schedule that invokes a function (SAM's `Schedule` and `ScheduleV2` events, an
/// `AWS::Events::Rule` targeting it), as the template defines it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduleDef {
    /// The event's name under a SAM function's `Events`, or the rule's logical id less the
    /// function's as a prefix.
    pub name: String,
    /// A `rate(...)` expression's period.
    pub every: Duration,
}

/// A function the template defines: SAM's `AWS::Serverless::Function` or an
/// `AWS::Lambda::Function`.
#[derive(Clone, Debug, PartialEq)]
pub struct FunctionDef {
    /// The function's logical id.
    pub logical_id: String,
    /// FunctionName, or the logical id when the template gives none.
    pub name: String,
    /// Timeout (or `Globals.Function`'s), 3 seconds by default as Lambda's.
    pub timeout: Duration,
    /// The environment variables over `Globals.Function`'s, still unresolved: see
    /// `FunctionDef::resolved_env`.
    pub env: Env,
    /// Its event source mappings: SAM events and `AWS::Lambda::EventSourceMapping` resources.
    pub events: Vec<EventDef>,
    /// The schedules that invoke it.
    pub schedules: Vec<ScheduleDef>,
}

/// An `AWS::Lambda::EventSourceMapping` of a function the template does not define: one another
/// stack deployed, as a consumer's stack maps its own table to the keyway stack's function.
#[derive(Clone, Debug, PartialEq)]
pub struct MappingDef {
    /// The `AWS::Lambda::EventSourceMapping`'s logical id.
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
    /// The functions the template defines, with their event sources.
    pub functions: Vec<FunctionDef>,
    /// Mappings to functions the template does not define.
    pub mappings: Vec<MappingDef>,
}

/// Lambda's default function timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3);

impl Wiring {
    /// How long after a record's arrival `event` may still deliver it: its source's retention,
    /// or the mapping's MaximumRecordAgeInSeconds if shorter.
    pub(crate) fn redelivery_horizon(&self, event: &EventDef) -> Duration {
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

/// What a template holds that the embedded runtime does not take or AWS would refuse: where (a
/// resource's logical id and the path to its property, `Counter.Clicks.BatchSize`; a setting
/// met through a reference or an event reads `Counter.Clicks: StartingPosition`; empty for the
/// template as a whole) and what is wrong.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error("template: {}{problem}", place(at))]
pub struct TemplateError {
    /// Where: a logical id and property path, empty for the template as a whole.
    pub at: String,
    /// What is wrong there.
    pub problem: String,
}

fn place(at: &str) -> String {
    if at.is_empty() {
        String::new()
    } else {
        format!("{at}: ")
    }
}

impl TemplateError {
    /// A problem at `at`: a resource's logical id and the path to its property.
    pub fn at(at: impl std::fmt::Display, problem: impl ToString) -> Self {
        Self {
            at: at.to_string(),
            problem: problem.to_string(),
        }
    }

    /// A problem of the template as a whole.
    pub fn whole(problem: impl ToString) -> Self {
        Self::at("", problem)
    }

    /// The same problem at a property of `path`: `path.at`.
    pub fn under(self, path: impl std::fmt::Display) -> Self {
        let at = match self.at.is_empty() {
            true => path.to_string(),
            false => format!("{path}.{}", self.at),
        };
        Self { at, ..self }
    }

    /// The same problem, met in resolving `path`: `path: at`.
    pub fn through(self, path: impl std::fmt::Display) -> Self {
        let at = match self.at.is_empty() {
            true => path.to_string(),
            false => format!("{path}: {}", self.at),
        };
        Self { at, ..self }
    }

    /// Where and what, without the word "template".
    pub fn text(&self) -> String {
        format!("{}{}", place(&self.at), self.problem)
    }
}

fn err_at<T>(at: impl std::fmt::Display, problem: impl ToString) -> Result<T, TemplateError> {
    Err(TemplateError::at(&at, problem))
}

fn get<'a>(value: &'a Value, key: &str) -> Option<&'a Value> {
    value.as_mapping().and_then(|m| m.get(key))
}

/// Parses a template's text into its wiring; references are resolved later, once the resources
/// exist, by `resolve`. Parameters take their defaults.
pub fn parse(text: &str) -> Result<(Wiring, Value), TemplateError> {
    parse_with(text, &BTreeMap::new())
}

/// The template of `text`, each parameter of `parameters` given as its default.
fn given_parameters(
    text: &str,
    parameters: &BTreeMap<String, String>,
) -> Result<Value, TemplateError> {
    let mut template: Value =
        serde_yaml::from_str(text).map_err(|e| TemplateError::whole(format!("not YAML: {e}")))?;
    for (name, value) in parameters {
        let declared = template
            .get_mut("Parameters")
            .and_then(|p| p.get_mut(name.as_str()))
            .and_then(Value::as_mapping_mut)
            .ok_or_else(|| TemplateError::at(format!("parameter {name}"), "not in the template"))?;
        declared.insert("Default".into(), Value::String(value.clone()));
    }
    Ok(template)
}

/// Parses a template as `parse` does, with `parameters` given values, as a deployment would give
/// them; each must be one the template declares.
pub fn parse_with(
    text: &str,
    parameters: &BTreeMap<String, String>,
) -> Result<(Wiring, Value), TemplateError> {
    let template = given_parameters(text, parameters)?;
    let resources = get(&template, "Resources")
        .and_then(Value::as_mapping)
        .ok_or_else(|| TemplateError::whole("no Resources"))?;
    honoured::check_resource_types(resources)?;
    let mut wiring = Wiring::default();
    for (id, resource) in resources {
        let id = id
            .as_str()
            .ok_or_else(|| TemplateError::whole("a resource id is not a string"))?;
        if let Some(made) = made_resource(&template, id, resource)? {
            wiring.resources.insert(id.to_owned(), made);
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
