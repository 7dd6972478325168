//! A function's rate schedules on the virtual clock, as EventBridge invokes them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::mapping::{invoke, Event, Spent};
use crate::template::Wiring;
use keyway::lambda::{Handler, Invocation};

/// The template's schedules, each first due one period after `now`.
pub(super) fn local_schedules(
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

/// What a schedule did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScheduleStats {
    /// Scheduled invocations of the function.
    pub invocations: u64,
    /// Invocations that failed: an error returned, a timeout or a crash.
    pub errors: u64,
    /// What the invocations spent.
    pub spent: Spent,
}

/// A function's schedule on the virtual clock: EventBridge invokes the function asynchronously
/// once a period with a "Scheduled Event", and does not catch up on periods it missed.
pub(super) struct LocalSchedule {
    pub(super) name: String,
    pub(super) rule_arn: String,
    pub(super) handler: Arc<dyn Handler>,
    pub(super) every: i64,
    pub(super) timeout: Duration,
    pub(super) next_at: i64,
    pub(super) stats: ScheduleStats,
}

impl LocalSchedule {
    pub(super) async fn fire_if_due(&mut self, now: i64) {
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
