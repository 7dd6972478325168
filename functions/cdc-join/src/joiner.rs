//! The join as an operator: the changelog's steps, keyed by their group (the join key the re-key
//! put them under), applied to the rows of the group (`join::Group`); the joined changes go out
//! stamped to the joined changelog and to the view (`view_table`), which keeps each row's latest.
//!
//! Per group it keeps the rows of both sides, by primary key, and the group's count of steps;
//! besides, the stamps of the rows it deleted within the redelivery window (`join::Gone`: a
//! replay of a retried re-key batch can come that long), each dropped by the group's first step
//! after the window. The rows held are exactly the live source rows; the stamps of what went stay
//! until the group's next step, a small entry each, and no longer than the window after the
//! group's last delete: a group emptied of its rows goes whole then. One writer per
//! key (the changelog stream alone) and outputs computed from the step and the group's state:
//! emit-then-commit (DESIGN §3).

use std::time::Duration;

use keyway::domain::{Payload, SourceRecord};
use keyway::operator::{SinkDescriptor, StateDescriptor};
use keyway::{Ctx, InvalidInput, KeyedOperator, MapState, ProcessError, Sink, ValueState};

use crate::join::{gone_key, Gone, Group, Held, Stamp, Stamped};
use crate::rekey::Step;
use crate::spec::{JoinKind, Side};

/// The operator's name: part of its state keys and output ids.
pub const NAME: &str = "cdc-join";

const HELD: &str = "Held { row: JSON object of a source row's columns, stamp: Stamp(String) }";
/// The group's left rows, by primary key.
pub const LEFT: MapState<String, Held> = MapState::with_shape("left", HELD);
/// The group's right rows, by primary key.
pub const RIGHT: MapState<String, Held> = MapState::with_shape("right", HELD);
/// Steps the group applied (`Group::clock`).
pub const CLOCK: ValueState<u64> = ValueState::new("clock");
/// The stamps of the rows the group deleted within the redelivery window (`Group::gone`), an
/// entry each: a join key whose rows come and go by the thousand a day keeps thousands, more than
/// one item holds.
pub const GONE: MapState<String, (Stamp, i64)> = MapState::with_shape(
    "gone",
    "(Stamp(String), i64): a deleted row's delete's stamp, when",
);

/// The joined changelog: each joined row inserted or deleted, with the pair that orders it.
pub const JOINED: Sink<Stamped> = Sink::new("joined");
/// The same changes, for the materialized view.
pub const VIEW: Sink<Stamped> = Sink::new("view");

/// The join of one spec's tables.
#[derive(Clone, Copy, Debug)]
pub struct Join {
    /// Inner or left outer.
    pub kind: JoinKind,
    /// How long a replay of a step can come after it: the re-key's redelivery window. A deleted
    /// row's stamp is kept that long.
    pub replays_within: Duration,
}

impl Join {
    /// What a step of `pk` of `side` needs of the group as stored: every right row (the rows a
    /// left row pairs with, and whether there is any), and of the left rows, that row alone for a
    /// left step, since a join key with many left rows (a user's many domains) must not copy
    /// them all for each change of one.
    fn load(&self, ctx: &mut Ctx<'_>, side: Side, pk: &str) -> Result<Group, ProcessError> {
        let left = ctx.map(&LEFT)?;
        let left = match side {
            Side::Left => left
                .get(&pk.to_owned())
                .map(|held| (pk.to_owned(), held.clone()))
                .into_iter()
                .collect(),
            Side::Right => left.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        };
        let right = ctx.map(&RIGHT)?;
        let right = right.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let clock = ctx.value(&CLOCK)?.get().copied().unwrap_or(0);
        let now = ctx.now_millis();
        let horizon = now - self.replays_within.as_millis() as i64;
        let mut stored = ctx.map(&GONE)?;
        let expired: Vec<String> = stored
            .iter()
            .filter(|(_, (_, at))| *at < horizon)
            .map(|(key, _)| key.clone())
            .collect();
        for key in &expired {
            stored.remove(key);
        }
        let gone: Gone = stored.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        Ok(Group {
            left,
            right,
            clock,
            gone,
            now,
        })
    }

    /// Stores what a step of `pk` of `side` changed in `group`; a group left empty keeps only the
    /// stamps of its deletes, until a later step finds them past the redelivery window or the
    /// window has passed since the last of them (`GONE`'s TTL).
    fn store(
        &self,
        ctx: &mut Ctx<'_>,
        group: &Group,
        side: Side,
        pk: &str,
    ) -> Result<(), ProcessError> {
        let (state, rows) = match side {
            Side::Left => (&LEFT, &group.left),
            Side::Right => (&RIGHT, &group.right),
        };
        let mut map = ctx.map(state)?;
        match rows.get(pk) {
            Some(held) => map.insert(pk.to_owned(), held.clone()),
            None => map.remove(&pk.to_owned()),
        };
        // `group` may hold only part of the left rows: the stored maps say whether any is left.
        let empty = ctx.map(&LEFT)?.is_empty() && ctx.map(&RIGHT)?.is_empty();
        let mut clock = ctx.value(&CLOCK)?;
        if empty {
            clock.clear();
        } else {
            clock.set(group.clock);
        }
        let mut gone = ctx.map(&GONE)?;
        match group.gone.get(&gone_key(side, pk)) {
            Some(stamp) => gone.insert(gone_key(side, pk), stamp.clone()),
            None => gone.remove(&gone_key(side, pk)),
        };
        Ok(())
    }
}

impl KeyedOperator for Join {
    type Input = Step;

    fn name(&self) -> &str {
        NAME
    }

    fn states(&self) -> Vec<StateDescriptor> {
        vec![
            LEFT.descriptor(),
            RIGHT.descriptor(),
            CLOCK.descriptor(),
            // Every stamp in it is of a delete before its last change: none is needed past the
            // window after that (the second covers the commit's clock counting whole seconds).
            // A group emptied of its rows then holds nothing, and its item goes.
            GONE.with_ttl(self.replays_within + Duration::from_secs(1))
                .descriptor(),
        ]
    }

    fn sinks(&self) -> Vec<SinkDescriptor> {
        vec![JOINED.descriptor(), VIEW.descriptor()]
    }

    fn decode(&self, record: &SourceRecord) -> Result<Step, InvalidInput> {
        let Payload::Bytes(data) = &record.payload else {
            return Err(InvalidInput::new("record", "expected a Kinesis record"));
        };
        serde_json::from_slice(data).map_err(|e| {
            InvalidInput::new(
                "data",
                format!("expected a changelog step (group, side, table, pk, stamp, op, row): {e}"),
            )
        })
    }

    fn key(&self, step: &Step) -> String {
        step.group.clone()
    }

    fn process(&self, ctx: &mut Ctx<'_>, step: Step) -> Result<(), ProcessError> {
        let mut group = self.load(ctx, step.side, &step.pk)?;
        let before = group.clock;
        let joined = group.apply(self.kind, step.side, &step.pk, step.stamp, step.change);
        if group.clock == before {
            // A duplicate, or a retraction of a row not held: nothing changed.
            return Ok(());
        }
        self.store(ctx, &group, step.side, &step.pk)?;
        for stamped in joined {
            let partition = stamped.change.row().left_pk.clone();
            ctx.emit(&JOINED, partition.clone(), &stamped)?;
            ctx.emit(&VIEW, partition, &stamped)?;
        }
        Ok(())
    }
}
