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
//! Two streams write a key, and what a key emits for a record that waited depends on its buffer,
//! which both change, and on whether its resolution or its timer came first: those outputs go out
//! through the outbox, after the commit that decided them (DESIGN §3). A record that goes out at
//! once is decided by itself and its key's identity, which never changes once written: its
//! outputs are settled, sent before the commit and never stored, which saves a write of every
//! output.
//!
//! For the same reason the enricher keeps in memory, for a while (`Remembered`), the identities
//! it read of keys with nothing waiting: a key's next records, whose callers it identifies
//! from the record or from memory, are answered without reading the key's state
//! (`answer_without_state`), which saves a read of the key a batch. Function instances live
//! across invocations, and the mapping gives a key's records to the same lane every time. Only
//! records that arrived after the identity was read are answered from memory: an earlier one
//! may have been applied already (it waited, and its timer sent it out unresolved), which only
//! its key's watermark knows.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use keyway::domain::{Origin, OutputId, SequenceNumber, SourceRecord};
use keyway::operator::{
    stored_bytes, stored_json_bytes, timers, InputDescriptor, SinkDescriptor, StateDescriptor,
};
use keyway::{
    Ctx, Delivery, Input, InvalidInput, KeyedOperator, ListState, ProcessError, Sink, ValueState,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::cloudtrail::{Caller, CloudTrailRecord, Issued};
use crate::identity::{CustomerMap, Identity, Resolution};

/// The operator's name: part of its state keys and output ids.
pub const NAME: &str = "identity-enricher";

/// CloudTrail records, in either shape.
pub const EVENTS: Input<CloudTrailRecord> = Input::new("events", decode_record);
/// Resolutions the enricher published, read back.
pub const FEEDBACK: Input<Resolution> = Input::json("feedback");

/// Every input record, enriched.
pub const ENRICHED: Sink<Value> = Sink::new("enriched");
/// Resolutions of issued keys: the feedback stream.
pub const RESOLUTIONS: Sink<Resolution> = Sink::new("resolutions");

/// How long past its time a pending timer of a key's buffer is trusted to fire: sweeps run every
/// minute, and retry a firing they could not settle a minute later.
const STALE_TIMER: Duration = Duration::from_secs(15 * 60);

/// The longest any credentials last: GetFederationToken's and GetSessionToken's 36 hours.
const CREDENTIALS_AT_MOST: Duration = Duration::from_secs(36 * 3600);

/// The identity behind the key, and until when it holds. Whether it applies to a record is the
/// record's own time's to say (a trail replayed later still resolves). An identity whose
/// credentials' expiration is known is kept until then (or from its arrival, for a trail
/// replayed later) plus the lateness, so that no record of the credentials' life, nor any retry
/// of one that found it, finds it gone (what it sent at once, settled, could not change). One
/// without goes after three days: longer than any credentials last (36 hours,
/// GetFederationToken) plus the grace and the lateness.
pub const IDENTITY: ValueState<Known> =
    ValueState::new("identity").with_ttl(Duration::from_secs(72 * 3600));
/// Samples of a key's head as the store writes it, newest first: preset dictionaries its state
/// is deflated with (`KeyedOperator::state_dictionaries`). A head of two or three buffered
/// records, deflated alone, spends much of its bytes on CloudTrail's field names, and crosses a
/// KB, a second write unit. The sample is a head holding one buffered record (an assumed role's
/// call, in CloudTrail's documented shape, with example values), an identity and an outbox of a
/// resolution and an enriched record. Never edit it: add a new one in front.
pub const STATE_DICTIONARIES: &[&str] = &[include_str!("state-dictionary.json")];

/// Records waiting for the key's identity, oldest first. A record is JSON of any shape, which no
/// type describes: the shape stands for it, and changes with `Waiting`.
pub const BUFFER: ListState<Waiting> = ListState::with_shape(
    "buffer",
    "Waiting { record: CloudTrail record as JSON, since: i64, at: Position { origin: Origin, sequence: SequenceNumber } }",
);

/// A key's identity, as long as its credentials last.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Known {
    /// The original actor behind the key, and the roles between them.
    pub identity: Identity,
    /// Epoch milliseconds after which the identity no longer applies (the credentials'
    /// expiration plus the grace period); `None` when the issuing call did not say.
    pub until: Option<i64>,
}

