//! What a run on the embedded runtime would be billed on AWS: the functions' calls to each
//! service in AWS's billing units, and what their invocations spent (`mapping::Spent`). The
//! calls producers and clients make around the functions (putting the input, changing a
//! subscription) are left out: they cost the same whatever consumes the stream.

use std::time::Duration;

use super::mapping::Spent;
use super::runtime::LocalRuntime;

/// How long a call from a function waits for each service, on the paused clock
/// (`LocalServices::set_function_latency`).
#[derive(Clone, Debug, PartialEq)]
pub struct Latencies {
    /// Of each call to a DynamoDB table.
    pub dynamodb: Duration,
    /// Of each call to Kinesis.
    pub kinesis: Duration,
    /// Of each call to SQS.
    pub sqs: Duration,
}

/// What a run's functions were billed for, by service.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Usage {
    /// DynamoDB read request units of every table.
    pub read_units: f64,
    /// DynamoDB write request units of every table.
    pub write_units: f64,
    /// Kinesis PUT payload units (25 KB of a record) of the records the functions put.
    pub put_payload_units: f64,
    /// SQS requests (64 KB of a call's messages) of what the functions sent.
    pub sqs_requests: f64,
    /// The invocations of event source mappings (streams and queues).
    pub triggered: Spent,
    /// The invocations of each schedule, with its period: a cost per hour, whatever the load.
    pub schedules: Vec<(String, Duration, Spent)>,
}

impl LocalRuntime {
    /// What the functions of this runtime were billed for so far.
    pub fn usage(&self) -> Usage {
        let services = &self.services;
        let mut usage = Usage::default();
        for table in services.dynamodb.tables() {
            let billed = table.meter().snapshot().functions;
            usage.read_units += billed.read_units;
            usage.write_units += billed.write_units;
        }
        usage.put_payload_units = services.kinesis.meter().snapshot().functions.request_units;
        usage.sqs_requests = services.sqs.meter().snapshot().functions.request_units;
        for mapping in self.mappings() {
            usage.triggered += mapping.stats().spent;
        }
        for mapping in self.queue_mappings() {
            usage.triggered += mapping.stats().spent;
        }
        usage.schedules = self.schedule_periods();
        usage
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_runs_that_invoked_and_waited_alike_spent_the_same_whatever_their_cpu_time() {
        let spent = |waited: u64, cpu: u64| Spent {
            invocations: 3,
            waited: Duration::from_millis(waited),
            cpu: Duration::from_micros(cpu),
        };
        assert_eq!(spent(20, 470), spent(20, 530));
        assert_ne!(spent(20, 470), spent(25, 470));
    }
}
