//! The report as text: the workload and its heaviest keys, then "before" and "after" tables of
//! the shards (records/s over the run, the peak second, KiB/s, records throttled, a bar, all on
//! one scale) and of the partitions' WCU/s, and for `adaptive` when each key turned hot and was
//! salted. As JSON, the report is serialized as it is.

use std::fmt::Write as _;

use super::simulate::{Outcome, Report, SKETCH_CAPACITY};
use super::{Placement, StrategyName, PARTITION_WCU_PER_SECOND, SHARD_RECORDS_PER_SECOND};

/// Cells of a shard's bar (each split in eighths).
const BAR_WIDTH: usize = 40;

/// `n` with a comma between thousands.
pub(crate) fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A bar of `value` on a scale where `max` fills `width` cells, in eighths of a cell.
pub(crate) fn bar(value: f64, max: f64, width: usize) -> String {
    const EIGHTHS: [char; 8] = [' ', '▏', '▎', '▍', '▌', '▋', '▊', '▉'];
    if max <= 0.0 || value <= 0.0 {
        return String::new();
    }
    let eighths = ((value / max).min(1.0) * (width * 8) as f64).round() as usize;
    let mut out = "█".repeat(eighths / 8);
    if eighths % 8 > 0 {
        out.push(EIGHTHS[eighths % 8]);
    }
    if out.is_empty() {
        // A load too small for an eighth still shows that there is one.
        out.push('▏');
    }
    out
}

/// The report as text.
pub(crate) fn render(report: &Report) -> String {
    let mut out = String::new();
    render_header(&mut out, report);
    render_hot_keys(&mut out, report);
    // One scale for both tables, so that the bars compare across them.
    let scale = report
        .before
        .shards
        .iter()
        .chain(&report.after.shards)
        .map(|s| s.records_per_second)
        .fold(0.0, f64::max);
    for (title, outcome) in [("before", &report.before), ("after", &report.after)] {
        let _ = writeln!(out, "\n{title}: {}", outcome.label);
        render_shards(&mut out, outcome, scale);
        render_partitions(&mut out, outcome, report.batch_size);
        render_episodes(&mut out, outcome);
    }
    out
}

fn render_header(out: &mut String, report: &Report) {
    let w = &report.workload;
    let _ = writeln!(
        out,
        "keyway skew: {} events of {} keys ({}), {} events/s over {} s, {} bytes a record",
        thousands(w.events as u64),
        thousands(w.distinct_keys as u64),
        w.source,
        thousands(w.rate),
        w.seconds,
        thousands(w.mean_record_bytes.round() as u64)
    );
    if let Some(first) = &report.bad_input.first {
        let _ = writeln!(
            out,
            "bad input: {} lines left out; the first, line {}: {}: {}",
            thousands(report.bad_input.count),
            first.line,
            first.field,
            first.problem
        );
    }
    let placement = match report.placement {
        Placement::Spread => "salted buckets spread evenly by ExplicitHashKey",
        Placement::Md5 => "salted buckets placed by the MD5 of `key#i`",
    };
    let _ = writeln!(
        out,
        "{} shards ({placement}); {} DynamoDB partitions; batches of {} records or 1 s",
        report.shards, report.partitions, report.batch_size
    );
    let _ = writeln!(
        out,
        "limits: {} records/s and 1 MiB/s a shard, {} WCU/s a partition (1 WCU a write of up to 1 KB)",
        thousands(SHARD_RECORDS_PER_SECOND),
        thousands(PARTITION_WCU_PER_SECOND)
    );
}

fn render_hot_keys(out: &mut String, report: &Report) {
    let _ = writeln!(
        out,
        "\nheaviest keys (Space-Saving sketch of {SKETCH_CAPACITY} keys over the original keys):"
    );
    let width = report
        .hot_keys
        .iter()
        .map(|h| h.key.chars().count())
        .max()
        .unwrap_or(3)
        .max(3);
    let _ = writeln!(out, "  {:<width$} {:>12} {:>7}", "key", "records", "share");
    for h in &report.hot_keys {
        let _ = writeln!(
            out,
            "  {:<width$} {:>12} {:>6.2}%{}{}",
            h.key,
            thousands(h.records),
            h.share * 100.0,
            if h.error > 0 {
                format!(" (±{})", thousands(h.error))
            } else {
                String::new()
            },
            if h.hot { "  hot" } else { "" }
        );
    }
}

