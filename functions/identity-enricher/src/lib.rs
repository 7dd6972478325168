//! Identity enrichment: every CloudTrail action traced through role chains back to its original
//! actor. Records are partitioned by `customer#accessKeyId` of their caller, which spreads a large
//! customer over many partitions; the resolution of each issued access key is re-published to a
//! feedback stream partitioned by that key, which puts a role chain back together across
//! partitions (DESIGN §1, and the article it comes from).
//!
//! `cloudtrail` reads a record into what resolution needs: who called (`Caller`) and which
//! credentials the call issued (`Issued`). `identity` holds what resolution produces: the
//! original actor, the role chain, the resolution messages of the feedback stream, and the
//! partition keys producers use. `enricher` is the keyed operator that puts them together.

pub mod cloudtrail;
pub mod enricher;
pub mod identity;
