//! Event times of a recorded input, which the jobs' virtual clocks follow: which of a slice's
//! times may move the clock. A time far from the rest of the input's (in microseconds where the
//! others are in milliseconds, a sentinel such as 9999-12-31) would have the clock run toward it
//! a minute's sweep at a time, for ever, or, first, start it there and make every other record
//! late.

/// How far from its slice's reference time a record's time may be and still move the clock. A
/// slice of thousands of records spread over more than a year keeps its outliers only so.
pub(crate) const FAR_FROM_REFERENCE_MILLIS: i64 = 366 * 86_400_000;

/// Fewer times than this in a slice (the last of an input, often) say too little of where the
/// input stands: the slice before's reference judges them.
const FEW: usize = 64;

/// The time each slice of an input is judged by, kept from slice to slice.
#[derive(Debug, Default)]
pub(crate) struct Reference {
    before: Option<i64>,
}

impl Reference {
    /// The time a slice of `times` is judged by: their lower median (of an even count the
    /// earlier middle one, so that half the times far ahead do not carry it), or the slice
    /// before's for a slice of fewer than `FEW` after one.
    pub(crate) fn of(&mut self, times: &[i64]) -> Option<i64> {
        let reference = match self.before {
            Some(before) if times.len() < FEW => Some(before),
            _ => lower_median(times),
        };
        self.before = reference.or(self.before);
        reference
    }
}

/// The lower median of `times`, if there are any.
fn lower_median(times: &[i64]) -> Option<i64> {
    let mut times = times.to_vec();
    let middle = times.len().checked_sub(1)? / 2;
    Some(*times.select_nth_unstable(middle).1)
}

/// Whether `at` is further ahead of `reference` than any record may move the clock.
pub(crate) fn far_ahead(at: i64, reference: i64) -> bool {
    at > reference.saturating_add(FAR_FROM_REFERENCE_MILLIS)
}

/// Whether `at` is near enough `reference` to move the clock.
pub(crate) fn near(at: i64, reference: i64) -> bool {
    !far_ahead(at, reference) && at >= reference.saturating_sub(FAR_FROM_REFERENCE_MILLIS)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = 86_400_000;
    const FAR: i64 = 9_999 * 365 * DAY;

    #[test]
    fn a_time_a_year_from_its_slices_lower_median_moves_no_clock() {
        let mut reference = Reference::default();
        assert_eq!(reference.of(&[]), None);
        assert_eq!(
            reference.of(&[10 * DAY, FAR]),
            Some(10 * DAY),
            "two lines, one far"
        );
        let slice: Vec<i64> = (0..100).map(|i| 20 * DAY + i).chain([FAR]).collect();
        assert_eq!(reference.of(&slice), Some(20 * DAY + 50));
        assert!(far_ahead(FAR, 20 * DAY) && !near(FAR, 20 * DAY));
        assert!(near(20 * DAY + 366 * DAY, 20 * DAY) && !near(20 * DAY - 367 * DAY, 20 * DAY));
    }

    #[test]
    fn a_last_slice_of_a_few_lines_is_judged_by_the_slice_before() {
        let mut reference = Reference::default();
        let slice: Vec<i64> = (0..100).map(|i| 20 * DAY + i).collect();
        assert_eq!(reference.of(&slice), Some(20 * DAY + 49));
        assert_eq!(reference.of(&[FAR]), Some(20 * DAY + 49));
        assert_eq!(reference.of(&[FAR, FAR]), Some(20 * DAY + 49));
    }
}
