//! Deploying a template on the embedded services: its resources, its functions with their
//! environment, and its event source mappings, each checked as CloudFormation and Lambda check
//! them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::error::Factory;
use super::error::LocalError;
use super::platform::LocalServices;
use super::schedule::local_schedules;
use super::LocalRuntime;
use crate::mapping::queue::QueueMapping;
use crate::mapping::{EventSourceMapping, MappingSettings, MappingSource};
use crate::services::dynamodb::KeySchema;
use crate::services::sqs::{LocalSqs, QueueConfig};
use crate::template::{self, Resolver, Resource, SourceRef, Wiring};
use keyway::lambda::{check_mapping, executor_config, Handler};
use keyway::ports::Clock;

/// The URL of the embedded queue an SQS ARN names; an error at the template path `at` if it
/// names none.
pub(super) fn queue_url_of(arn: &str, at: &str) -> Result<String, LocalError> {
    match arn
        .strip_prefix("arn:aws:sqs:")
        .map(|rest| rest.rsplit(':').next())
    {
        Some(Some(name)) if !name.is_empty() => Ok(format!("{}{name}", LocalSqs::URL_PREFIX)),
        _ => Err(LocalError::at(
            at,
            format!("{arn:?} is not the ARN of a queue"),
        )),
    }
}

/// Resource names, URLs and ARNs by logical id.
#[derive(Default)]
pub(super) struct Names {
    references: BTreeMap<String, String>,
    attributes: BTreeMap<(String, String), String>,
}

impl Resolver for Names {
    fn reference(&self, logical_id: &str) -> Option<String> {
        self.references.get(logical_id).cloned()
    }

    fn attribute(&self, logical_id: &str, attribute: &str) -> Option<String> {
        self.attributes
            .get(&(logical_id.to_owned(), attribute.to_owned()))
            .cloned()
    }
}

/// A function the runtime runs, by name: what the mappings of another template find it by.
#[derive(Clone)]
pub(super) struct DeployedFunction {
    arn: String,
    handler: Arc<dyn Handler>,
    timeout: Duration,
}

/// What deploying a template made: its resources' names and its outputs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Deployed {
    /// The name (table, stream, function) or URL (queue) of each resource, by logical id.
    pub resources: BTreeMap<String, String>,
    /// The template's `Outputs`, resolved.
    pub outputs: BTreeMap<String, String>,
}

impl LocalRuntime {
    /// Creates the template's resources, builds each function with the factory registered under
    /// its logical id, and maps its event sources. A function without a factory is an error.
    pub fn from_template(
        text: &str,
        services: Arc<LocalServices>,
        factories: &BTreeMap<String, Factory>,
    ) -> Result<Self, LocalError> {
        Self::from_template_with(text, &BTreeMap::new(), services, factories)
    }

    /// Deploys the template as `from_template` does, with `parameters` given values.
    pub fn from_template_with(
        text: &str,
        parameters: &BTreeMap<String, String>,
        services: Arc<LocalServices>,
        factories: &BTreeMap<String, Factory>,
    ) -> Result<Self, LocalError> {
        let mut runtime = Self::new(services);
        let (wiring, names, outputs) = runtime.deploy_template(text, parameters, factories)?;
        runtime.wiring = wiring;
        runtime.names = names;
        runtime.outputs = outputs;
        Ok(runtime)
    }

    /// Deploys one more template beside the first, as a second stack: its resources, functions
    /// and mappings, and the mappings it gives to functions deployed before (named by its
    /// parameters, as a consumer's stack names the keyway stack's function).
    pub fn deploy(
        &mut self,
        text: &str,
        parameters: &BTreeMap<String, String>,
        factories: &BTreeMap<String, Factory>,
    ) -> Result<Deployed, LocalError> {
        let (_, names, outputs) = self.deploy_template(text, parameters, factories)?;
        Ok(Deployed {
            resources: names.references,
            outputs,
        })
    }

