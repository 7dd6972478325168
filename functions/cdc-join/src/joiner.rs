//! The join as an operator: the changelog's steps, keyed by their group (the join key the re-key
//! put them under), applied to the rows of the group (`join::Group`); the joined changes go out
//! stamped to the joined changelog and to the view (`view_table`), which keeps each row's latest.
//!
//! Per group it keeps the rows of both sides, by primary key, and the group's count of steps:
//! nothing else, and nothing once the group's last row went (the state holds exactly the live
//! source rows). One writer per key (the changelog stream alone) and outputs computed from the
//! step and the group's rows: emit-then-commit (DESIGN §3).

use keyway::domain::{Payload, SourceRecord};
use keyway::operator::{SinkDescriptor, StateDescriptor};
use keyway::{Ctx, InvalidInput, KeyedOperator, MapState, ProcessError, Sink, ValueState};

use crate::join::{Group, Held, Stamped};
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

/// The joined changelog: each joined row inserted or deleted, with the pair that orders it.
pub const JOINED: Sink<Stamped> = Sink::new("joined");
/// The same changes, for the materialized view.
pub const VIEW: Sink<Stamped> = Sink::new("view");

/// The join of one spec's tables.
#[derive(Clone, Copy, Debug)]
pub struct Join {
    pub kind: JoinKind,
}

impl Join {
    /// What a step of `pk` of `side` needs of the group as stored: every right row (the rows a
    /// left row pairs with, and whether there is any), and of the left rows, that row alone for a
    /// left step, since a join key with many left rows (a user's many domains) must not copy
    /// them all for each change of one.
    fn load(ctx: &mut Ctx<'_>, side: Side, pk: &str) -> Result<Group, ProcessError> {
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
        Ok(Group { left, right, clock })
    }

    /// Stores what a step of `pk` of `side` changed in `group`; a group left empty keeps nothing.
    fn store(ctx: &mut Ctx<'_>, group: &Group, side: Side, pk: &str) -> Result<(), ProcessError> {
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
        Ok(())
    }
}

impl KeyedOperator for Join {
    type Input = Step;

    fn name(&self) -> &str {
        NAME
    }

    fn states(&self) -> Vec<StateDescriptor> {
        vec![LEFT.descriptor(), RIGHT.descriptor(), CLOCK.descriptor()]
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
        let mut group = Self::load(ctx, step.side, &step.pk)?;
        let before = group.clock;
        let joined = group.apply(self.kind, step.side, &step.pk, step.stamp, step.change);
        if group.clock == before {
            // A duplicate, or a retraction of a row not held: nothing changed.
            return Ok(());
        }
        Self::store(ctx, &group, step.side, &step.pk)?;
        for stamped in joined {
            let partition = stamped.change.row().left_pk.clone();
            ctx.emit(&JOINED, partition.clone(), &stamped)?;
            ctx.emit(&VIEW, partition, &stamped)?;
        }
        Ok(())
    }
}