/// A record waiting for its caller's identity.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Waiting {
    /// The CloudTrail record as delivered.
    pub record: Value,
    /// When it started waiting (epoch milliseconds).
    pub since: i64,
    /// Where it was read.
    pub at: Position,
}

/// Where a record's outputs' ids derive from: a record goes out under one id whether it goes out
/// at once, released by a resolution, or unresolved by its timer. That is its CloudTrail event
/// (the account it was delivered to and its `eventID`), so that an event CloudTrail delivers
/// twice, at two positions of the stream, goes out twice under one id; or, for a record without
/// an `eventID` (or with one longer than CloudTrail's), the position it was read at.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Position {
    /// The lineage the record was read from (its shard, or shard and partition key), or its
    /// event (`event#`, the account's length, the account, `#`, the event's id).
    pub origin: Origin,
    /// The record's sequence number in its lineage; 0 for an event.
    pub sequence: SequenceNumber,
}

/// The longest account or `eventID` an output's id derives from: CloudTrail's are 12 and 36
/// characters; a longer one is not CloudTrail's, and would be stored with each waiting record.
const EVENT_ID_AT_MOST: usize = 64;

/// The id `record`, read at `sequence` of `origin`, goes out under on the enriched stream; for
/// what is no CloudTrail record (`None`: dead-lettered), the id of where it was read.
pub fn enriched_id(
    record: Option<&CloudTrailRecord>,
    origin: &Origin,
    sequence: &SequenceNumber,
) -> OutputId {
    let at = Position::read(origin, sequence, record);
    OutputId::derive(NAME, ENRICHED.name, &at.origin, &at.sequence, 0)
}

impl Position {
    fn of(source: &SourceRecord, record: &CloudTrailRecord) -> Self {
        Self::read(&source.origin, &source.sequence, Some(record))
    }

    fn read(origin: &Origin, sequence: &SequenceNumber, record: Option<&CloudTrailRecord>) -> Self {
        let short = |text: &str| !text.is_empty() && text.len() <= EVENT_ID_AT_MOST;
        let event = record.and_then(|r| Some((r.event_id.as_deref()?, r.account.as_str())));
        match event {
            Some((id, account)) if short(id) && short(account) => Self {
                origin: Origin(format!("event#{}#{account}#{id}", account.len())),
                sequence: SequenceNumber::parse("0").expect("0 is a sequence number"),
            },
            _ => Self {
                origin: origin.clone(),
                sequence: sequence.clone(),
            },
        }
    }

    fn parts(&self) -> (&Origin, &SequenceNumber) {
        (&self.origin, &self.sequence)
    }
}

/// What the enricher takes in.
pub enum Enrich {
    /// An event, and the identity of its caller's key if the enricher remembers it
    /// (`answer_without_state` sets it): then it is answered without the key's state.
    Event(Box<CloudTrailRecord>, Option<Identity>),
    /// A resolution read back from the feedback stream: the identity behind an issued key.
    Resolved(Box<Resolution>),
}

/// How many keys' identities an instance remembers; past it, it forgets them all and starts
/// again (a few hundred bytes a key: tens of MB at most).
const REMEMBERED_KEYS: usize = 100_000;
/// How long after an identity was read a record must have arrived to be answered from memory:
/// more than the clocks of Kinesis and Lambda can differ by.
const ARRIVED_AFTER_READ: i64 = 5_000;
/// How long an identity is remembered after it was read, at most: a record answered from
/// memory and redelivered later reads the key's state, which must still give the same answer;
/// the state keeps an identity for as long as records of its credentials can come (the
/// lateness), so this stays well within it.
const REMEMBERED_AT_MOST: Duration = Duration::from_secs(15 * 60);