    fn deploy_template(
        &mut self,
        text: &str,
        parameters: &BTreeMap<String, String>,
        factories: &BTreeMap<String, Factory>,
    ) -> Result<(Wiring, Names, BTreeMap<String, String>), LocalError> {
        let (wiring, template) = template::parse_with(text, parameters)?;
        let mut names = self.create_resources(&wiring)?;
        for function in &wiring.functions {
            let arn = format!(
                "arn:aws:lambda:us-east-1:000000000000:function:{}",
                function.name
            );
            names
                .references
                .insert(function.logical_id.clone(), function.name.clone());
            names
                .attributes
                .insert((function.logical_id.clone(), "Arn".into()), arn);
        }
        let first_mapping = self.mappings.len();
        let mut handlers = BTreeMap::new();
        for function in &wiring.functions {
            let handler = self.deploy_function(function, &template, &wiring, &names, factories)?;
            handlers.insert(function.logical_id.clone(), handler);
        }
        for mapping in &wiring.mappings {
            self.map_external(mapping, &names)?;
        }
        let now = self.services.clock.now_millis();
        self.schedules
            .extend(local_schedules(&wiring, &handlers, now));
        // Mappings start where their starting position says, before anything is written.
        for mapping in &mut self.mappings[first_mapping..] {
            mapping.poll();
        }
        let outputs = template::outputs(&template, &names)?;
        Ok((wiring, names, outputs))
    }

    /// Creates the tables, streams and queues of `wiring`; returns their names by logical id.
    fn create_resources(&self, wiring: &Wiring) -> Result<Names, LocalError> {
        let services = &self.services;
        let mut names = Names::default();
        for (id, resource) in &wiring.resources {
            let mut attr =
                |a: &str, v: String| names.attributes.insert((id.clone(), a.to_owned()), v);
            match resource {
                Resource::Table {
                    name,
                    hash_key,
                    range_key,
                    ttl_attribute,
                    stream,
                } => {
                    let schema = KeySchema {
                        hash: hash_key.clone(),
                        range: range_key.clone(),
                    };
                    let table = services.dynamodb.create_table(
                        name,
                        schema,
                        ttl_attribute.clone(),
                        *stream,
                    );
                    attr("StreamArn", table.stream_arn());
                    attr(
                        "Arn",
                        format!("arn:aws:dynamodb:us-east-1:000000000000:table/{name}"),
                    );
                    names.references.insert(id.clone(), name.clone());
                }
                Resource::Stream {
                    name,
                    shards,
                    max_record_kib,
                    retention,
                } => {
                    let arn = services.kinesis.create_stream(name, *shards);
                    services.kinesis.set_max_record_size(name, *max_record_kib);
                    services.kinesis.set_retention(name, *retention);
                    attr("Arn", arn);
                    names.references.insert(id.clone(), name.clone());
                }
                Resource::Queue { name, config, .. } => {
                    let url = services.sqs.create_queue(name);
                    services.sqs.configure(&url, config.clone());
                    attr("Arn", LocalSqs::queue_arn(&url));
                    attr("QueueUrl", url.clone());
                    attr("QueueName", name.clone());
                    names.references.insert(id.clone(), url);
                }
            }
        }
        // A queue's redrive policy names its dead-letter queue, created above or given by ARN.
        for (id, resource) in &wiring.resources {
            let Resource::Queue {
                config,
                dead_letter: Some((target, most)),
                ..
            } = resource
            else {
                continue;
            };
            let url = names.reference(id).expect("created above");
            let dead_letter = match names.reference(target) {
                Some(url) => url,
                None => queue_url_of(target, &format!("Resources/{id}/Properties/RedrivePolicy"))?,
            };
            let redrive = Some((dead_letter, *most));
            let config = QueueConfig {
                redrive,
                ..config.clone()
            };
            self.services.sqs.configure(&url, config);
        }
        Ok(names)
    }

    /// Builds `function` with its factory and maps its event sources.
    fn deploy_function(
        &mut self,
        function: &template::FunctionDef,
        template: &serde_yaml::Value,
        wiring: &Wiring,
        names: &Names,
        factories: &BTreeMap<String, Factory>,
    ) -> Result<Arc<dyn Handler>, LocalError> {
        let id = &function.logical_id;
        let factory = factories.get(id).ok_or_else(|| LocalError::Unregistered {
            function: id.clone(),
        })?;
        let mut env = function.resolved_env(template, names)?;
        // As Lambda sets it for every function.
        env.insert("AWS_LAMBDA_FUNCTION_NAME".into(), function.name.clone());
        // What the function's environment says of its watermarks must fit its mappings.
        let config = executor_config(&env).map_err(|e| LocalError::config(id, &e))?;
        for event in &function.events {
            check_mapping(
                &config,
                event.settings.parallelization_factor,
                wiring.redelivery_horizon(event),
            )
            .map_err(|e| LocalError::at(&LocalError::event_path(id, &event.name), e))?;
        }
        let handler =
            factory(self.services.as_ref(), &env).map_err(|e| LocalError::setup(id, e))?;
        let deployed = DeployedFunction {
            arn: names
                .attribute(id, "Arn")
                .expect("named before it is deployed"),
            handler: handler.clone(),
            timeout: function.timeout,
        };
        for event in &function.events {
            let at = LocalError::event_path(id, &event.name);
            let mut settings = event.settings.clone();
            settings.on_failure = match &event.on_failure {
                Some(queue) => Some(names.reference(queue).ok_or_else(|| {
                    let problem =
                        format!("OnFailure.Destination {queue}: not a queue of the template");
                    LocalError::at(&at, problem)
                })?),
                None => None,
            };
            let mapping = format!("{id}/{}", event.name);
            self.add(mapping, &deployed, &event.source, settings, (names, &at))?;
        }
        self.functions.insert(function.name.clone(), deployed);
        Ok(handler)
    }

