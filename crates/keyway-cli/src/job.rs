//! What the commands' jobs share: the tokio runtime they run the embedded runtime on, and how a
//! result is printed (a table, or JSON with `--json`).

use serde::Serialize;

/// A one-threaded tokio runtime, on virtual time when `paused` (batching windows, retries and
/// TTLs pass instantly), as the commands run the embedded runtime.
pub(crate) fn runtime_builder(paused: bool) -> tokio::runtime::Runtime {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_time();
    if paused {
        builder.start_paused(true);
    }
    builder.build().expect("a tokio runtime")
}

/// Prints a command's result: as JSON with `--json`, as a table otherwise.
pub(crate) fn report<T: Serialize>(result: &T, json: bool, table: impl FnOnce(&T)) {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(result).expect("serializable")
        );
    } else {
        table(result);
    }
}
