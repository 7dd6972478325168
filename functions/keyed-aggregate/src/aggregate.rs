//! What keyed aggregation computes: a `Partial` of a key's values (count, exact sum, minimum and
//! maximum) that merges with any other partial of the same key in any order and any grouping,
//! so that pre-aggregating a batch, salting a key over buckets and merging the buckets' partials
//! give exactly what adding the values one by one gives. The mean is derived at the end, from
//! the exact sum and the count.

use serde::{Deserialize, Serialize};

use crate::exact::{Exact, ExactError, Sum};

/// The aggregates a result reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Aggregate {
    /// How many records.
    Count,
    /// The exact sum of the values.
    Sum,
    /// The least value.
    Min,
    /// The greatest value.
    Max,
    /// The exact sum over the count, as a double.
    Mean,
}

impl Aggregate {
    /// Every aggregate, the count first.
    pub const ALL: [Aggregate; 5] = [
        Aggregate::Count,
        Aggregate::Sum,
        Aggregate::Min,
        Aggregate::Max,
        Aggregate::Mean,
    ];

    /// The aggregate's name in a spec and in a result: `count`, `sum`, `min`, `max` or `mean`.
    pub fn name(self) -> &'static str {
        match self {
            Aggregate::Count => "count",
            Aggregate::Sum => "sum",
            Aggregate::Min => "min",
            Aggregate::Max => "max",
            Aggregate::Mean => "mean",
        }
    }

    /// Whether it needs the records' values (all but the count do).
    pub fn needs_values(self) -> bool {
        self != Aggregate::Count
    }

    /// The aggregate named `text` (`count`, `sum`, `min`, `max`, `mean`); none for any other text.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == text)
    }
}

/// The aggregate of some of a key's values.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partial {
    /// How many records the partial aggregates.
    pub count: u64,
    /// The sum of the values, exactly however large it grows; none when counting records without
    /// values.
    pub sum: Option<Sum>,
    /// The least value; none when counting records without values.
    pub min: Option<Exact>,
    /// The greatest value; none when counting records without values.
    pub max: Option<Exact>,
}

impl Partial {
    /// One record, with its value if the aggregation reads values.
    pub fn of(value: Option<Exact>) -> Self {
        Partial {
            count: 1,
            sum: value.map(Sum::from),
            min: value,
            max: value,
        }
    }

    /// Adds `other` in: the result of aggregating both partials' records together.
    pub fn merge(&mut self, other: &Partial) -> Result<(), ExactError> {
        let count = self
            .count
            .checked_add(other.count)
            .ok_or(ExactError::Overflow)?;
        let sum = match (self.sum, other.sum) {
            (Some(a), Some(b)) => Some(a.checked_add(b)?),
            (a, b) => a.or(b),
        };
        self.count = count;
        self.sum = sum;
        self.min = pick(self.min, other.min, std::cmp::min);
        self.max = pick(self.max, other.max, std::cmp::max);
        Ok(())
    }

    /// The mean of the values: the exact sum, as a double, over the count; the same for the same
    /// records however they were grouped.
    pub fn mean(&self) -> Option<f64> {
        let sum = self.sum?;
        (self.count > 0).then(|| sum.to_f64() / self.count as f64)
    }
}

fn pick(a: Option<Exact>, b: Option<Exact>, choose: fn(Exact, Exact) -> Exact) -> Option<Exact> {
    match (a, b) {
        (Some(a), Some(b)) => Some(choose(a, b)),
        (a, b) => a.or(b),
    }
}

