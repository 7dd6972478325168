//! Real-time dynamic filtering: consumers keep their subscriptions in DynamoDB policy tables, and
//! only the events a subscription matches reach the consumer's own SQS queue, within a second of
//! a subscription changing and with no lookup per event (DESIGN §1, and the article it comes
//! from).
//!
//! `subscription` is what a consumer asks for and the policy item that holds it; `index` is the
//! subscriptions as the filter holds them in memory; `store` is the filter state in DynamoDB that
//! filter-policy-sync writes and the filter's index is built and kept exact from.

pub mod index;
pub mod store;
pub mod subscription;
