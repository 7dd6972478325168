//! Helpers for the end-to-end tests: the AWS emulator harness (random resource names, readiness
//! polling, clean-up), an in-memory world for executor tests, and test operators.

pub mod emulator;
pub mod harness;
pub mod operators;
pub mod samples;
pub mod scripted;
pub mod trails;