/// The tumbling window of `size_millis` that `time_millis` falls in: its start.
pub fn window_start(time_millis: i64, size_millis: i64) -> i64 {
    // Saturating at i64's least: no window starts before it.
    time_millis.saturating_sub(time_millis.rem_euclid(size_millis))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn value(units: i64, places: u32) -> Exact {
        let text = if places == 0 {
            units.to_string()
        } else {
            format!("{}e-{places}", units)
        };
        Exact::parse(&text).unwrap()
    }

    #[test]
    fn a_partial_counts_sums_and_keeps_the_least_and_greatest_value() {
        let mut partial = Partial::of(Some(value(5, 1)));
        partial.merge(&Partial::of(Some(value(-2, 0)))).unwrap();
        partial.merge(&Partial::of(Some(value(3, 0)))).unwrap();
        assert_eq!(partial.count, 3);
        assert_eq!(partial.sum, Some(value(15, 1).into()));
        assert_eq!(partial.min, Some(value(-2, 0)));
        assert_eq!(partial.max, Some(value(3, 0)));
        assert_eq!(partial.mean(), Some(0.5));
        let mut counted = Partial::of(None);
        counted.merge(&Partial::of(None)).unwrap();
        assert_eq!(
            (counted.count, counted.sum, counted.mean()),
            (2, None, None)
        );
    }

    #[test]
    fn sums_that_pass_38_digits_on_the_way_merge_alike_in_any_order_and_grouping() {
        let exact = |text: &str| Exact::parse(text).unwrap();
        let big = exact("99999999999999999999999999999999999999");
        let negative = exact("-99999999999999999999999999999999999999");
        let tiny = exact("0.000000000000000001");
        let fold = |values: &[Exact]| {
            let mut partial = Partial::of(Some(values[0]));
            for v in &values[1..] {
                partial.merge(&Partial::of(Some(*v))).unwrap();
            }
            partial
        };
        let orders = [
            [big, big, negative, tiny],
            [big, negative, big, tiny],
            [tiny, negative, big, big],
            [tiny, big, big, negative],
        ];
        let sums: Vec<String> = orders
            .iter()
            .map(|o| fold(o).sum.unwrap().to_string())
            .collect();
        for sum in &sums {
            assert_eq!(
                sum,
                "99999999999999999999999999999999999999.000000000000000001"
            );
        }
        // Grouped: two partials of two values each, merged either way round.
        let mut left = fold(&[big, big]);
        let right = fold(&[negative, tiny]);
        let mut other = right.clone();
        left.merge(&right).unwrap();
        other.merge(&fold(&[big, big])).unwrap();
        assert_eq!(left, other);
        assert_eq!(left, fold(&orders[0]));
        assert_eq!(
            left.mean(),
            Some(99999999999999999999999999999999999999.0 / 4.0)
        );
    }

    #[test]
    fn windows_start_on_multiples_of_their_size_before_the_epoch_too() {
        assert_eq!(window_start(61_000, 60_000), 60_000);
        assert_eq!(window_start(60_000, 60_000), 60_000);
        assert_eq!(window_start(-1, 60_000), -60_000);
    }

    proptest! {
        #[test]
        fn partials_merged_in_any_grouping_equal_the_values_added_one_by_one(
            values in prop::collection::vec((any::<i32>(), 0u32..6), 1..40),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..5),
        ) {
            let values: Vec<Exact> = values.into_iter().map(|(u, p)| value(u.into(), p)).collect();
            let mut one_by_one = Partial::of(Some(values[0]));
            for v in &values[1..] {
                one_by_one.merge(&Partial::of(Some(*v))).unwrap();
            }
            // Split into runs at the cuts, aggregate each run, merge the runs back to front.
            let mut at: Vec<usize> = cuts.iter().map(|c| c.index(values.len())).collect();
            at.push(0);
            at.push(values.len());
            at.sort();
            at.dedup();
            let mut runs: Vec<Partial> = at
                .windows(2)
                .map(|w| {
                    let mut run = Partial::of(Some(values[w[0]]));
                    for v in &values[w[0] + 1..w[1]] {
                        run.merge(&Partial::of(Some(*v))).unwrap();
                    }
                    run
                })
                .collect();
            let mut merged = runs.pop().unwrap();
            while let Some(run) = runs.pop() {
                merged.merge(&run).unwrap();
            }
            prop_assert_eq!(merged, one_by_one);
        }
    }
}
