//! The embedded runtime: the in-memory services, the functions of a SAM template wired to them as
//! the template says, and their event source mappings, driven until every record is processed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::mapping::queue::QueueMapping;
use super::mapping::{
    invoke, Event, EventSourceMapping, MappingSettings, MappingSource, MappingStats, Spent,
};
use super::services::clock::VirtualClock;
use super::services::dynamodb::{KeySchema, LocalDynamoDb};
use super::services::faults::{add_counts, crash, Fault, FaultCounts, FaultPlan, Faults};
use super::services::kinesis::LocalKinesis;
use super::services::sqs::{LocalSqs, QueueConfig};
use super::template::{self, Resolver, Resource, SourceRef, TemplateError, Wiring};
use keyway::adapters::dynamodb::{DynamoStateStore, ReadOnlyTable, Table};
use keyway::adapters::kinesis::KinesisSink;
use keyway::adapters::retry::Backoff;
use keyway::adapters::sqs::SqsSink;
use keyway::domain::KeyState;
use keyway::lambda::{
    check_mapping, executor_config, ConfigError, Env, Handler, Invocation, Platform, PortError,
    SetupError, SinkMaker, SinkTarget, TableAccess,
};
use keyway::ports::{
    Clock, Commit, Committed, KeyPage, LoadKey, MemoryMetrics, MetricLog, Namespace, Sink,
    StateStore, StoreError, StoreLimits, TimerIndex,
};

/// Kinesis, DynamoDB and SQS in memory, on one virtual clock, with one fault plan.
pub struct LocalServices {
    pub clock: Arc<VirtualClock>,
    pub dynamodb: Arc<LocalDynamoDb>,
    pub kinesis: Arc<LocalKinesis>,
    pub sqs: Arc<LocalSqs>,
    /// The metric lines functions wrote.
    pub metrics: Arc<MemoryMetrics>,
    faults: FaultPlan,
    /// Draws for faults of invocations: crashes before commit, timeouts, duplicate deliveries.
    invocation_faults: Arc<Faults>,
    /// Seeds the backoff jitter of every store and sink handed out, so that runs repeat.
    backoff_seeds: Arc<AtomicU64>,
}

impl LocalServices {
    /// Services whose clock starts at `epoch_millis`; call inside the tokio runtime they run on.
    pub fn new(epoch_millis: i64, faults: FaultPlan) -> Arc<Self> {
        let clock = VirtualClock::starting_at(epoch_millis);
        Arc::new(Self {
            dynamodb: Arc::new(LocalDynamoDb::new(clock.clone(), faults.clone())),
            kinesis: Arc::new(LocalKinesis::new(
                clock.clone(),
                Faults::new(faults.clone(), 0x6b1),
            )),
            sqs: Arc::new(LocalSqs::new(
                clock.clone(),
                Faults::new(faults.clone(), 0x5a5),
            )),
            metrics: Arc::default(),
            invocation_faults: Arc::new(Faults::new(faults.clone(), 0x1a4)),
            backoff_seeds: Arc::new(AtomicU64::new(faults.seed)),
            clock,
            faults,
        })
    }

    /// The faults injected so far, by service: `dynamodb`, `kinesis`, `sqs`, and `invocations`
    /// (crashes, timeouts and duplicate deliveries).
    pub fn faults_fired(&self) -> BTreeMap<&'static str, FaultCounts> {
        BTreeMap::from([
            ("dynamodb", self.dynamodb.faults_fired()),
            ("kinesis", self.kinesis.faults_fired()),
            ("sqs", self.sqs.faults_fired()),
            ("invocations", self.invocation_faults.fired()),
        ])
    }

    /// Every kind of fault `plan` configured that never fired, anywhere.
    pub fn faults_missing(&self) -> Vec<Fault> {
        let mut all = FaultCounts::new();
        for counts in self.faults_fired().values() {
            add_counts(&mut all, counts);
        }
        self.faults
            .kinds()
            .into_iter()
            .filter(|kind| !all.contains_key(kind))
            .collect()
    }

    /// Calls from function invocations take these latencies of virtual time, and nothing else
    /// waits: an invocation lasts on the paused clock as long as it would wait on AWS.
    pub fn set_function_latency(&self, latency: &super::usage::Latencies) {
        self.dynamodb.set_function_latency(Some(latency.dynamodb));
        self.kinesis
            .meter()
            .set_function_latency(Some(latency.kinesis));
        self.sqs.meter().set_function_latency(Some(latency.sqs));
    }

    /// Every service call takes `latency` of virtual time, so that a timeout can stop an
    /// invocation between two calls, as a real one would be stopped.
    pub fn set_latency(&self, latency: Option<Duration>) {
        self.kinesis.meter().set_latency(latency);
        self.sqs.meter().set_latency(latency);
        for table in self.dynamodb.tables() {
            table.meter().set_latency(latency);
        }
    }
}

