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

#[cfg(test)]
mod tests {
    use super::super::testkit::{bench, record, Summer};
    use crate::adapters::dynamodb::DynamoStateStore;
    use crate::local::LocalTable;
    use crate::ports::StateStore;

    #[tokio::test]
    async fn a_sent_outbox_is_cleared_and_one_that_failed_is_kept_and_reported() {
        let b = bench(
            Summer {
                outbox: true,
                ..Summer::default()
            },
            false,
        );
        b.out.fail("3");
        let report = b
            .executor
            .run(vec![record(1, "p", "a", 1), record(2, "p", "b", 3)])
            .await;
        assert_eq!(
            report.commits, 2,
            "both keys commit before their outbox goes out"
        );
        assert_eq!(
            report.failed_from.unwrap().as_str(),
            "2",
            "b's outbox is owed"
        );
        let store =
            DynamoStateStore::<LocalTable>::new(b.table.clone(), crate::ports::ManualClock::at(0));
        let loaded = store
            .load(b.executor.namespace(), &["a".into(), "b".into()])
            .await
            .unwrap();
        assert!(loaded["a"].outbox.is_empty(), "a's was sent, and cleared");
        assert_eq!(loaded["b"].outbox.len(), 1);
    }
}
