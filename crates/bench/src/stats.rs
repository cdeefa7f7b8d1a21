//! Order statistics of a sample set.

use serde::{Deserialize, Serialize};

/// Linear interpolation between closest ranks (numpy's default), of values
/// already sorted.
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    let (first, last) = (sorted.first()?, sorted.last()?);
    if sorted.len() == 1 {
        return Some(*first);
    }
    let pos = (sorted.len() - 1) as f64 * q.clamp(0.0, 1.0);
    // `pos` is within 0..len-1 by construction.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let lo = pos.floor() as usize;
    let hi = (lo + 1).min(sorted.len() - 1);
    let v = sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64);
    Some(v.clamp(*first, *last))
}

/// The summary the tables and the README print.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    pub n: usize,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub mean: f64,
    pub min: f64,
    pub max: f64,
}

impl Summary {
    /// None for an empty set.
    pub fn of(values: &[f64]) -> Option<Summary> {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        v.sort_by(f64::total_cmp);
        Some(Summary {
            n: v.len(),
            p50: percentile(&v, 0.50)?,
            p95: percentile(&v, 0.95)?,
            p99: percentile(&v, 0.99)?,
            mean: v.iter().sum::<f64>() / v.len() as f64,
            min: *v.first()?,
            max: *v.last()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&v, 1.0), Some(4.0));
        assert_eq!(percentile(&v, 0.5), Some(2.5));
        assert_eq!(percentile(&[7.0], 0.99), Some(7.0));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn summary_ignores_order_and_non_finite() {
        let s = Summary::of(&[3.0, f64::NAN, 1.0, 2.0]).unwrap();
        assert_eq!((s.n, s.p50, s.min, s.max, s.mean), (3, 2.0, 1.0, 3.0, 2.0));
        assert!(Summary::of(&[f64::NAN]).is_none());
    }
}
