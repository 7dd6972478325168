//! The identity enricher: a keyed operator of two inputs, CloudTrail records (`EVENTS`, keyed by
//! `customer#accessKeyId` of their caller) and resolutions (`FEEDBACK`, keyed by
//! `customer#issuedAccessKeyId`), both keyed to the same partition of a key.
//!
//! Per key it keeps the identity behind the key once known, and the records that wait for it. A
//! record whose caller the record names, or whose key's identity is known, goes out enriched at
//! once; any other waits in its key's buffer. A resolution sets the key's identity and releases
//! the buffer. Every call that issues credentials publishes a resolution for the issued key to the
//! feedback stream, wherever that key's partition is: a chain resolves across partitions in any
//! arrival order. A record that waits longer than the buffer TTL goes out unresolved, with why,
//! when its key's timer fires, even if the key receives nothing more.
//!
//! Two streams write a key, and what a key emits depends on its buffer, which both change: the
//! outputs go out through the outbox, after the commit that decided them (DESIGN §3).

use std::time::Duration;

use keyway::domain::SourceRecord;
use keyway::operator::{timers, InputDescriptor, SinkDescriptor, StateDescriptor};
use keyway::{
    Ctx, Delivery, Input, InvalidInput, KeyedOperator, ListState, ProcessError, Sink, ValueState,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::cloudtrail::{Caller, CloudTrailRecord, Issued};
use crate::identity::{partition_key, CustomerMap, Identity, Resolution};

/// CloudTrail records, in either shape.
pub const EVENTS: Input<CloudTrailRecord> = Input::new("events", decode_record);
/// Resolutions the enricher published, read back.
pub const FEEDBACK: Input<Resolution> = Input::json("feedback");

/// Every input record, enriched.
pub const ENRICHED: Sink<Value> = Sink::new("enriched");
/// Resolutions of issued keys: the feedback stream.
pub const RESOLUTIONS: Sink<Resolution> = Sink::new("resolutions");

/// The identity behind the key, and until when it holds.
pub const IDENTITY: ValueState<Known> = ValueState::new("identity");
/// Records waiting for the key's identity, oldest first. A record is JSON of any shape, which no
/// type describes: the shape stands for it, and changes with `Waiting`.
pub const BUFFER: ListState<Waiting> = ListState::with_shape(
    "buffer",
    "Waiting { record: CloudTrail record as JSON, since: i64 }",
);

/// A key's identity, as long as its credentials last.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Known {
    pub identity: Identity,
    /// Epoch milliseconds after which the identity no longer applies (the credentials'
    /// expiration plus the grace period); `None` when the issuing call did not say.
    pub until: Option<i64>,
}

/// A record waiting for its caller's identity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waiting {
    pub record: Value,
    /// When it started waiting (epoch milliseconds).
    pub since: i64,
}

/// What the enricher takes in.
pub enum Enrich {
    Event(Box<CloudTrailRecord>),
    Resolved(Resolution),
}

/// Settings of the enricher.
#[derive(Clone, Debug)]
pub struct EnricherConfig {
    pub customers: CustomerMap,
    /// How long a record waits for its caller's identity before it goes out unresolved.
    pub buffer_ttl: Duration,
    /// How long an identity outlives its credentials' expiration: records are delivered late.
    pub grace: Duration,
    /// The longest role chain followed: a key issued beyond it gets no resolution, and its records
    /// go out unresolved after the buffer TTL.
    pub max_chain_depth: usize,
    /// The most records a key keeps waiting: a key whose resolution never comes must not grow
    /// its state (and the release that would follow) without bound. Records beyond it go out
    /// unresolved at once.
    pub max_buffered: usize,
}

impl Default for EnricherConfig {
    fn default() -> Self {
        Self {
            customers: CustomerMap::default(),
            buffer_ttl: Duration::from_secs(15 * 60),
            grace: Duration::from_secs(15 * 60),
            max_chain_depth: 10,
            max_buffered: 10_000,
        }
    }
}

/// Why a record went out unresolved.
pub mod reason {
    pub const BUFFER_TTL: &str =
        "no resolution of the caller's access key arrived within the buffer TTL";
    pub const BUFFER_FULL: &str =
        "the caller's access key already has the most records a key keeps waiting";
}

