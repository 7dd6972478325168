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
        let failed = self.send_all(emission, plan.sends, report).await;
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
    use super::super::testkit::{bench, record, Summer, OUT};
    use crate::adapters::dynamodb::DynamoStateStore;
    use crate::adapters::dynamodb::MemoryTable;
    use crate::ports::StateStore;

    /// What the bench's table holds for `keys`.
    async fn stored<O: crate::operator::KeyedOperator>(
        b: &super::super::testkit::Bench<O>,
        keys: &[&str],
    ) -> std::collections::HashMap<String, crate::domain::KeyState> {
        let store =
            DynamoStateStore::<MemoryTable>::new(b.table.clone(), crate::ports::ManualClock::at(0));
        let keys: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
        store.load(b.executor.namespace(), &keys).await.unwrap()
    }

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
        let loaded = stored(&b, &["a", "b"]).await;
        assert!(loaded["a"].outbox.is_empty(), "a's was sent, and cleared");
        assert_eq!(loaded["b"].outbox.len(), 1);
    }

    /// Sums odd `n` and emits the sum through the outbox; emits even `n` settled, changing
    /// nothing.
    struct HalfSettled;

    impl crate::operator::KeyedOperator for HalfSettled {
        type Input = (String, i64);

        fn name(&self) -> &str {
            "half-settled"
        }

        fn states(&self) -> Vec<crate::operator::StateDescriptor> {
            vec![super::super::testkit::SUM.descriptor()]
        }

        fn sinks(&self) -> Vec<crate::operator::SinkDescriptor> {
            vec![OUT.descriptor()]
        }

        fn decode(
            &self,
            record: &crate::domain::SourceRecord,
        ) -> Result<(String, i64), crate::operator::InvalidInput> {
            super::super::testkit::key_and_n(record)
        }

        fn key(&self, input: &(String, i64)) -> String {
            input.0.clone()
        }

        fn delivery(&self) -> crate::operator::Delivery {
            crate::operator::Delivery::Outbox
        }

        fn process(
            &self,
            ctx: &mut crate::operator::Ctx<'_>,
            (key, n): (String, i64),
        ) -> Result<(), crate::operator::ProcessError> {
            if n % 2 == 0 {
                let at = (&ctx.record().origin.clone(), &ctx.record().sequence.clone());
                return ctx.emit_settled_for(&OUT, at, 0, key, &n);
            }
            let mut sum = ctx.value(&super::super::testkit::SUM)?;
            let total = sum.get().copied().unwrap_or(0) + n;
            sum.set(total);
            ctx.emit(&OUT, key, &total)
        }
    }

    #[tokio::test]
    async fn settled_outputs_go_out_before_the_commit_and_are_never_stored() {
        let b = bench(HalfSettled, false);
        let report = b
            .executor
            .run(vec![
                record(1, "p", "a", 3),
                record(2, "p", "a", 4),
                record(3, "p", "b", 2),
            ])
            .await;
        assert_eq!(report.failed_from, None);
        let sent: Vec<String> = b.out.bodies().concat();
        assert_eq!(
            sent,
            ["4", "2", "3"],
            "the settled outputs first, the outbox after the commit"
        );
        assert_eq!(report.commits, 1, "b changed nothing: no write at all");
        let loaded = stored(&b, &["a", "b"]).await;
        assert!(loaded["a"].outbox.is_empty());
        assert_eq!(loaded["b"].version, 0, "b was never written");
    }
}
