//! The embedded runtime: the in-memory services, the functions of a SAM template wired to them as
//! the template says, and their event source mappings, driven until every record is processed.
//!
//! `platform` is the services as a function's `Platform`, `deploy` reads a template onto them,
//! `schedule` fires its schedules, `crash` is the state store a crash fault stops between emit
//! and commit, `error` says what cannot run, and this module drives the mappings on the virtual
//! clock.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::mapping::queue::QueueMapping;
use crate::mapping::{EventSourceMapping, MappingSettings, MappingSource, MappingStats, Spent};
use crate::template::{Resolver, Wiring};
use keyway::lambda::Handler;
use keyway::ports::Clock;

mod crash;
mod deploy;
mod error;
mod platform;
mod schedule;

pub use crash::CrashBeforeCommit;
pub use deploy::Deployed;
pub use error::{Factory, LocalError};
pub use platform::LocalServices;
pub use schedule::ScheduleStats;

use deploy::{DeployedFunction, Names};
use schedule::LocalSchedule;

/// What a run did, per event source mapping.
#[derive(Clone, Debug, Default)]
pub struct RunReport {
    /// Each mapping's name and what it did so far: the stream mappings, then the queues'.
    pub mappings: Vec<(String, MappingStats)>,
    /// Virtual time the run took.
    pub elapsed: Duration,
}

/// A template's functions on the in-memory services.
pub struct LocalRuntime {
    /// The in-memory services the functions and mappings use.
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

impl LocalRuntime {
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

    /// The mappings of Kinesis streams and DynamoDB streams.
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
