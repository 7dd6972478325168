//! `keyway generate trail`: generated CloudTrail traffic written to disk, for `keyway enrich` and
//! for trying the enricher on a trail of any length: customers drawn from Zipf(1.2), role chains
//! of up to six sessions across each customer's accounts, interleaved, some orphaned (their first
//! AssumeRole missing), records 10 ms apart. `keyway generate cdc`: change events of two tables
//! (`keyway_stack::cdc_changes`), for `keyway cdc`.

use std::io::Write;
use std::path::PathBuf;

use identity_enricher::traffic::{Traffic, TrafficConfig};
use keyway_stack::cdc_changes::{generate, Workload};
use serde_json::json;

use crate::error::CliError;

/// What `keyway generate` writes.
#[derive(clap::Subcommand)]
pub(crate) enum What {
    /// CloudTrail records as JSON Lines, for `keyway enrich`: customers drawn from Zipf(1.2), role
    /// chains of up to six sessions across each customer's accounts, interleaved, some missing
    /// their first AssumeRole; records 10 ms apart.
    Trail(TrailOptions),
    /// Debezium change events of `domains` (id, name, user_id) and `users` (id, name) as JSON
    /// Lines of records {"topic", "key", "value"}, for `keyway cdc --join
    /// domains.user_id=users.id`: inserts, updates (a share of them moving a domain to another
    /// user), primary-key changes, deletes with their tombstones, events sent twice, and
    /// `--truncates` truncates.
    Cdc(CdcOptions),
}

/// The options of `keyway generate trail`.
#[derive(clap::Args)]
pub(crate) struct TrailOptions {
    #[arg(long, default_value_t = 1_000_000)]
    pub records: usize,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Writes the generated accounts' customer map here, for `keyway enrich --customer-map`.
    #[arg(long)]
    pub customer_map: Option<PathBuf>,
}

/// The options of `keyway generate cdc`.
#[derive(clap::Args)]
pub(crate) struct CdcOptions {
    #[arg(long, default_value_t = 10_000)]
    pub changes: usize,
    /// Of the updates of a domain, the share that moves it to another user.
    #[arg(long, default_value_t = 0.1)]
    pub join_key_updates: f64,
    /// Truncates among the changes, evenly spread, of domains and users in turn.
    #[arg(long, default_value_t = 0)]
    pub truncates: usize,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
}

/// Writes what is asked to standard output.
pub(crate) fn run(what: What) -> Result<(), CliError> {
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    match what {
        What::Trail(options) => trail(&options, &mut out),
        What::Cdc(options) => cdc(
            &Workload {
                changes: options.changes,
                join_key_updates: options.join_key_updates,
                truncates: options.truncates,
                seed: options.seed,
                ..Default::default()
            },
            &mut out,
        ),
    }
}

/// Writes `options.records` records as JSON Lines to `out`, and the customer map where asked.
pub(crate) fn trail(options: &TrailOptions, out: &mut dyn Write) -> Result<(), CliError> {
    let config = TrafficConfig {
        seed: options.seed,
        ..TrafficConfig::default()
    };
    if let Some(path) = &options.customer_map {
        std::fs::write(path, Traffic::customer_map_json(&config)).map_err(CliError::file(path))?;
    }
    let traffic =
        Traffic::new(config, options.records).map_err(|e| format!("generated traffic: {e}"))?;
    for record in traffic {
        serde_json::to_writer(&mut *out, &record)
            .map_err(std::io::Error::from)
            .and_then(|()| out.write_all(b"\n"))
            .map_err(CliError::writing("the trail"))?;
    }
    out.flush().map_err(CliError::writing("the trail"))?;
    Ok(())
}

/// Writes `workload`'s change events to `out` as records `{"topic", "key", "value"}`, a line each.
pub(crate) fn cdc(workload: &Workload, out: &mut dyn Write) -> Result<(), CliError> {
    for event in generate(workload) {
        let record = json!({"topic": event.topic, "key": event.key, "value": event.value});
        writeln!(out, "{record}").map_err(CliError::writing("the changes"))?;
    }
    out.flush().map_err(CliError::writing("the changes"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_trail_is_one_cloudtrail_record_a_line_and_its_map_names_every_account() {
        let dir = std::env::temp_dir().join(format!("keyway-generate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let map = dir.join("customers.json");
        let mut out = Vec::new();
        let options = TrailOptions {
            records: 500,
            seed: 3,
            customer_map: Some(map.clone()),
        };
        trail(&options, &mut out).unwrap();
        let customers: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&std::fs::read_to_string(&map).unwrap()).unwrap();
        let lines: Vec<&[u8]> = out
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .collect();
        assert_eq!(lines.len(), 500);
        for line in lines {
            let value: serde_json::Value = serde_json::from_slice(line).unwrap();
            let account = value["recipientAccountId"].as_str().unwrap();
            assert!(customers.contains_key(account), "{account} is in the map");
            identity_enricher::cloudtrail::CloudTrailRecord::parse(value).unwrap();
        }
        std::fs::remove_dir_all(dir).unwrap();
    }
}