/// A key's identity, as read from its state, and until when it may be answered from memory.
#[derive(Clone, Debug)]
struct Remembered {
    known: Known,
    /// When it was read: the invocation's time (epoch milliseconds).
    read_at: i64,
    /// Epoch milliseconds: `REMEMBERED_AT_MOST` after it was read (a quarter of the lateness if
    /// shorter), and never past the time the state would drop it.
    until: i64,
}

/// Settings of the enricher.
#[derive(Clone, Debug)]
pub struct EnricherConfig {
    /// Which accounts belong to which customer: the partitions a chain's records and resolutions
    /// share.
    pub customers: CustomerMap,
    /// How long a record waits for its caller's identity before it goes out unresolved.
    pub buffer_ttl: Duration,
    /// How long an identity outlives its credentials' expiration: records are delivered late.
    pub grace: Duration,
    /// The most roles a chain is followed through. A key issued past it is resolved to the chain
    /// cut at its first role beyond the limit, and its records (and those of every key issued
    /// further down) go out at once, unresolved, saying so (`reason::DEPTH_LIMIT`), with the
    /// original actor and that chain: a key's state stays bounded however deep a chain goes.
    pub max_chain_depth: usize,
    /// The most records a key keeps waiting: a key whose resolution never comes must not grow
    /// its state (and the release that would follow) without bound. Records beyond it go out
    /// unresolved at once.
    pub max_buffered: usize,
    /// How late a record can still arrive after its time, redeliveries included: the streams'
    /// retention and CloudTrail's delivery. A key's state is kept that long past its last change,
    /// an identity that long past its expiration; then the key's items go.
    pub lateness: Duration,
}

impl Default for EnricherConfig {
    fn default() -> Self {
        Self {
            customers: CustomerMap::default(),
            buffer_ttl: Duration::from_secs(15 * 60),
            grace: Duration::from_secs(15 * 60),
            max_chain_depth: 10,
            max_buffered: 10_000,
            lateness: Duration::from_secs(24 * 3600),
        }
    }
}

/// What decided a record's outputs, and so how they go out. `ByFacts`: the record itself and its
/// key's identity, which never changes once written; any retry, on any state, sends the same
/// body or nothing, so they are sent settled, before the commit, and never stored. `ByState`:
/// what waits in the buffer and whether a resolution or the timer came first, which a commit race
/// can change; they go through the outbox, sent only once committed (DESIGN §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Decided {
    ByFacts,
    ByState,
}

/// Why a record went out unresolved.
pub mod reason {
    /// The record waited the buffer TTL and no resolution of its caller's key came.
    pub const BUFFER_TTL: &str =
        "no resolution of the caller's access key arrived within the buffer TTL";
    /// The key's buffer already held `EnricherConfig::max_buffered` records when it came.
    pub const BUFFER_FULL: &str =
        "the caller's access key already has the most records a key keeps waiting";
    /// The caller's role chain is longer than `EnricherConfig::max_chain_depth` roles.
    pub const DEPTH_LIMIT: &str =
        "the role chain is deeper than the most roles followed (MAX_CHAIN_DEPTH, depthLimit)";
    /// The record with its caller's identity is more than the enriched sink takes.
    pub const TOO_LARGE: &str =
        "the record with its caller's identity is more than the enriched sink takes";
    /// The reasons a record that waited may go out unresolved with: a record waits only if it
    /// fits the enriched sink with the longest.
    pub(crate) const ON_RELEASE: [&str; 2] = [BUFFER_TTL, TOO_LARGE];
}

/// The enricher operator: gives each CloudTrail record its caller's original actor and role chain,
/// keyed by the caller's access key.
pub struct IdentityEnricher {
    config: EnricherConfig,
    /// Identities of keys with nothing waiting, by key, as last read.
    remembered: Mutex<HashMap<String, Remembered>>,
}

impl IdentityEnricher {
    /// An enricher with `config` that remembers no identity yet.
    pub fn new(config: EnricherConfig) -> Self {
        Self {
            config,
            remembered: Mutex::new(HashMap::new()),
        }
    }

