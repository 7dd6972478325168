//! What a function's wiring reaches: every port it asks its platform for, with the resource the
//! port is on, recorded by a platform that passes the asking on (`Recording`). The permission test
//! builds each function of a template on it and derives the grants its role needs from what it
//! recorded: the actions of each port (`adapters::permissions`) on the resource it named.

use std::sync::{Arc, Mutex, PoisonError};

use super::platform::{Platform, PortError, SinkMaker, SinkTarget, TableAccess};
use crate::adapters::dynamodb::Table;
use crate::adapters::permissions::{KINESIS_SINK, SQS_SINK, TABLE_READ_WRITE};
use crate::ports::{Clock, MetricLog, Sink, StateStore};

/// One port a function asked for.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reach {
    /// The state store on a table.
    StateStore {
        /// The table's name.
        table: String,
    },
    /// A table of the application's own.
    Table {
        /// The table's name.
        table: String,
        /// What the function does with it.
        access: TableAccess,
    },
    /// A sink on a target its configuration names.
    Sink(SinkTarget),
    /// A sink maker: sinks to targets the function learns as it runs (a consumer's queue).
    SinkMaker,
}

impl Reach {
    /// The IAM actions this port calls.
    pub fn actions(&self) -> &'static [&'static str] {
        match self {
            Reach::StateStore { .. } => TABLE_READ_WRITE,
            Reach::Table { access, .. } => access.actions(),
            Reach::Sink(SinkTarget::Kinesis(_)) => KINESIS_SINK,
            Reach::Sink(SinkTarget::Sqs(_)) | Reach::SinkMaker => SQS_SINK,
        }
    }
}

/// `inner`, recording every port asked of it.
pub struct Recording<'a> {
    inner: &'a dyn Platform,
    reached: Mutex<Vec<Reach>>,
}

impl<'a> Recording<'a> {
    /// `inner`, with nothing recorded yet.
    pub fn new(inner: &'a dyn Platform) -> Self {
        Self {
            inner,
            reached: Mutex::new(Vec::new()),
        }
    }

    /// What was asked for, each port once, in order.
    pub fn reached(&self) -> Vec<Reach> {
        let mut reached = self.list().clone();
        reached.sort();
        reached.dedup();
        reached
    }

    fn record(&self, reach: Reach) {
        self.list().push(reach);
    }

    /// The list, also after a panic elsewhere held the lock: pushes leave it whole.
    fn list(&self) -> std::sync::MutexGuard<'_, Vec<Reach>> {
        self.reached.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Platform for Recording<'_> {
    fn state_store(&self, table: &str) -> Result<Arc<dyn StateStore>, PortError> {
        self.record(Reach::StateStore {
            table: table.to_owned(),
        });
        self.inner.state_store(table)
    }

    fn table(&self, table: &str, access: TableAccess) -> Result<Arc<dyn Table>, PortError> {
        self.record(Reach::Table {
            table: table.to_owned(),
            access,
        });
        self.inner.table(table, access)
    }

    fn sink(&self, target: &str) -> Result<Arc<dyn Sink>, PortError> {
        self.record(Reach::Sink(SinkTarget::parse(target)?));
        self.inner.sink(target)
    }

    fn sink_maker(&self) -> SinkMaker {
        self.record(Reach::SinkMaker);
        self.inner.sink_maker()
    }

    fn clock(&self) -> Arc<dyn Clock> {
        self.inner.clock()
    }

    fn metrics(&self) -> Arc<dyn MetricLog> {
        self.inner.metrics()
    }
}