impl Platform for LocalServices {
    fn state_store(&self, table: &str) -> Result<Arc<dyn StateStore>, PortError> {
        let table = self
            .dynamodb
            .table(table)
            .ok_or_else(|| PortError::NoTable {
                table: table.to_owned(),
            })?;
        let store: Arc<dyn StateStore> =
            Arc::new(DynamoStateStore::new(table, self.clock.clone()).with_backoff(self.backoff()));
        if self.faults.crash_before_commit > 0.0 {
            return Ok(Arc::new(CrashBeforeCommit::new(
                store,
                self.invocation_faults.clone(),
            )));
        }
        Ok(store)
    }

    /// A table asked for to read only refuses writes, as the function's role does on AWS.
    fn table(&self, table: &str, access: TableAccess) -> Result<Arc<dyn Table>, PortError> {
        let found = self
            .dynamodb
            .table(table)
            .ok_or_else(|| PortError::NoTable {
                table: table.to_owned(),
            })?;
        Ok(match access {
            TableAccess::ReadWrite => found,
            TableAccess::Read => Arc::new(ReadOnlyTable::new(found, table)),
        })
    }

    fn sink_maker(&self) -> SinkMaker {
        let (kinesis, sqs) = (self.kinesis.clone(), self.sqs.clone());
        let seeds = self.backoff_seeds.clone();
        Arc::new(move |target| {
            let backoff = Backoff::default().seeded(seeds.fetch_add(1, Ordering::SeqCst));
            Ok(match SinkTarget::parse(target)? {
                SinkTarget::Kinesis(stream) => {
                    Arc::new(KinesisSink::new(kinesis.clone(), stream).with_backoff(backoff))
                        as Arc<dyn Sink>
                }
                SinkTarget::Sqs(url) => {
                    Arc::new(SqsSink::new(sqs.clone(), url).with_backoff(backoff))
                }
            })
        })
    }

    fn clock(&self) -> Arc<dyn Clock> {
        self.clock.clone()
    }

    fn metrics(&self) -> Arc<dyn MetricLog> {
        self.metrics.clone()
    }
}

impl LocalServices {
    fn backoff(&self) -> Backoff {
        Backoff::default().seeded(self.backoff_seeds.fetch_add(1, Ordering::SeqCst))
    }
}

/// A state store whose process may die between emitting and committing: the commit never
/// happens, and the invocation crashes (`services::faults::crash`).
pub struct CrashBeforeCommit {
    inner: Arc<dyn StateStore>,
    faults: Arc<Faults>,
}

impl CrashBeforeCommit {
    /// Crashes with the plan's `crash_before_commit` probability.
    pub fn new(inner: Arc<dyn StateStore>, faults: Arc<Faults>) -> Self {
        Self { inner, faults }
    }

    /// Crashes at every commit.
    pub fn always(inner: Arc<dyn StateStore>) -> Self {
        Self::new(
            inner,
            Arc::new(Faults::new(
                FaultPlan {
                    crash_before_commit: 1.0,
                    ..FaultPlan::default()
                },
                0,
            )),
        )
    }
}