    /// How long an identity is remembered: a quarter of the lateness, 15 minutes at most.
    fn remembered_for(&self) -> i64 {
        (self.config.lateness / 4)
            .min(REMEMBERED_AT_MOST)
            .as_millis() as i64
    }

    /// The identity remembered of `key` that applies to a record of `time` that arrived at
    /// `arrived`, at `now`: only one that arrived after the identity was read, and so was not
    /// applied before it (an earlier one may have waited, which only the key's state knows).
    fn recall(&self, key: &str, time: i64, arrived: i64, now: i64) -> Option<Identity> {
        let remembered = self.remembered.lock().expect("the remembered identities");
        let entry = remembered.get(key)?;
        let applies = entry.known.until.is_none_or(|until| time <= until);
        let after_read = arrived > entry.read_at + ARRIVED_AFTER_READ;
        (now < entry.until && applies && after_read).then(|| entry.known.identity.clone())
    }

    /// Remembers `known`, just read of `key` at `now`, until `gone` at the latest (when the
    /// key's state drops it).
    fn remember(&self, key: &str, known: &Known, now: i64, gone: Option<i64>) {
        let until = (now + self.remembered_for()).min(gone.unwrap_or(i64::MAX));
        let mut remembered = self.remembered.lock().expect("the remembered identities");
        if remembered.len() >= REMEMBERED_KEYS && !remembered.contains_key(key) {
            remembered.clear();
        }
        remembered.insert(
            key.to_owned(),
            Remembered {
                known: known.clone(),
                read_at: now,
                until,
            },
        );
    }

    /// Emits `record` (read at `at`) enriched with `identity`, and publishes the resolution of
    /// what it issued.
    fn resolved(
        &self,
        ctx: &mut Ctx<'_>,
        record: CloudTrailRecord,
        at: &Position,
        identity: &Identity,
        decided: Decided,
    ) -> Result<(), ProcessError> {
        if let Some(issued) = &record.issued {
            self.publish(ctx, &record, at, identity, issued, decided)?;
        }
        let enrichment = if self.beyond_limit(identity) {
            let mut beyond = enrichment(identity);
            beyond["status"] = "unresolved".into();
            beyond["reason"] = reason::DEPTH_LIMIT.into();
            beyond["depthLimit"] = self.config.max_chain_depth.into();
            beyond
        } else {
            enrichment(identity)
        };
        self.emit(ctx, at, record.record, enrichment, decided)
    }

    /// Whether `identity`'s chain went past the depth limit: it then holds one role more than
    /// the limit, the first beyond it.
    fn beyond_limit(&self, identity: &Identity) -> bool {
        identity.role_chain.len() > self.config.max_chain_depth
    }

    /// The resolution of a key `record` issued, unless it would close a cycle or the record is
    /// the other account's copy of a cross-account call (its caller's account publishes it). The
    /// records of a key left without a resolution go out unresolved after the buffer TTL. Past
    /// the depth limit the chain grows no longer (see `EnricherConfig::max_chain_depth`).
    fn publish(
        &self,
        ctx: &mut Ctx<'_>,
        record: &CloudTrailRecord,
        at: &Position,
        identity: &Identity,
        issued: &Issued,
        decided: Decided,
    ) -> Result<(), ProcessError> {
        let copy = matches!(&record.caller, Caller::Identified(a) if a.kind == "AWSAccount");
        let caller_key = record.record["userIdentity"]["accessKeyId"].as_str();
        let cycle = identity.holds_key(&issued.access_key_id)
            || caller_key == Some(issued.access_key_id.as_str());
        if copy || cycle {
            return Ok(());
        }
        let next = if self.beyond_limit(identity) {
            identity.clone()
        } else {
            identity.extended(issued.link.clone())
        };
        // The issued key is used in the account of the role it belongs to.
        let account = issued
            .link
            .as_ref()
            .and_then(|l| l.role_arn.split(':').nth(4))
            .filter(|a| !a.is_empty())
            .unwrap_or(&record.account);
        let resolution = Resolution {
            customer: self.config.customers.customer_of(account).to_owned(),
            account: Some(account.to_owned()),
            access_key_id: issued.access_key_id.clone(),
            original_actor: next.original_actor,
            role_chain: next.role_chain,
            expiration: issued.expiration,
        };
        let key = resolution.partition_key();
        match decided {
            Decided::ByFacts => ctx.emit_settled_for(&RESOLUTIONS, at.parts(), 0, key, &resolution),
            Decided::ByState => ctx.emit_for(&RESOLUTIONS, at.parts(), 0, key, &resolution),
        }
    }

