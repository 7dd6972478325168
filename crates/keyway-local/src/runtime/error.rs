//! What the embedded runtime says when it cannot run a template, placed at the template path of
//! what is wrong.

use std::sync::Arc;
use std::time::Duration;

use crate::template::TemplateError;
use keyway::lambda::{ConfigError, Env, Handler, Platform, SetupError};

/// Builds a function's handler from its platform and environment (a function crate's `handler`).
pub type Factory =
    Box<dyn Fn(&dyn Platform, &Env) -> Result<Arc<dyn Handler>, SetupError> + Send + Sync>;

/// The embedded runtime cannot run a template, or a run does not finish. Problems of a function's
/// configuration name the template path they come from.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum LocalError {
    /// The template cannot be read.
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// The template declares a function no factory was registered for.
    #[error("Resources/{function}: no function is registered for this logical id")]
    Unregistered {
        /// The function's logical id.
        function: String,
    },
    /// A function cannot be set up as the template configures it.
    #[error("{path}: {problem}")]
    Function {
        /// The template path of what is wrong: an environment variable, an event.
        path: String,
        /// What is wrong there.
        problem: String,
    },
    /// A run ended at its limit of virtual time with records still to process.
    #[error("{waiting} records still wait after {limit:?}")]
    Unfinished {
        /// Records and queue messages still waiting to be processed.
        waiting: usize,
        /// The virtual time the run was given.
        limit: Duration,
    },
}

impl LocalError {
    /// A function's configuration error, at the template path of the variable it names.
    pub(super) fn config(function: &str, err: &ConfigError) -> Self {
        Self::Function {
            path: format!(
                "Resources/{function}/Properties/Environment/Variables/{}",
                err.name
            ),
            problem: err.problem.clone(),
        }
    }

    pub(super) fn setup(function: &str, err: SetupError) -> Self {
        match err {
            SetupError::Config(err) => Self::config(function, &err),
            SetupError::Wiring(err) => Self::Function {
                path: format!("Resources/{function}"),
                problem: err.to_string(),
            },
        }
    }

    /// A problem at the template path `path`.
    pub(super) fn at(path: &str, problem: impl std::fmt::Display) -> Self {
        Self::Function {
            path: path.to_owned(),
            problem: problem.to_string(),
        }
    }

    /// The template path of a function's event.
    pub(super) fn event_path(function: &str, event: &str) -> String {
        format!("Resources/{function}/Properties/Events/{event}")
    }
}
