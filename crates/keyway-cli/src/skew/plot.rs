//! The `--plot` chart: each shard's records/s before and after as a pair of bars, with the
//! shard limit, as SVG.

use std::path::Path;

use super::render::thousands;
use super::simulate::{Outcome, Report};
use super::SHARD_RECORDS_PER_SECOND;
use crate::error::CliError;

/// What drawing the chart can fail with: the SVG backend's file errors.
type PlotError = plotters::drawing::DrawingAreaErrorKind<std::io::Error>;

/// The shard loads before and after as a grouped bar chart, with the shard limit, in SVG.
pub(super) fn plot(path: &Path, report: &Report) -> Result<(), CliError> {
    use plotters::prelude::*;

    let loads =
        |o: &Outcome| -> Vec<f64> { o.shards.iter().map(|s| s.records_per_second).collect() };
    let series = [
        ("before: none".to_owned(), loads(&report.before)),
        (
            format!("after: {}", report.after.label),
            loads(&report.after),
        ),
    ];
    let title = format!(
        "keyway skew: records/s per shard, before (none) and after ({})",
        report.after.label
    );
    let root = SVGBackend::new(path, (1000, 560)).into_drawing_area();
    draw_bars(&root, &title, &series)
        .and_then(|()| root.present())
        .map_err(|e| CliError::from(format!("{}: {e}", path.display())))
}

fn draw_bars(
    root: &plotters::drawing::DrawingArea<plotters::prelude::SVGBackend, plotters::coord::Shift>,
    title: &str,
    series: &[(String, Vec<f64>); 2],
) -> Result<(), PlotError> {
    use plotters::prelude::*;

    let n = series[0].1.len() as f64;
    let limit = SHARD_RECORDS_PER_SECOND as f64;
    let top = series
        .iter()
        .flat_map(|(_, loads)| loads)
        .copied()
        .fold(limit, f64::max)
        * 1.1;
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(80)
        .build_cartesian_2d(-0.5f64..n - 0.5, 0f64..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc("shard")
        .y_desc("records/s")
        .x_labels((n as usize).clamp(2, 32))
        // Only whole numbers name shards; the axis may ask for ticks between them.
        .x_label_formatter(&|x| {
            if (x - x.round()).abs() < 1e-6 {
                format!("{}", x.round() as i64)
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|y| thousands(y.round() as u64))
        .draw()?;
    // Each shard's pair of bars side by side: before on the left, after on the right.
    for ((label, loads), (offset, color)) in series.iter().zip([(-0.4, BLUE), (0.0, RED)]) {
        let color = color.mix(0.75);
        chart
            .draw_series(loads.iter().enumerate().map(|(i, &load)| {
                let x = i as f64 + offset;
                Rectangle::new([(x, 0.0), (x + 0.4, load)], color.filled())
            }))?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart
        .draw_series(std::iter::once(PathElement::new(
            vec![(-0.5, limit), (n - 0.5, limit)],
            BLACK.stroke_width(2),
        )))?
        .label("shard limit: 1,000 records/s")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 12, y)], BLACK.stroke_width(2)));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
}
