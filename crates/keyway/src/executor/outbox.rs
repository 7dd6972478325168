//! Phase 6: what outbox operators just committed goes out; once a key's outputs are all sent,
//! its outbox is cleared, so that its next commit does not send them again. A key whose outputs
//! did not all go out is redelivered: its records are skipped as applied and the outbox is sent
//! again first, with the same ids.

use tracing::warn;

use super::commit::PendingOutbox;
use super::emit::{Emission, Tag};
use super::plan::Plan;
use super::{BatchReport, Executor};
use crate::operator::KeyedOperator;

impl<O: KeyedOperator> Executor<O> {
    pub(super) async fn deliver_outboxes(
        &self,
        plan: &Plan<'_>,
        pending: Vec<PendingOutbox>,
        report: &mut BatchReport,
    ) {
        if pending.is_empty() {
            return;
        }
        let mut emission = Emission::default();
        for key in &pending {
            for output in &key.outputs {
                emission.push(Tag::Outbox { group: key.group }, output.clone());
            }
        }
        let failed = self.send_all(emission, report).await;
        let mut sent = Vec::new();
        for key in pending {
            if failed.contains(&Tag::Outbox { group: key.group }) {
                report.fail(&plan.record(plan.groups[key.group].records[0]).sequence);
            } else {
                sent.push(key.committed);
            }
        }
        if sent.is_empty() {
            return;
        }
        for result in self.store.clear_outbox(&self.namespace, sent).await {
            if let Err(err) = result {
                // The next commit of the key sends the outbox again, with the same ids.
                warn!(operator = %self.namespace.operator, error = %err, "a sent outbox could not be cleared");
            }
        }
    }
}