pub struct IdentityEnricher {
    config: EnricherConfig,
}

impl IdentityEnricher {
    pub fn new(config: EnricherConfig) -> Self {
        Self { config }
    }

    fn customer_of<'a>(&'a self, record: &'a CloudTrailRecord) -> &'a str {
        self.config.customers.customer_of(&record.account)
    }

    /// Emits `record` enriched with `identity`, and publishes the resolution of what it issued.
    fn resolved(
        &self,
        ctx: &mut Ctx<'_>,
        record: &CloudTrailRecord,
        identity: &Identity,
    ) -> Result<(), ProcessError> {
        if let Some(issued) = &record.issued {
            self.publish(ctx, record, identity, issued)?;
        }
        self.emit(ctx, record.record.clone(), enrichment(identity))
    }

    /// The resolution of a key `record` issued, unless it would close a cycle, make the chain
    /// longer than the maximum depth, or the record is the other account's copy of a
    /// cross-account call (its caller's account publishes it). The records of a key left without
    /// a resolution go out unresolved after the buffer TTL.
    fn publish(
        &self,
        ctx: &mut Ctx<'_>,
        record: &CloudTrailRecord,
        identity: &Identity,
        issued: &Issued,
    ) -> Result<(), ProcessError> {
        let copy = matches!(&record.caller, Caller::Identified(a) if a.kind == "AWSAccount");
        let caller_key = record.record["userIdentity"]["accessKeyId"].as_str();
        let cycle = identity.holds_key(&issued.access_key_id)
            || caller_key == Some(issued.access_key_id.as_str());
        let too_deep = identity.role_chain.len() >= self.config.max_chain_depth;
        if copy || cycle || too_deep {
            return Ok(());
        }
        let next = identity.extended(issued.link.clone());
        // The issued key is used in the account of the role it belongs to.
        let account = issued
            .link
            .as_ref()
            .and_then(|l| l.role_arn.split(':').nth(4))
            .filter(|a| !a.is_empty())
            .unwrap_or(&record.account);
        let resolution = Resolution {
            customer: self.config.customers.customer_of(account).to_owned(),
            access_key_id: issued.access_key_id.clone(),
            original_actor: next.original_actor,
            role_chain: next.role_chain,
            expiration: issued.expiration,
        };
        let key = resolution.partition_key();
        ctx.emit(&RESOLUTIONS, key, &resolution)
    }

    fn emit(
        &self,
        ctx: &mut Ctx<'_>,
        mut record: Value,
        enrichment: Value,
    ) -> Result<(), ProcessError> {
        let key = ctx.key().to_owned();
        record["enrichment"] = enrichment;
        ctx.emit(&ENRICHED, key, &record)
    }

    /// The key's identity, if known and not expired.
    fn known(&self, ctx: &mut Ctx<'_>) -> Result<Option<Identity>, ProcessError> {
        let now = ctx.now_millis();
        let mut state = ctx.value(&IDENTITY)?;
        match state.get() {
            Some(known) if known.until.is_none_or(|until| now <= until) => {
                Ok(Some(known.identity.clone()))
            }
            Some(_) => {
                state.clear();
                Ok(None)
            }
            None => Ok(None),
        }
    }

    fn event(&self, ctx: &mut Ctx<'_>, record: CloudTrailRecord) -> Result<(), ProcessError> {
        let identity = match &record.caller {
            Caller::Identified(actor) => Identity::of(actor.clone()),
            Caller::Untraceable { reason } => {
                return self.emit(ctx, record.record, unresolved(reason))
            }
            Caller::Session { .. } => match self.known(ctx)? {
                Some(identity) => identity,
                None => return self.wait(ctx, record),
            },
        };
        self.resolved(ctx, &record, &identity)
    }