fn render_shards(out: &mut String, outcome: &Outcome, scale: f64) {
    let _ = writeln!(
        out,
        "{:>5} {:>10} {:>10} {:>10} {:>11}  load",
        "shard", "records/s", "peak/s", "KiB/s", "throttled"
    );
    for s in &outcome.shards {
        let _ = writeln!(
            out,
            "{:>5} {:>10} {:>10} {:>10} {:>11}  {}",
            s.shard,
            thousands(s.records_per_second.round() as u64),
            thousands(s.peak_records_per_second),
            thousands((s.bytes_per_second / 1024.0).round() as u64),
            thousands(s.throttled_records),
            bar(s.records_per_second, scale, BAR_WIDTH)
        );
    }
    let _ = writeln!(
        out,
        "CoV {:.3}, max/mean {:.3}; throttled: {} records ({:.1}%) on {} of {} shards",
        outcome.cov,
        outcome.max_over_mean,
        thousands(outcome.throttled_records),
        outcome.throttled_share * 100.0,
        outcome.throttled_shards,
        outcome.shards.len()
    );
    if outcome.strategy == StrategyName::PreAggregate {
        let _ = writeln!(
            out,
            "(pre-aggregation is the reading function's: the producer, and so the shards, are as before)"
        );
    }
}

fn render_partitions(out: &mut String, outcome: &Outcome, batch_size: usize) {
    let writes = if outcome.pre_aggregates {
        format!("one write a key a batch of up to {batch_size} records")
    } else {
        "one write a record".to_owned()
    };
    let _ = writeln!(
        out,
        "DynamoDB ({writes}): peak {} WCU/s; {} of {} partitions over {} WCU/s",
        thousands(outcome.peak_wcu_per_second),
        outcome.partitions_over_limit,
        outcome.partitions.len(),
        thousands(PARTITION_WCU_PER_SECOND)
    );
    let _ = writeln!(
        out,
        "{:>9} {:>10} {:>10} {:>14}",
        "partition", "WCU/s", "peak/s", "over the limit"
    );
    for p in &outcome.partitions {
        let _ = writeln!(
            out,
            "{:>9} {:>10} {:>10} {:>14}",
            p.partition,
            thousands(p.wcu_per_second.round() as u64),
            thousands(p.peak_wcu_per_second),
            thousands(p.over_limit_writes)
        );
    }
}

fn render_episodes(out: &mut String, outcome: &Outcome) {
    if outcome.strategy == StrategyName::Adaptive && outcome.salted.is_empty() {
        let _ = writeln!(out, "adaptive: no key turned hot");
    }
    for e in &outcome.salted {
        let cooled = match (e.cooled_in_second, e.unsalted_from_second) {
            (Some(cooled), Some(from)) => {
                format!("; cooled in second {cooled}, unsalted from second {from}")
            }
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "adaptive: `{}` turned hot in second {} ({:.1}% of it), salted from second {}{cooled}",
            e.key,
            e.hot_in_second,
            e.share * 100.0,
            e.salted_from_second
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_are_separated_by_commas() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(49_500), "49,500");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn a_bar_fills_its_width_at_the_maximum_in_eighths_of_a_cell() {
        assert_eq!(bar(10.0, 10.0, 4), "████");
        assert_eq!(bar(5.0, 10.0, 4), "██");
        assert_eq!(bar(1.0, 4.0, 2), "▌", "a quarter of 2 cells is half of one");
        assert_eq!(bar(0.0, 10.0, 4), "");
        assert_eq!(bar(0.001, 10.0, 4), "▏", "a tiny load still shows");
        assert_eq!(bar(20.0, 10.0, 4), "████", "never wider than the width");
    }
}
