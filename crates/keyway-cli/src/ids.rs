//! `keyway ids`: the output ids keyway derives, for consumers and tests that check them. Reads
//! JSON lines `{"operator", "sink", "origin", "sequence", "index"}` (origin: `stream/shardId-…`)
//! from standard input and prints one id a line.

use crate::error::CliError;
use std::io::{BufRead, Write};

use serde::Deserialize;

use keyway::domain::{Origin, OutputId, SequenceNumber};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Position {
    operator: String,
    sink: String,
    origin: String,
    sequence: String,
    #[serde(default)]
    index: u32,
}

pub(crate) fn run() -> Result<(), CliError> {
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    for (n, line) in stdin.lock().lines().enumerate() {
        let line = line.map_err(|e| CliError::input("standard input", e))?;
        if line.trim().is_empty() {
            continue;
        }
        let position: Position = serde_json::from_str(&line)
            .map_err(|e| CliError::input(format!("line {}", n + 1), e))?;
        let sequence = SequenceNumber::parse(&position.sequence)
            .map_err(|e| CliError::input(format!("line {}: sequence", n + 1), e))?;
        let id = OutputId::derive(
            &position.operator,
            &position.sink,
            &Origin(position.origin),
            &sequence,
            position.index,
        );
        writeln!(out, "{id}").map_err(CliError::writing("standard output"))?;
    }
    Ok(())
}