    /// Emits `record` (read at `at`) with its enrichment, which carries the output's id: a
    /// Kinesis consumer has nowhere else to find it.
    fn emit(
        &self,
        ctx: &mut Ctx<'_>,
        at: &Position,
        mut record: Value,
        mut enrichment: Value,
        decided: Decided,
    ) -> Result<(), ProcessError> {
        let key = ctx.key().to_owned();
        let (origin, sequence) = at.parts();
        enrichment["outputId"] = ctx
            .output_id_for(&ENRICHED, origin, sequence, 0)
            .as_str()
            .into();
        // Resolved, or cut at the depth limit: either carries the identity's role chain.
        let identified = enrichment.get("roleChain").is_some();
        record["enrichment"] = enrichment;
        let emitted = match decided {
            Decided::ByFacts => ctx.emit_settled_for(&ENRICHED, at.parts(), 0, &key, &record),
            Decided::ByState => ctx.emit_for(&ENRICHED, at.parts(), 0, &key, &record),
        };
        match emitted {
            // Too large with its identity (a role chain of long names): it goes out unresolved
            // without it, which a record that waited was checked to fit (`wait`).
            Err(ProcessError::Invalid(_)) if identified => {
                let mut fallback = unresolved_session(reason::TOO_LARGE, &record);
                fallback["outputId"] = record["enrichment"]["outputId"].take();
                record["enrichment"] = fallback;
                match decided {
                    Decided::ByFacts => {
                        ctx.emit_settled_for(&ENRICHED, at.parts(), 0, key, &record)
                    }
                    Decided::ByState => ctx.emit_for(&ENRICHED, at.parts(), 0, key, &record),
                }
            }
            emitted => emitted,
        }
    }

    /// The key's identity, if known and not expired at `at` (a record's time). An identity read
    /// of a key with nothing waiting, and no outbox still to go out, is remembered.
    fn known(&self, ctx: &mut Ctx<'_>, at: i64) -> Result<Option<Identity>, ProcessError> {
        let Some(known) = ctx.value(&IDENTITY)?.get().cloned() else {
            return Ok(None);
        };
        if !ctx.outbox_pending() && ctx.list(&BUFFER)?.is_empty() {
            let (key, now) = (ctx.key().to_owned(), ctx.now_millis());
            self.remember(&key, &known, now, ctx.loaded_expiry(IDENTITY.name));
        }
        Ok(known
            .until
            .is_none_or(|until| at <= until)
            .then_some(known.identity))
    }

    fn event(&self, ctx: &mut Ctx<'_>, record: CloudTrailRecord) -> Result<(), ProcessError> {
        let at = Position::of(ctx.record(), &record);
        let identity = match &record.caller {
            Caller::Identified(actor) => Identity::of(actor.clone()),
            Caller::Untraceable { reason } => {
                let enrichment = unresolved(reason);
                return self.emit(ctx, &at, record.record, enrichment, Decided::ByFacts);
            }
            Caller::Session { .. } => match self.known(ctx, record_time(ctx, &record))? {
                Some(identity) => identity,
                None => return self.wait(ctx, record, at),
            },
        };
        self.resolved(ctx, record, &at, &identity, Decided::ByFacts)
    }