#[async_trait]
impl StateStore for CrashBeforeCommit {
    async fn load_keys(
        &self,
        namespace: &Namespace,
        keys: &[LoadKey<'_>],
    ) -> Result<std::collections::HashMap<String, KeyState>, StoreError> {
        self.inner.load_keys(namespace, keys).await
    }

    async fn commit(
        &self,
        namespace: &Namespace,
        commits: Vec<Commit>,
    ) -> Vec<Result<Committed, StoreError>> {
        if self.faults.draw(Fault::CrashBeforeCommit) {
            crash();
        }
        self.inner.commit(namespace, commits).await
    }

    async fn clear_outbox(
        &self,
        namespace: &Namespace,
        committed: Vec<Committed>,
    ) -> Vec<Result<(), StoreError>> {
        self.inner.clear_outbox(namespace, committed).await
    }

    fn timers(&self) -> &dyn TimerIndex {
        self.inner.timers()
    }

    async fn list_keys(
        &self,
        namespace: &Namespace,
        prefix: &str,
        cursor: Option<&str>,
    ) -> Result<KeyPage, StoreError> {
        self.inner.list_keys(namespace, prefix, cursor).await
    }

    fn limits(&self) -> StoreLimits {
        self.inner.limits()
    }
}

/// The URL of the embedded queue an SQS ARN names.
fn queue_url_of(arn: &str) -> Result<String, String> {
    match arn
        .strip_prefix("arn:aws:sqs:")
        .map(|rest| rest.rsplit(':').next())
    {
        Some(Some(name)) if !name.is_empty() => Ok(format!("{}{name}", LocalSqs::URL_PREFIX)),
        _ => Err(format!("{arn:?} is not the ARN of a queue")),
    }
}

/// The template's schedules, each first due one period after `now`.
fn local_schedules(
    wiring: &Wiring,
    handlers: &BTreeMap<String, Arc<dyn Handler>>,
    now: i64,
) -> Vec<LocalSchedule> {
    let mut schedules = Vec::new();
    for function in &wiring.functions {
        for schedule in &function.schedules {
            let every = schedule.every.as_millis() as i64;
            schedules.push(LocalSchedule {
                name: format!("{}/{}", function.logical_id, schedule.name),
                rule_arn: format!(
                    "arn:aws:events:us-east-1:000000000000:rule/{}{}",
                    function.logical_id, schedule.name
                ),
                handler: handlers[&function.logical_id].clone(),
                every,
                timeout: function.timeout,
                next_at: now + every,
                stats: ScheduleStats::default(),
            });
        }
    }
    schedules
}

/// Builds a function's handler from its platform and environment (a function crate's `handler`).
pub type Factory =
    Box<dyn Fn(&dyn Platform, &Env) -> Result<Arc<dyn Handler>, SetupError> + Send + Sync>;

/// The embedded runtime cannot run a template, or a run does not finish. Problems of a function's
/// configuration name the template path they come from.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum LocalError {
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error("Resources/{function}: no function is registered for this logical id")]
    Unregistered { function: String },
    /// `path` is the template path of what is wrong: an environment variable, an event.
    #[error("{path}: {problem}")]
    Function { path: String, problem: String },
    #[error("{waiting} records still wait after {limit:?}")]
    Unfinished { waiting: usize, limit: Duration },
}

impl LocalError {
    /// A function's configuration error, at the template path of the variable it names.
    fn config(function: &str, err: &ConfigError) -> Self {
        Self::Function {
            path: format!(
                "Resources/{function}/Properties/Environment/Variables/{}",
                err.name
            ),
            problem: err.problem.clone(),
        }
    }

    fn setup(function: &str, err: SetupError) -> Self {
        match err {
            SetupError::Config(err) => Self::config(function, &err),
            SetupError::Wiring(err) => Self::Function {
                path: format!("Resources/{function}"),
                problem: err.to_string(),
            },
        }
    }

    fn event(function: &str, event: &str, problem: impl std::fmt::Display) -> Self {
        Self::Function {
            path: format!("Resources/{function}/Properties/Events/{event}"),
            problem: problem.to_string(),
        }
    }
}

/// What a run did, per event source mapping.
#[derive(Clone, Debug, Default)]
pub struct RunReport {
    pub mappings: Vec<(String, MappingStats)>,
    /// Virtual time the run took.
    pub elapsed: Duration,
}

/// A template's functions on the in-memory services.
pub struct LocalRuntime {
    pub services: Arc<LocalServices>,
    /// The first template's wiring, names and outputs.
    pub wiring: Wiring,
    names: Names,
    outputs: BTreeMap<String, String>,
    /// Every function deployed, by name.
    functions: BTreeMap<String, DeployedFunction>,
    mappings: Vec<EventSourceMapping>,
    queue_mappings: Vec<QueueMapping>,
    schedules: Vec<LocalSchedule>,
}

/// What a schedule did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScheduleStats {
    pub invocations: u64,
    pub errors: u64,
    /// What the invocations spent.
    pub spent: Spent,
}

