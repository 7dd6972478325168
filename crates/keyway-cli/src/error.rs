//! The command's error: what failed, in words for whoever ran it. A command does its whole job
//! or stops with one of these and a failing exit status; it retries nothing itself.

use std::fmt;

#[derive(Debug)]
pub struct CliError(String);

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CliError {}

/// The subcommands describe their failures as they go (`line 3: sequence: …`).
impl From<String> for CliError {
    fn from(message: String) -> Self {
        Self(message)
    }
}

impl From<&str> for CliError {
    fn from(message: &str) -> Self {
        Self(message.to_owned())
    }
}

impl From<keyway_local::LocalError> for CliError {
    fn from(err: keyway_local::LocalError) -> Self {
        Self(err.to_string())
    }
}

impl From<keyway::lambda::PortError> for CliError {
    fn from(err: keyway::lambda::PortError) -> Self {
        Self(err.to_string())
    }
}

impl From<keyway::operator::lock::LockError> for CliError {
    fn from(err: keyway::operator::lock::LockError) -> Self {
        Self(err.to_string())
    }
}

impl From<keyway::WiringError> for CliError {
    fn from(err: keyway::WiringError) -> Self {
        Self(err.to_string())
    }
}

impl From<identity_enricher::log_files::ReadError> for CliError {
    fn from(err: identity_enricher::log_files::ReadError) -> Self {
        Self(err.to_string())
    }
}