    /// Buffers `record` until its key's identity comes, and makes sure a timer will release it.
    fn wait(&self, ctx: &mut Ctx<'_>, record: CloudTrailRecord) -> Result<(), ProcessError> {
        let since = ctx.now_millis();
        let mut buffer = ctx.list(&BUFFER)?;
        if buffer.len() >= self.config.max_buffered {
            return self.emit(ctx, record.record, unresolved(reason::BUFFER_FULL));
        }
        let first = buffer.is_empty();
        buffer.push(Waiting {
            record: record.record,
            since,
        });
        if first {
            ctx.timer_at(since + self.config.buffer_ttl.as_millis() as i64)?;
        }
        Ok(())
    }

    fn resolution(&self, ctx: &mut Ctx<'_>, resolution: Resolution) -> Result<(), ProcessError> {
        let grace = self.config.grace.as_millis() as i64;
        let identity = resolution.identity();
        ctx.value(&IDENTITY)?.set(Known {
            identity: identity.clone(),
            until: resolution.expiration.map(|at| at + grace),
        });
        let waiting = ctx.list(&BUFFER)?.take()?;
        for at in ctx.pending_timers()? {
            ctx.cancel_timer(at)?;
        }
        for Waiting { record, .. } in waiting {
            // Buffered records read before: they read again.
            let record = CloudTrailRecord::parse(record).map_err(ProcessError::from)?;
            self.resolved(ctx, &record, &identity)?;
        }
        Ok(())
    }
}

impl KeyedOperator for IdentityEnricher {
    type Input = Enrich;

    fn name(&self) -> &str {
        "identity-enricher"
    }

    fn states(&self) -> Vec<StateDescriptor> {
        vec![IDENTITY.descriptor(), BUFFER.descriptor(), timers()]
    }

    fn inputs(&self) -> Vec<InputDescriptor> {
        vec![EVENTS.descriptor(), FEEDBACK.descriptor()]
    }

    fn sinks(&self) -> Vec<SinkDescriptor> {
        vec![ENRICHED.descriptor(), RESOLUTIONS.descriptor()]
    }

    fn delivery(&self) -> Delivery {
        Delivery::Outbox
    }

    fn decode(&self, record: &SourceRecord) -> Result<Enrich, InvalidInput> {
        record
            .route()
            .input(&EVENTS, |r| Enrich::Event(Box::new(r)))
            .input(&FEEDBACK, Enrich::Resolved)
            .done()
    }

    fn key(&self, input: &Enrich) -> String {
        match input {
            Enrich::Event(record) => partition_key(self.customer_of(record), record.caller_key()),
            Enrich::Resolved(resolution) => resolution.partition_key(),
        }
    }

    fn process(&self, ctx: &mut Ctx<'_>, input: Enrich) -> Result<(), ProcessError> {
        match input {
            Enrich::Event(record) => self.event(ctx, *record),
            Enrich::Resolved(resolution) => self.resolution(ctx, resolution),
        }
    }

    /// Records that waited longer than the buffer TTL go out unresolved; the timer comes back for
    /// the next one due.
    fn on_timer(&self, ctx: &mut Ctx<'_>, _at_millis: i64) -> Result<(), ProcessError> {
        let ttl = self.config.buffer_ttl.as_millis() as i64;
        let now = ctx.now_millis();
        let waiting = ctx.list(&BUFFER)?.take()?;
        let (due, left): (Vec<Waiting>, Vec<Waiting>) =
            waiting.into_iter().partition(|w| w.since + ttl <= now);
        if let Some(next) = left.first() {
            ctx.timer_at(next.since + ttl)?;
        }
        let mut buffer = ctx.list(&BUFFER)?;
        left.into_iter().for_each(|w| buffer.push(w));
        for Waiting { record, .. } in due {
            self.emit(ctx, record, unresolved(reason::BUFFER_TTL))?;
        }
        Ok(())
    }
}

/// Reads an events record: its data is a CloudTrail record, in either shape.
fn decode_record(record: &SourceRecord) -> Result<CloudTrailRecord, InvalidInput> {
    CloudTrailRecord::parse(record.json::<Value>()?)
}

fn enrichment(identity: &Identity) -> Value {
    serde_json::json!({
        "status": "resolved",
        "originalActor": identity.original_actor,
        "roleChain": identity.role_chain,
    })
}

fn unresolved(reason: &str) -> Value {
    serde_json::json!({ "status": "unresolved", "reason": reason })
}