/// A function's schedule on the virtual clock: EventBridge invokes the function asynchronously
/// once a period with a "Scheduled Event", and does not catch up on periods it missed.
struct LocalSchedule {
    name: String,
    rule_arn: String,
    handler: Arc<dyn Handler>,
    every: i64,
    timeout: Duration,
    next_at: i64,
    stats: ScheduleStats,
}

impl LocalSchedule {
    async fn fire_if_due(&mut self, now: i64) {
        if now < self.next_at {
            return;
        }
        self.stats.invocations += 1;
        let event = serde_json::json!({
            "version": "0",
            "id": format!("{:08x}-0000-4000-8000-{:012x}", self.stats.invocations, now),
            "detail-type": "Scheduled Event",
            "source": "aws.events",
            "account": "000000000000",
            "time": chrono::DateTime::from_timestamp_millis(now)
                .map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string()),
            "region": "us-east-1",
            "resources": [self.rule_arn],
            "detail": {}
        });
        let invocation = Invocation {
            request_id: format!("{}-{}", self.name, self.stats.invocations),
            deadline_millis: Some(now + self.timeout.as_millis() as i64),
        };
        // EventBridge retries a failed asynchronous invocation; here the next period's does.
        let (result, spent) = invoke(
            &*self.handler,
            &Event::Json(event.to_string()),
            &invocation,
            self.timeout,
        )
        .await;
        self.stats.spent += spent;
        if let Err(failed) = result {
            tracing::warn!(schedule = %self.name, ?failed, "a scheduled invocation failed");
            self.stats.errors += 1;
        }
        let missed = (now - self.next_at) / self.every;
        self.next_at += (missed + 1) * self.every;
    }
}

/// Resource names, URLs and ARNs by logical id.
#[derive(Default)]
struct Names {
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
struct DeployedFunction {
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
                None => queue_url_of(target).map_err(|problem| LocalError::Function {
                    path: format!("Resources/{id}/Properties/RedrivePolicy"),
                    problem,
                })?,
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
            .map_err(|e| LocalError::event(id, &event.name, e))?;
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
            let mut settings = event.settings.clone();
            settings.on_failure = match &event.on_failure {
                Some(queue) => Some(names.reference(queue).ok_or_else(|| {
                    let problem =
                        format!("OnFailure.Destination {queue}: not a queue of the template");
                    LocalError::event(id, &event.name, problem)
                })?),
                None => None,
            };
            self.add(
                format!("{id}/{}", event.name),
                &deployed,
                &event.source,
                settings,
                names,
            )
            .map_err(|e| LocalError::event(id, &event.name, e))?;
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
        let problem = |problem: String| LocalError::Function {
            path: format!("Resources/{}", mapping.logical_id),
            problem,
        };
        let name = mapping
            .function
            .rsplit_once(":function:")
            .map_or(mapping.function.as_str(), |(_, name)| name);
        let deployed = self.functions.get(name).cloned().ok_or_else(|| {
            problem(format!(
                "FunctionName {:?}: no such function is deployed",
                mapping.function
            ))
        })?;
        let event = &mapping.event;
        let mut settings = event.settings.clone();
        settings.function_timeout = deployed.timeout;
        settings.on_failure = match (&event.on_failure, &mapping.on_failure_arn) {
            (Some(queue), _) => names.reference(queue),
            (None, Some(arn)) => Some(queue_url_of(arn).map_err(problem)?),
            (None, None) => None,
        };
        self.add(
            mapping.logical_id.clone(),
            &deployed,
            &event.source,
            settings,
            names,
        )
        .map_err(problem)
    }

    /// The stream or table a mapping reads.
    fn source(&self, source: &SourceRef, names: &Names) -> Result<MappingSource, String> {
        match source {
            SourceRef::Kinesis(id) => Ok(MappingSource::Kinesis {
                kinesis: self.services.kinesis.clone(),
                stream: names.reference(id).ok_or(format!("no stream {id}"))?,
            }),
            SourceRef::DynamoDb(id) => {
                let table = names.reference(id).ok_or(format!("no table {id}"))?;
                Ok(MappingSource::DynamoDb {
                    table: self.services.dynamodb.table(&table).expect("created above"),
                })
            }
            SourceRef::Sqs(_) => unreachable!("a queue's mapping is added apart"),
        }
    }

