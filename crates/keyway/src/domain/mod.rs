//! The domain model: records, sequence numbers, keys, outputs, keyed state and the batch plan.
//!
//! Everything here is pure: no AWS types, no I/O. Sources turn Lambda payloads into these types,
//! adapters turn them into DynamoDB items and messages.

pub mod changelog;
pub mod dead_letter;
pub mod debezium;
pub mod dictionary;
pub mod hash;
pub mod invalid;
pub mod item;
pub mod json;
pub mod metrics;
pub mod number;
pub mod output;
pub mod pattern;
pub mod plan;
pub mod pointer;
pub mod record;
pub mod salt;
pub mod skew;
pub mod state;

pub use changelog::RowChange;
pub use dead_letter::{DeadLetter, DEAD_LETTER_SINK};
pub use dictionary::Dictionary;
pub use invalid::InvalidInput;
pub use item::{AttrValue, Item};
pub use output::{Output, OutputId};
pub use pattern::{Pattern, PatternError};
pub(crate) use plan::{BatchPlan, KeyGroup};
pub use record::{
    stream_name_of, Change, ChangeKind, NotASequenceNumber, Origin, Payload, RawJson,
    RejectedRecord, SequenceNumber, SourceRecord,
};
pub use state::{
    KeyState, Retiring, SentNotes, SentSoFar, SlotData, SlotUpdate, StateKind, StoreMemo,
    Watermark, Watermarks,
};