    /// Buffers `record` until its key's identity comes, and makes sure a timer will release it.
    fn wait(
        &self,
        ctx: &mut Ctx<'_>,
        record: CloudTrailRecord,
        at: Position,
    ) -> Result<(), ProcessError> {
        let since = ctx.now_millis();
        if ctx.list(&BUFFER)?.len() >= self.config.max_buffered {
            let enrichment = unresolved_session(reason::BUFFER_FULL, &record.record);
            return self.emit(ctx, &at, record.record, enrichment, Decided::ByState);
        }
        // Refused now, while the stream still holds it: released later, a record too large to go
        // out would stop every other one waiting with it.
        let released = released_bytes(ctx, &at, &record.record);
        let limit = ctx.output_limit(&ENRICHED);
        if released > limit {
            return Err(ProcessError::Invalid(InvalidInput::new(
                "record",
                format!(
                    "{released} bytes with the enrichment it would go out with unresolved, more \
                     than the enriched sink takes ({limit} bytes): too large to wait for its \
                     caller's identity"
                ),
            )));
        }
        // Set whenever none is pending but one long past due, not only for a first record: a
        // firing dead-lettered before its timer was taken with it left a timer that no sweep
        // finds. A second firing finds nothing due and sets the next.
        let stale = since - STALE_TIMER.as_millis() as i64;
        let timed = ctx.pending_timers()?.iter().any(|&at| at >= stale);
        ctx.list(&BUFFER)?.push(Waiting {
            record: record.record,
            since,
            at,
        });
        if !timed {
            ctx.timer_at(since + self.config.buffer_ttl.as_millis() as i64)?;
        }
        Ok(())
    }

    fn resolution(&self, ctx: &mut Ctx<'_>, resolution: Resolution) -> Result<(), ProcessError> {
        let grace = self.config.grace.as_millis() as i64;
        let identity = resolution.identity();
        // An access key is issued once: a second resolution naming another identity is forged or
        // broken, and must not take the key's records from the first (nor change what records
        // answered from it, sent at once and settled, would be sent as on a retry).
        if let Some(first) = ctx.value(&IDENTITY)?.get() {
            if first.identity != identity {
                return Err(ProcessError::Invalid(InvalidInput::new(
                    "accessKeyId",
                    format!(
                        "{} is resolved already, to another identity (original actor {}): an \
                         access key is issued once",
                        resolution.access_key_id,
                        first
                            .identity
                            .original_actor
                            .arn
                            .as_deref()
                            .unwrap_or("none named")
                    ),
                )));
            }
        }
        let known = Known {
            identity: identity.clone(),
            until: resolution.expiration.map(|at| at.saturating_add(grace)),
        };
        let lateness = self.config.lateness.as_millis() as i64;
        let now = ctx.now_millis();
        // No credentials outlive 36 hours: an expiration further off (a forged one) keeps the
        // key's state no longer than the longest real one would.
        let longest = now
            .saturating_add(CREDENTIALS_AT_MOST.as_millis() as i64)
            .saturating_add(grace)
            .saturating_add(lateness);
        match known.until {
            Some(until) => ctx
                .value(&IDENTITY)?
                .set_expiring(known, until.max(now).saturating_add(lateness).min(longest)),
            None => ctx.value(&IDENTITY)?.set(known),
        }
        let waiting = ctx.list(&BUFFER)?.take()?;
        for at in ctx.pending_timers()? {
            ctx.cancel_timer(at)?;
        }
        for Waiting { record, at, .. } in waiting {
            // Buffered records read before: they read again.
            let record = CloudTrailRecord::parse(record).map_err(ProcessError::from)?;
            self.resolved(ctx, record, &at, &identity, Decided::ByState)?;
        }
        Ok(())
    }
}

impl KeyedOperator for IdentityEnricher {
    type Input = Enrich;

    fn name(&self) -> &str {
        NAME
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

    /// A key nobody uses any more goes, watermarks and all, once no record can come late.
    fn state_ttl(&self) -> Option<Duration> {
        Some(self.config.lateness)
    }

    fn state_dictionaries(&self) -> &'static [&'static str] {
        STATE_DICTIONARIES
    }

    fn decode(&self, record: &SourceRecord) -> Result<Enrich, InvalidInput> {
        record
            .route()
            .input(&EVENTS, |r| Enrich::Event(Box::new(r), None))
            .input(&FEEDBACK, |r| Enrich::Resolved(Box::new(r)))
            .done()
    }