    /// Maps `function` to the stream, table or queue `source`.
    fn add(
        &mut self,
        name: String,
        function: &DeployedFunction,
        source: &SourceRef,
        settings: MappingSettings,
        names: &Names,
    ) -> Result<(), String> {
        let source = match source {
            SourceRef::Sqs(id) => {
                return self.add_queue_mapping(name, function, id, settings, names)
            }
            stream => self.source(stream, names)?,
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
        names: &Names,
    ) -> Result<(), String> {
        let url = names.reference(id).ok_or(format!("no queue {id}"))?;
        let visibility = self
            .services
            .sqs
            .config(&url)
            .unwrap_or_default()
            .visibility_timeout;
        if visibility < settings.function_timeout {
            return Err(format!(
                "Queue visibility timeout: {} seconds is less than Function timeout: {} seconds",
                visibility.as_secs(),
                settings.function_timeout.as_secs()
            ));
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

    /// A runtime without a template, for mappings added by hand.
    pub fn new(services: Arc<LocalServices>) -> Self {
        Self {
            services,
            wiring: Wiring::default(),
            names: Names::default(),
            outputs: BTreeMap::new(),
            functions: BTreeMap::new(),
            mappings: Vec::new(),
            queue_mappings: Vec::new(),
            schedules: Vec::new(),
        }
    }

    /// Adds a mapping of `handler` to `source`; it starts reading at its starting position now.
    pub fn add_mapping(
        &mut self,
        name: &str,
        handler: Arc<dyn Handler>,
        source: MappingSource,
        settings: MappingSettings,
    ) {
        let mut mapping = EventSourceMapping::new(
            name,
            format!("arn:aws:lambda:us-east-1:000000000000:function:{name}"),
            handler,
            source,
            settings,
            self.services.sqs.clone(),
            self.services.clock.clone(),
            self.services.invocation_faults.clone(),
        );
        mapping.poll();
        self.mappings.push(mapping);
    }

    /// Invokes `handler` with a "Scheduled Event" every `every` of virtual time from now, as an
    /// EventBridge rule does, each invocation given `timeout`.
    pub fn add_schedule(
        &mut self,
        name: &str,
        handler: Arc<dyn Handler>,
        every: Duration,
        timeout: Duration,
    ) {
        let every = every.as_millis() as i64;
        self.schedules.push(LocalSchedule {
            name: name.to_owned(),
            rule_arn: format!("arn:aws:events:us-east-1:000000000000:rule/{name}"),
            handler,
            every,
            timeout,
            next_at: self.services.clock.now_millis() + every,
            stats: ScheduleStats::default(),
        });
    }

    /// The name (stream, table) or URL (queue) of a resource of the template.
    pub fn resource(&self, logical_id: &str) -> Option<String> {
        self.names.reference(logical_id)
    }

    /// An output of the template, resolved as CloudFormation gives it once the stack exists.
    pub fn output(&self, name: &str) -> Option<String> {
        self.outputs.get(name).cloned()
    }

    pub fn mappings(&self) -> &[EventSourceMapping] {
        &self.mappings
    }

    /// The mappings of SQS queues.
    pub fn queue_mappings(&self) -> &[QueueMapping] {
        &self.queue_mappings
    }

    /// Enables or disables the mapping named `name` (`function/event`, or an
    /// `AWS::Lambda::EventSourceMapping`'s logical id), as UpdateEventSourceMapping does.
    pub fn set_enabled(&mut self, name: &str, enabled: bool) -> Result<(), LocalError> {
        if let Some(queue) = self.queue_mappings.iter_mut().find(|m| m.name == name) {
            queue.set_enabled(enabled);
            return Ok(());
        }
        let mapping = self
            .mappings
            .iter_mut()
            .find(|m| m.name() == name)
            .ok_or_else(|| LocalError::Function {
                path: name.to_owned(),
                problem: "no such event source mapping".to_owned(),
            })?;
        mapping.set_enabled(enabled);
        if enabled {
            // It reads from where it stopped, or from its starting position if it never ran.
            mapping.poll();
        }
        Ok(())
    }

    /// Runs the mappings until no record waits, or fails when records still wait after `limit`
    /// of virtual time (a function that keeps failing with unlimited retries). Schedules fire as
    /// the virtual time they wait for passes.
    pub async fn run_until_idle(&mut self, limit: Duration) -> Result<RunReport, LocalError> {
        let start = self.services.clock.now_millis();
        let deadline = start + limit.as_millis() as i64;
        match self.drive(deadline, true).await {
            Some(report) => Ok(report),
            None => {
                let waiting: usize = self.mappings.iter().map(|m| m.pending().0).sum::<usize>()
                    + self
                        .queue_mappings
                        .iter()
                        .map(QueueMapping::waiting)
                        .sum::<usize>();
                Err(LocalError::Unfinished { waiting, limit })
            }
        }
    }

    /// Runs the mappings and schedules for `span` of virtual time, idle or not: what keyed
    /// timers need to come due and be swept.
    pub async fn run_for(&mut self, span: Duration) -> RunReport {
        let end = self.services.clock.now_millis() + span.as_millis() as i64;
        self.drive(end, false)
            .await
            .expect("a run that does not stop when idle ends at its end")
    }

    /// What each schedule's invocations spent so far, by `function/event`, with its period.
    pub(crate) fn schedule_periods(&self) -> Vec<(String, Duration, Spent)> {
        self.schedules
            .iter()
            .map(|s| {
                let every = Duration::from_millis(s.every as u64);
                (s.name.clone(), every, s.stats.spent)
            })
            .collect()
    }

    /// What the schedules did so far, by `function/event`.
    pub fn schedules(&self) -> Vec<(String, ScheduleStats)> {
        self.schedules
            .iter()
            .map(|s| (s.name.clone(), s.stats.clone()))
            .collect()
    }

    /// Drives mappings and schedules until `end` (`None` when `until_idle` and records still
    /// wait then), or until no record waits when `until_idle`.
    async fn drive(&mut self, end: i64, until_idle: bool) -> Option<RunReport> {
        let start = self.services.clock.now_millis();
        let mut last_expiry = i64::MIN;
        loop {
            let now = self.services.clock.now_millis();
            if until_idle && now > end {
                return None;
            }
            if !until_idle && now >= end {
                return Some(self.report(start));
            }
            // DynamoDB's TTL process and the streams' retention run in the background; here
            // once a virtual second.
            if now.saturating_sub(last_expiry) >= 1_000 {
                self.services.dynamodb.expire();
                self.services.kinesis.expire();
                last_expiry = now;
            }
            for schedule in &mut self.schedules {
                schedule.fire_if_due(now).await;
            }
            for mapping in &mut self.mappings {
                mapping.poll();
            }
            let ran: usize = futures::future::join_all(self.mappings.iter_mut().map(|m| m.step()))
                .await
                .into_iter()
                .sum();
            let polled: usize =
                futures::future::join_all(self.queue_mappings.iter_mut().map(|m| m.step()))
                    .await
                    .into_iter()
                    .sum();
            if ran + polled > 0 {
                continue;
            }
            // A step can finish with a parent shard without invoking anything (its last records
            // were too old): its children are readable from the next poll on, which must come
            // before the run is taken for idle.
            for mapping in &mut self.mappings {
                mapping.poll();
            }
            let records_due = self
                .mappings
                .iter()
                .filter_map(|m| m.pending().1)
                .chain(self.queue_mappings.iter_mut().filter_map(|m| m.due()))
                .min();
            if until_idle && records_due.is_none() {
                return Some(self.report(start));
            }
            let next_schedule = self.schedules.iter().map(|s| s.next_at).min();
            // The TTL process runs once a virtual second at most.
            let next_expiry = self
                .services
                .dynamodb
                .next_expiry_millis()
                .map(|at| at.max(last_expiry.saturating_add(1_000)));
            let wake = [records_due, next_schedule, next_expiry, Some(end)]
                .into_iter()
                .flatten()
                .min()
                .expect("the end is a time");
            tokio::time::sleep(Duration::from_millis((wake - now).max(1) as u64)).await;
        }
    }

    fn report(&self, start: i64) -> RunReport {
        RunReport {
            mappings: self
                .mappings
                .iter()
                .map(|m| (m.name.clone(), m.stats().clone()))
                .chain(
                    self.queue_mappings
                        .iter()
                        .map(|m| (m.name.clone(), m.stats().clone())),
                )
                .collect(),
            elapsed: Duration::from_millis((self.services.clock.now_millis() - start) as u64),
        }
    }
}