    /// Maps a source of this template to a function deployed before, by its name or ARN.
    fn map_external(
        &mut self,
        mapping: &template::MappingDef,
        names: &Names,
    ) -> Result<(), LocalError> {
        let at = format!("Resources/{}", mapping.logical_id);
        let name = mapping
            .function
            .rsplit_once(":function:")
            .map_or(mapping.function.as_str(), |(_, name)| name);
        let deployed = self.functions.get(name).cloned().ok_or_else(|| {
            let problem = format!(
                "FunctionName {:?}: no such function is deployed",
                mapping.function
            );
            LocalError::at(&at, problem)
        })?;
        let event = &mapping.event;
        let mut settings = event.settings.clone();
        settings.function_timeout = deployed.timeout;
        settings.on_failure = match (&event.on_failure, &mapping.on_failure_arn) {
            (Some(queue), _) => names.reference(queue),
            (None, Some(arn)) => Some(queue_url_of(arn, &at)?),
            (None, None) => None,
        };
        let name = mapping.logical_id.clone();
        self.add(name, &deployed, &event.source, settings, (names, &at))
    }

    /// The stream or table a mapping reads; an error at the template path `at` if there is none.
    fn source(
        &self,
        source: &SourceRef,
        names: &Names,
        at: &str,
    ) -> Result<MappingSource, LocalError> {
        let missing = |what: &str, id: &str| LocalError::at(at, format!("no {what} {id}"));
        match source {
            SourceRef::Kinesis(id) => Ok(MappingSource::Kinesis {
                kinesis: self.services.kinesis.clone(),
                stream: names.reference(id).ok_or_else(|| missing("stream", id))?,
            }),
            SourceRef::DynamoDb(id) => {
                let table = names.reference(id).ok_or_else(|| missing("table", id))?;
                Ok(MappingSource::DynamoDb {
                    table: self.services.dynamodb.table(&table).expect("created above"),
                })
            }
            SourceRef::Sqs(_) => unreachable!("a queue's mapping is added apart"),
        }
    }

    /// Maps `function` to the stream, table or queue `source`, as the template path `at` asks.
    fn add(
        &mut self,
        name: String,
        function: &DeployedFunction,
        source: &SourceRef,
        settings: MappingSettings,
        (names, at): (&Names, &str),
    ) -> Result<(), LocalError> {
        let source = match source {
            SourceRef::Sqs(id) => {
                return self.add_queue_mapping(name, function, id, settings, (names, at))
            }
            stream => self.source(stream, names, at)?,
        };
        self.mappings.push(EventSourceMapping::new(
            name,
            function.arn.clone(),
            function.handler.clone(),
            source,
            settings,
            self.services.sqs.clone(),
            self.services.clock.clone(),
            self.services.invocation_faults.clone(),
        ));
        Ok(())
    }

    /// Maps `function` to the queue `id`, whose visibility timeout must cover the function's
    /// timeout, as CreateEventSourceMapping requires.
    fn add_queue_mapping(
        &mut self,
        name: String,
        function: &DeployedFunction,
        id: &str,
        settings: MappingSettings,
        (names, at): (&Names, &str),
    ) -> Result<(), LocalError> {
        let url = names
            .reference(id)
            .ok_or_else(|| LocalError::at(at, format!("no queue {id}")))?;
        let visibility = self
            .services
            .sqs
            .config(&url)
            .unwrap_or_default()
            .visibility_timeout;
        if visibility < settings.function_timeout {
            let problem = format!(
                "Queue visibility timeout: {} seconds is less than Function timeout: {} seconds",
                visibility.as_secs(),
                settings.function_timeout.as_secs()
            );
            return Err(LocalError::at(at, problem));
        }
        self.queue_mappings.push(QueueMapping::new(
            name,
            function.arn.clone(),
            function.handler.clone(),
            self.services.sqs.clone(),
            url,
            settings,
            self.services.clock.clone(),
            self.services.invocation_faults.clone(),
        ));
        Ok(())
    }
}