    fn key(&self, input: &Enrich) -> String {
        match input {
            Enrich::Event(record, _) => record.partition_key(&self.config.customers),
            Enrich::Resolved(resolution) => resolution.key(&self.config.customers),
        }
    }

    fn process(&self, ctx: &mut Ctx<'_>, input: Enrich) -> Result<(), ProcessError> {
        match input {
            Enrich::Event(record, None) => self.event(ctx, *record),
            Enrich::Event(record, Some(identity)) => {
                let at = Position::of(ctx.record(), &record);
                self.resolved(ctx, *record, &at, &identity, Decided::ByFacts)
            }
            Enrich::Resolved(resolution) => self.resolution(ctx, *resolution),
        }
    }

    /// An event whose caller the record identifies (or that no one could trace), or whose
    /// caller's key has its identity remembered, applying at the record's time, and the record
    /// arrived after it was read: nothing of the key's state decides it, however often it runs.
    fn answer_without_state(
        &self,
        key: &str,
        source: &SourceRecord,
        input: &mut Enrich,
        now_millis: i64,
    ) -> bool {
        let Enrich::Event(record, remembered) = input else {
            return false;
        };
        if remembered.is_some() || !matches!(record.caller, Caller::Session { .. }) {
            return true;
        }
        *remembered = match (record.event_time, source.arrival_millis) {
            (Some(time), Some(arrived)) => self.recall(key, time, arrived, now_millis),
            _ => None,
        };
        remembered.is_some()
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
        for Waiting { record, at, .. } in due {
            let enrichment = unresolved_session(reason::BUFFER_TTL, &record);
            self.emit(ctx, &at, record, enrichment, Decided::ByState)?;
        }
        Ok(())
    }
}

/// The most bytes `record`, read at `at`, can take going out after waiting, as the outbox stores
/// it (`keyway::operator::stored_bytes`): with the longest of the unresolved enrichments a
/// release gives (it copies the record's session names, however long).
fn released_bytes(ctx: &Ctx<'_>, at: &Position, record: &Value) -> usize {
    let longest = reason::ON_RELEASE
        .into_iter()
        .max_by_key(|r| r.len())
        .unwrap_or(reason::BUFFER_TTL);
    let mut enrichment = unresolved_session(longest, record);
    let (origin, sequence) = at.parts();
    enrichment["outputId"] = ctx
        .output_id_for(&ENRICHED, origin, sequence, 0)
        .as_str()
        .into();
    // Counted, not written: the record, and the enrichment added to it as one more field.
    let field = stored_bytes(r#","enrichment":"#);
    stored_json_bytes(record)
        .saturating_add(field)
        .saturating_add(stored_json_bytes(&enrichment))
}

/// When `record` happened: its event time, or for a record without one its arrival in the
/// stream, which every retry reads the same (the clock does not: a retry past the identity's
/// expiration would send the record, already sent resolved, unresolved under the same id).
fn record_time(ctx: &Ctx<'_>, record: &CloudTrailRecord) -> i64 {
    record
        .event_time
        .or(ctx.record().arrival_millis)
        .unwrap_or_else(|| ctx.now_millis())
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

/// An unresolved session's enrichment, with the fallback the record itself gives: the session
/// (`userIdentity.arn`) and the role or user that issued it (`sessionContext.sessionIssuer`).
/// Console sessions and credentials from Identity Center's portal carry keys that no logged
/// response issued: for them this is as far as the trail leads.
fn unresolved_session(reason: &str, record: &Value) -> Value {
    let mut enrichment = unresolved(reason);
    let identity = &record["userIdentity"];
    if let Some(arn) = identity["arn"].as_str() {
        enrichment["sessionArn"] = arn.into();
    }
    if let Some(issuer) = identity["sessionContext"]["sessionIssuer"]["arn"].as_str() {
        enrichment["sessionIssuerArn"] = issuer.into();
    }
    enrichment
}
