//! The shared corpus of published payloads (CloudTrail, Debezium, Lambda events and responses).
//! It lives outside the repository: `KEYWAY_SAMPLES` names its folder, which `./scripts/test` and
//! `.ci/run` set, together with `KEYWAY_REQUIRE_SAMPLES` so that a missing corpus fails the run.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// The corpus folder; `None`, said aloud, when it is not set and not required.
pub fn corpus() -> Option<PathBuf> {
    match std::env::var("KEYWAY_SAMPLES") {
        Ok(dir) => Some(PathBuf::from(dir)),
        Err(_) if std::env::var("KEYWAY_REQUIRE_SAMPLES").is_ok() => {
            panic!("KEYWAY_SAMPLES is not set, but KEYWAY_REQUIRE_SAMPLES says the corpus must be checked")
        }
        Err(_) => {
            eprintln!("KEYWAY_SAMPLES is not set: the sample corpus was not checked");
            None
        }
    }
}

/// Every `.json` file under `dir`, sorted.
pub fn json_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(json_files(&path));
        } else if path.extension().is_some_and(|e| e == "json") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// One corpus file as JSON.
pub fn read(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
