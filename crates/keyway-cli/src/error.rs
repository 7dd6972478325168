//! The command's error: what failed, in words for whoever ran it, by kind: an option it cannot
//! use, a file it could not read or write, input it cannot read, the embedded runtime or a
//! function's setup, or the job itself. A command does its whole job or stops with one of these
//! and a failing exit status; it retries nothing itself.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub(crate) enum CliError {
    /// An option the command cannot use: the option as given, and why.
    #[error("{option}: {problem}")]
    Option { option: String, problem: String },
    /// A file or directory the command could not read or write.
    #[error("{}: {source}", path.display())]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Input the command cannot read: where (a file, `file:line`), and why.
    #[error("{at}: {problem}")]
    Input { at: String, problem: String },
    /// The command's output could not be written (`what`: standard output, the results).
    #[error("writing {what}: {source}")]
    Write {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The embedded runtime could not run the job.
    #[error(transparent)]
    Local(#[from] keyway_local::LocalError),
    /// A function's ports could not be built from its environment.
    #[error(transparent)]
    Port(#[from] keyway::lambda::PortError),
    /// A function could not be built from its environment.
    #[error(transparent)]
    Setup(#[from] keyway::lambda::SetupError),
    /// The state signatures' lock file.
    #[error(transparent)]
    Lock(#[from] keyway::operator::lock::LockError),
    /// An operator's sinks or inputs are not the wired ones.
    #[error(transparent)]
    Wiring(#[from] keyway::WiringError),
    /// A CloudTrail log file could not be read.
    #[error(transparent)]
    Trail(#[from] identity_enricher::log_files::ReadError),
    /// The job ran and did not do what it must (a run that is not clean, a benchmark that could
    /// not measure), in its words.
    #[error("{0}")]
    Job(String),
}

impl CliError {
    /// An option the command cannot use.
    pub(crate) fn option(option: impl Into<String>, problem: impl ToString) -> Self {
        Self::Option {
            option: option.into(),
            problem: problem.to_string(),
        }
    }

    /// A failure to read or write `path`, for `map_err`.
    pub(crate) fn file(path: impl AsRef<Path>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.as_ref().to_owned();
        move |source| Self::File { path, source }
    }

    /// A failure to write `what`, for `map_err`.
    pub(crate) fn writing(what: &'static str) -> impl FnOnce(std::io::Error) -> Self {
        move |source| Self::Write { what, source }
    }

    /// Input the command cannot read at `at`.
    pub(crate) fn input(at: impl ToString, problem: impl ToString) -> Self {
        Self::Input {
            at: at.to_string(),
            problem: problem.to_string(),
        }
    }
}

/// What a job says of its own failure.
impl From<String> for CliError {
    fn from(message: String) -> Self {
        Self::Job(message)
    }
}

impl From<&str> for CliError {
    fn from(message: &str) -> Self {
        Self::Job(message.to_owned())
    }
}
