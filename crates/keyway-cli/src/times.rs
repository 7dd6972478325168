//! Event times of a recorded input, which the jobs' virtual clocks follow: which of a slice's
//! times may move the clock. A time far from the rest of its slice's (in microseconds where the
//! others are in milliseconds, a sentinel such as 9999-12-31) would have the clock run toward it
//! a minute's sweep at a time, for ever, or, first, start it there and make every other record
//! late.

/// How far from the median of its slice's times a record's time may be and still move the clock.
/// A slice of thousands of records spread over more than a year keeps its outliers only so.
pub(crate) const FAR_FROM_MEDIAN_MILLIS: i64 = 366 * 86_400_000;

/// The median of `times` (the later of the middle two), if there are any.
pub(crate) fn median(times: impl Iterator<Item = i64>) -> Option<i64> {
    let mut times: Vec<i64> = times.collect();
    let middle = times.len() / 2;
    (!times.is_empty()).then(|| *times.select_nth_unstable(middle).1)
}

/// Whether `at` is within `FAR_FROM_MEDIAN_MILLIS` of `median`.
pub(crate) fn near(at: i64, median: i64) -> bool {
    (median.saturating_sub(FAR_FROM_MEDIAN_MILLIS)..=median.saturating_add(FAR_FROM_MEDIAN_MILLIS))
        .contains(&at)
}

/// The newest of `times` near their median: what the clock may run to.
pub(crate) fn newest_near(times: &[i64]) -> Option<i64> {
    let median = median(times.iter().copied())?;
    times.iter().copied().filter(|&at| near(at, median)).max()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_a_year_from_its_slices_median_moves_no_clock() {
        let day = 86_400_000;
        let times = [
            10 * day,
            11 * day,
            9_999 * 365 * day,
            12 * day,
            10 * day - 400 * day,
        ];
        assert_eq!(median(times.iter().copied()), Some(11 * day));
        assert_eq!(newest_near(&times), Some(12 * day));
        assert!(near(11 * day + 366 * day, 11 * day) && !near(11 * day + 367 * day, 11 * day));
        assert_eq!(newest_near(&[]), None);
    }
}
