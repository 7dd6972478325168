//! Where a function runs: the ports its configuration names, built by the AWS platform
//! (`lambda::aws`) on Lambda and by the embedded runtime's services on a laptop.

use std::sync::Arc;

use crate::adapters::dynamodb::Table;
use crate::adapters::permissions::{TABLE_READ, TABLE_READ_WRITE};
use crate::adapters::retry::Backoff;
use crate::ports::{Clock, MetricLog, Sink, StateStore};

/// Where a function runs: it builds the ports the function's configuration names.
pub trait Platform: Send + Sync {
    /// The state store on the DynamoDB table `table`.
    fn state_store(&self, table: &str) -> Result<Arc<dyn StateStore>, PortError>;
    /// The DynamoDB table `table` itself, for state an application lays out on its own (an
    /// index, a journal) with the operations the runtime's adapters share. `access` is what the
    /// function's role is granted on it: a platform may refuse the rest, as IAM does.
    fn table(&self, table: &str, access: TableAccess) -> Result<Arc<dyn Table>, PortError>;
    /// A sink for `target`: `kinesis:<stream name>` or `sqs:<queue URL>`.
    fn sink(&self, target: &str) -> Result<Arc<dyn Sink>, PortError> {
        (self.sink_maker())(target)
    }
    /// What makes sinks, kept by a function whose destinations are known only as it runs (a
    /// queue per consumer).
    fn sink_maker(&self) -> SinkMaker;
    /// The clock the function's ports and executor read the time from.
    fn clock(&self) -> Arc<dyn Clock>;
    /// Where the function's metric lines go.
    fn metrics(&self) -> Arc<dyn MetricLog>;
    /// The backoff for a port a function builds itself on a table or sink of this platform (a
    /// sink that writes a table): jittered from the system's entropy, or from the platform's seed
    /// where runs must repeat (the embedded runtime's), as the ports it hands out are.
    fn backoff(&self) -> Backoff {
        Backoff::default()
    }
}

/// What a function does with a table it asks for: what the templates grant its role on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TableAccess {
    /// Reads only (`TABLE_READ`).
    Read,
    /// Reads and writes (`TABLE_READ_WRITE`).
    ReadWrite,
}

impl TableAccess {
    /// The IAM actions this access takes.
    pub fn actions(self) -> &'static [&'static str] {
        match self {
            TableAccess::Read => TABLE_READ,
            TableAccess::ReadWrite => TABLE_READ_WRITE,
        }
    }
}

/// Makes the sink of a target, as `Platform::sink` does, at any time.
pub type SinkMaker = Arc<dyn Fn(&str) -> Result<Arc<dyn Sink>, PortError> + Send + Sync>;

/// A platform cannot build the port a configuration value names.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum PortError {
    /// A sink target that is neither `kinesis:<stream name>` nor `sqs:<queue URL>`.
    #[error("sink target {target:?}: expected kinesis:<stream name> or sqs:<queue URL>")]
    SinkTarget {
        /// The target as configured.
        target: String,
    },
    /// The platform has no table of that name.
    #[error("no DynamoDB table named {table:?}")]
    NoTable {
        /// The table's name.
        table: String,
    },
}

/// Where a sink sends to, as configuration names it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SinkTarget {
    /// `kinesis:<stream name>`
    Kinesis(String),
    /// `sqs:<queue URL>`
    Sqs(String),
}

impl SinkTarget {
    /// Reads `kinesis:<stream name>` or `sqs:<queue URL>` (a URL that starts with `http`).
    pub fn parse(target: &str) -> Result<Self, PortError> {
        match target.split_once(':') {
            Some(("kinesis", stream)) if !stream.is_empty() => Ok(Self::Kinesis(stream.to_owned())),
            Some(("sqs", url)) if url.starts_with("http") => Ok(Self::Sqs(url.to_owned())),
            _ => Err(PortError::SinkTarget {
                target: target.to_owned(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sink_targets_name_a_stream_or_a_queue_url() {
        assert_eq!(
            SinkTarget::parse("kinesis:counts"),
            Ok(SinkTarget::Kinesis("counts".into()))
        );
        let url = "https://sqs.eu-west-1.amazonaws.com/123456789012/out";
        assert_eq!(
            SinkTarget::parse(&format!("sqs:{url}")),
            Ok(SinkTarget::Sqs(url.into()))
        );
        let err = SinkTarget::parse("sns:topic").unwrap_err().to_string();
        assert!(
            err.contains("\"sns:topic\"") && err.contains("kinesis:<stream name>"),
            "{err}"
        );
        assert!(SinkTarget::parse("kinesis:").is_err());
    }
}
