//! Differential analysis of two selections (CPT "Aggregation and
//! Visualization": profile comparison, Tables 2 and 3).
//!
//! Each sample stack's value is a mean over requests, so by the central limit
//! theorem its estimate is roughly normal with standard error `s/√n`, `s`
//! being the standard deviation of the stack's per-request time (0 on
//! requests where it is not on the path). The change between a base and a
//! test selection has standard error `√(s_b²/n_b + s_t²/n_t)`; its confidence
//! interval is `change ± z·SE` (`z = 1.96` at 95 %). CPT Table 2 is this
//! interval for the total: ±19.9 ms at 1 000 requests, ±2.0 ms at 100 000.
//!
//! A change is *flagged* when its interval excludes zero and it is at least
//! `min_change`. With thousands of stacks, a 95 % interval still flags about
//! 5 % of unchanged stacks (CPT Table 3: 57–61 false positives above 0.1 ms
//! at 1 000 requests), so the report states how many flags chance alone would
//! give, and offers a threshold (`min_change`) and a Bonferroni correction.
//!
//! The pprof side of a diff is two ordinary profiles, opened with
//! `go tool pprof -diff_base base.pb.gz test.pb.gz`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

use cpt_sdk::path::Frame;

use crate::format::{csv_field, fmt_ns};
use crate::profile::aggregate::{Aggregate, StackStats, frame_label};

/// Knobs for [`diff`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DiffOptions {
    /// Two-sided confidence level, in `(0, 1)`; default 0.95.
    pub confidence: f64,
    /// Smallest change worth flagging; default zero.
    pub min_change: Duration,
    /// Divide `1 - confidence` by the number of stacks compared (Bonferroni),
    /// so chance flags about `1 - confidence` stacks in total, not per stack.
    pub bonferroni: bool,
}

impl Default for DiffOptions {
    fn default() -> Self {
        DiffOptions {
            confidence: 0.95,
            min_change: Duration::ZERO,
            bonferroni: false,
        }
    }
}

/// Mean, its standard error and the on-path count of one stack in one arm.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ArmStats {
    /// Mean ns per request.
    pub mean_nanos: f64,
    /// Standard error of the mean, ns (NaN when unknown: no spread detail,
    /// or fewer than 2 requests).
    pub std_error_nanos: f64,
    /// Requests with the stack on the path.
    pub on_path: u64,
}

/// One stack's change.
#[derive(Clone, Debug, PartialEq)]
pub struct DiffRow {
    /// The stack, frames joined with `;` (`[total]` for the whole request).
    pub stack: String,
    /// Base arm.
    pub base: ArmStats,
    /// Test arm.
    pub test: ArmStats,
    /// `test - base`, ns per request.
    pub change_nanos: f64,
    /// Half-width of the confidence interval of the change, ns (NaN if unknown).
    pub ci_half_nanos: f64,
    /// Interval excludes zero and `|change| >= min_change`.
    pub flagged: bool,
}

impl DiffRow {
    /// The interval `[low, high]` of the change, ns.
    pub fn ci(&self) -> (f64, f64) {
        (
            self.change_nanos - self.ci_half_nanos,
            self.change_nanos + self.ci_half_nanos,
        )
    }
}

/// The result of comparing two aggregates.
#[derive(Clone, Debug)]
pub struct DiffReport {
    /// Requests in the base selection.
    pub base_requests: u64,
    /// Requests in the test selection.
    pub test_requests: u64,
    /// The options used.
    pub options: DiffOptions,
    /// The `z` used for intervals (after any Bonferroni correction).
    pub z: f64,
    /// The whole request (mean latency).
    pub total: DiffRow,
    /// One row per stack in either arm, largest |change| first.
    pub rows: Vec<DiffRow>,
}

impl DiffReport {
    /// Rows flagged as larger than noise.
    pub fn flagged(&self) -> impl Iterator<Item = &DiffRow> {
        self.rows.iter().filter(|r| r.flagged)
    }

    /// How many stacks chance alone would flag at this confidence if nothing
    /// had changed (before the `min_change` threshold).
    pub fn expected_false_positives(&self) -> f64 {
        let alpha = 1.0 - self.options.confidence;
        if self.options.bonferroni {
            alpha
        } else {
            alpha * self.rows.len() as f64
        }
    }

    /// A text report: totals, the noise note, then flagged rows (or the `top`
    /// largest changes when `all` is set).
    pub fn to_text(&self, top: usize, all: bool) -> String {
        let pct = self.options.confidence * 100.0;
        let mut out = String::new();
        let arm = |name: &str, n: u64, a: &ArmStats| {
            format!(
                "{name}: {}, mean latency {} ± {} ({pct}% CI)\n",
                crate::format::plural(n, "request"),
                fmt_ns(a.mean_nanos.round() as u64),
                fmt_ci(self.z * a.std_error_nanos),
            )
        };
        out.push_str(&arm("base", self.base_requests, &self.total.base));
        out.push_str(&arm("test", self.test_requests, &self.total.test));
        let _ = writeln!(
            out,
            "change in mean latency: {} [{}, {}] {}",
            fmt_signed(self.total.change_nanos),
            fmt_signed(self.total.ci().0),
            fmt_signed(self.total.ci().1),
            if self.total.flagged {
                "LARGER THAN NOISE"
            } else {
                "within noise"
            }
        );
        let _ = writeln!(
            out,
            "{} compared at {pct}%{}: chance alone would flag about {:.1} of them \
             (CPT Table 3); flagging |change| >= {} whose interval excludes 0: {} flagged",
            crate::format::plural(self.rows.len() as u64, "stack"),
            if self.options.bonferroni {
                " (Bonferroni)"
            } else {
                ""
            },
            self.expected_false_positives(),
            fmt_ns(self.options.min_change.as_nanos() as u64),
            self.flagged().count()
        );
        let _ = writeln!(
            out,
            "{:>11} {:>25} {:>10} {:>10} {:>4}  stack",
            "change", "interval", "base", "test", "flag"
        );
        let rows: Vec<&DiffRow> = if all {
            self.rows.iter().take(top).collect()
        } else {
            self.flagged().take(top).collect()
        };
        for r in rows {
            let _ = writeln!(
                out,
                "{:>11} {:>25} {:>10} {:>10} {:>4}  {}",
                fmt_signed(r.change_nanos),
                format!("[{}, {}]", fmt_signed(r.ci().0), fmt_signed(r.ci().1)),
                fmt_ns(r.base.mean_nanos.round() as u64),
                fmt_ns(r.test.mean_nanos.round() as u64),
                if r.flagged { "*" } else { "" },
                r.stack
            );
        }
        out
    }

    /// CSV, one row per stack plus `[total]` first:
    /// `stack,base_mean_ns,test_mean_ns,change_ns,ci_low_ns,ci_high_ns,base_on_path,test_on_path,flagged`.
    pub fn to_csv(&self) -> String {
        let mut out = String::from(
            "stack,base_mean_ns,test_mean_ns,change_ns,ci_low_ns,ci_high_ns,base_on_path,test_on_path,flagged\n",
        );
        for r in std::iter::once(&self.total).chain(&self.rows) {
            let (lo, hi) = r.ci();
            let _ = writeln!(
                out,
                "{},{:.1},{:.1},{:.1},{:.1},{:.1},{},{},{}",
                csv_field(&r.stack),
                r.base.mean_nanos,
                r.test.mean_nanos,
                r.change_nanos,
                lo,
                hi,
                r.base.on_path,
                r.test.on_path,
                r.flagged
            );
        }
        out
    }
}

/// A signed change for people: `+1.20ms`, `-850ns`, `?` when unknown.
pub(crate) fn fmt_signed(ns: f64) -> String {
    if ns.is_nan() {
        return "?".into();
    }
    let sign = if ns < 0.0 { "-" } else { "+" };
    format!("{sign}{}", fmt_ns(ns.abs().round() as u64))
}

fn fmt_ci(ns: f64) -> String {
    if ns.is_nan() {
        "?".into()
    } else {
        fmt_ns(ns.round() as u64)
    }
}

/// Mean and standard error of a quantity summed `sum` over `n` requests
/// with sum of squares `sum_sq` (NaN standard error when unknown).
fn arm(n: u64, sum: u64, sum_sq: Option<u128>, on_path: u64) -> ArmStats {
    if n == 0 {
        return ArmStats {
            mean_nanos: 0.0,
            std_error_nanos: f64::NAN,
            on_path,
        };
    }
    let nf = n as f64;
    let mean = sum as f64 / nf;
    let std_error_nanos = match sum_sq {
        Some(sq) if n >= 2 => {
            let var = ((sq as f64) - (sum as f64) * mean).max(0.0) / (nf - 1.0);
            (var / nf).sqrt()
        }
        _ => f64::NAN,
    };
    ArmStats {
        mean_nanos: mean,
        std_error_nanos,
        on_path,
    }
}

fn row(stack: String, base: ArmStats, test: ArmStats, z: f64, min: f64) -> DiffRow {
    let change = test.mean_nanos - base.mean_nanos;
    let se = (base.std_error_nanos.powi(2) + test.std_error_nanos.powi(2)).sqrt();
    let half = z * se;
    let flagged = !half.is_nan() && change.abs() > half && change.abs() >= min;
    DiffRow {
        stack,
        base,
        test,
        change_nanos: change,
        ci_half_nanos: half,
        flagged,
    }
}

/// Compare two aggregates stack by stack. See the [module docs](self).
///
/// Aggregates read back from profiles carry no spread, so their intervals
/// are unknown (NaN) and nothing is flagged; build them from records.
///
/// # Panics
///
/// If `opts.confidence` is not in `(0, 1)`.
pub fn diff(base: &Aggregate, test: &Aggregate, opts: &DiffOptions) -> DiffReport {
    assert!(
        opts.confidence > 0.0 && opts.confidence < 1.0,
        "confidence must be in (0, 1)"
    );
    let mut by_stack: HashMap<Vec<&Frame>, (Option<&StackStats>, Option<&StackStats>)> =
        HashMap::new();
    for s in base.stacks() {
        by_stack
            .entry(base.stack_frames(s).collect())
            .or_default()
            .0 = Some(s);
    }
    for s in test.stacks() {
        by_stack
            .entry(test.stack_frames(s).collect())
            .or_default()
            .1 = Some(s);
    }
    let m = by_stack.len().max(1) as f64;
    let alpha = 1.0 - opts.confidence;
    let alpha = if opts.bonferroni { alpha / m } else { alpha };
    let z = normal_quantile(1.0 - alpha / 2.0);
    let min = opts.min_change.as_nanos() as f64;
    let side = |agg: &Aggregate, s: Option<&StackStats>| match s {
        Some(s) => arm(
            agg.requests(),
            s.sum_nanos,
            s.detail.as_ref().map(|d| d.sum_sq),
            s.requests,
        ),
        // Absent from this arm: zero on every request, known exactly if the
        // arm has spread detail at all.
        None => arm(agg.requests(), 0, agg.latency_detail().map(|_| 0), 0),
    };
    let mut rows: Vec<DiffRow> = by_stack
        .into_iter()
        .map(|(frames, (b, t))| {
            let label = frames
                .iter()
                .map(|f| frame_label(f))
                .collect::<Vec<_>>()
                .join(";");
            row(label, side(base, b), side(test, t), z, min)
        })
        .collect();
    rows.sort_by(|a, b| {
        b.change_nanos
            .abs()
            .total_cmp(&a.change_nanos.abs())
            .then_with(|| a.stack.cmp(&b.stack))
    });
    let total_arm = |agg: &Aggregate| {
        arm(
            agg.requests(),
            agg.latency_sum().as_nanos() as u64,
            agg.latency_detail().map(|d| d.sum_sq),
            agg.requests(),
        )
    };
    // The total is one comparison: it uses the unadjusted z.
    let z_total = normal_quantile(1.0 - (1.0 - opts.confidence) / 2.0);
    let total = row(
        "[total]".into(),
        total_arm(base),
        total_arm(test),
        z_total,
        min,
    );
    DiffReport {
        base_requests: base.requests(),
        test_requests: test.requests(),
        options: *opts,
        z,
        total,
        rows,
    }
}

/// The standard normal quantile (inverse CDF) for `p` in `(0, 1)`, by
/// Peter Acklam's rational approximation (relative error below 1.2e-9).
pub fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    if p <= 0.0 {
        return f64::NEG_INFINITY;
    }
    if p >= 1.0 {
        return f64::INFINITY;
    }
    let lo = 0.02425;
    if p < lo {
        let q = (-2.0 * p.ln()).sqrt();
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    } else if p <= 1.0 - lo {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    } else {
        let q = (-2.0 * (1.0 - p).ln()).sqrt();
        -(((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::aggregate::tests::record;
    use crate::records::selection::Selection;
    use cpt_sdk::path::SegmentKind;
    use cpt_sdk::record::Record;

    use cpt_sdk::testing::SplitMix64 as Rng;

    /// `n` requests of a Figure 1–like system with `k` leaf components under
    /// A1, each on the path with probability 1/4 and skewed (exponential)
    /// durations; `extra_b1` is added to B1 on every request.
    fn population(seed: u64, n: usize, k: usize, extra_b1_us: u64) -> Vec<Record> {
        let mut rng = Rng::new(seed);
        let names: Vec<String> = (0..k).map(|i| format!("C{i}")).collect();
        (0..n)
            .map(|_| {
                let mut p = cpt_sdk::path::CriticalPath::new();
                let a1 = Frame::new("A", "A1");
                let self_us = 1000 + (rng.unit() * 1000.0) as u64;
                p.push_frames(
                    [a1.clone()],
                    Duration::from_micros(self_us),
                    SegmentKind::Busy,
                );
                let b1_us = 2000 + (-(1.0 - rng.unit()).ln() * 1000.0) as u64 + extra_b1_us;
                p.push_frames(
                    [a1.clone(), Frame::new("B", "B1")],
                    Duration::from_micros(b1_us),
                    SegmentKind::Busy,
                );
                for name in &names {
                    if rng.unit() < 0.25 {
                        let us = 1 + (-(1.0 - rng.unit()).ln() * 500.0) as u64;
                        p.push_frames(
                            [a1.clone(), Frame::new("C", name.as_str())],
                            Duration::from_micros(us),
                            SegmentKind::Busy,
                        );
                    }
                }
                Record::new("A", cpt_sdk::trigger::Trigger::Sampled, p)
            })
            .collect()
    }

    fn agg(recs: &[Record]) -> Aggregate {
        Aggregate::from_records(&Selection::new(), recs)
    }

    #[test]
    fn normal_quantile_matches_tables() {
        #[rustfmt::skip]
        let cases: &[(f64, f64)] = &[(0.975, 1.959_963_985), (0.5, 0.0), (0.995, 2.575_829_304), (0.01, -2.326_347_874)];
        for (p, want) in cases {
            assert!(
                (normal_quantile(*p) - want).abs() < 1e-6,
                "{p}: {}",
                normal_quantile(*p)
            );
        }
    }

    #[test]
    fn cpt_table1_diff_of_the_two_requests() {
        // Base = request 1 (A2 on the path), test = request 2 (B1 on the path).
        let t = cpt_sdk::testing::fixtures::table1();
        let r = diff(&agg(&t[..1]), &agg(&t[1..]), &DiffOptions::default());
        let by = |s: &str| r.rows.iter().find(|x| x.stack == s).unwrap().change_nanos;
        assert_eq!(by("A1 (A);A2 (A)"), -10e6);
        assert_eq!(by("A1 (A);B1 (B)"), 4e6);
        assert_eq!(by("A1 (A)"), -2e6);
        assert_eq!(r.total.change_nanos, -8e6);
        // One request per arm: no spread, so no interval and no flag.
        assert!(r.total.ci_half_nanos.is_nan() && r.flagged().count() == 0);
    }

    #[test]
    fn cpt_table2_interval_shrinks_with_sqrt_of_sample_size() {
        // Same population at 1 000 and 100 000 requests: the interval of
        // the mean latency narrows about 10× (CPT Table 2: ±19.9 → ±2.0 ms).
        let small = agg(&population(1, 1_000, 5, 0));
        let large = agg(&population(2, 100_000, 5, 0));
        let half = |a: &Aggregate| diff(a, a, &DiffOptions::default()).total.ci_half_nanos;
        let ratio = half(&small) / half(&large);
        assert!((8.0..12.5).contains(&ratio), "ratio {ratio}");
        // And it is the textbook 1.96·s·√(2/n) for two equal arms.
        let d = small.latency_detail().unwrap();
        let n = small.requests() as f64;
        let mean = small.latency_sum().as_nanos() as f64 / n;
        let sd = (((d.sum_sq as f64) - mean * mean * n) / (n - 1.0)).sqrt();
        let want = 1.959_964 * sd * (2.0 / n).sqrt();
        assert!((half(&small) - want).abs() / want < 1e-6);
    }

    #[test]
    fn cpt_table3_false_positives_fall_with_threshold() {
        // Two selections with identical criteria: every flag is a false
        // positive. At 95 % about 5 % of the stacks are flagged; raising the
        // threshold removes them (CPT Table 3), Bonferroni too.
        let k = 200;
        let base = agg(&population(10, 2_000, k, 0));
        let test = agg(&population(11, 2_000, k, 0));
        let count = |min_us: u64, bonferroni: bool| {
            let o = DiffOptions {
                min_change: Duration::from_micros(min_us),
                bonferroni,
                ..DiffOptions::default()
            };
            diff(&base, &test, &o).flagged().count()
        };
        let r = diff(&base, &test, &DiffOptions::default());
        let expected = r.expected_false_positives();
        assert!((10.0..10.5).contains(&expected), "{expected}");
        let at0 = count(0, false);
        assert!(
            at0 <= 25,
            "{at0} flagged at 0 threshold; chance predicts ~{expected}"
        );
        let at10 = count(10, false);
        let at100 = count(100, false);
        assert!(at0 >= at10 && at10 >= at100, "{at0} {at10} {at100}");
        assert_eq!(at100, 0);
        assert!(count(0, true) <= 2);
    }

    #[test]
    fn diff_flags_a_real_regression_with_its_interval() {
        // The test arm's B1 is 1.5 ms slower on every request.
        let base = agg(&population(20, 3_000, 50, 0));
        let test = agg(&population(21, 3_000, 50, 1_500));
        let o = DiffOptions {
            min_change: Duration::from_micros(100),
            ..DiffOptions::default()
        };
        let r = diff(&base, &test, &o);
        let flagged: Vec<&str> = r.flagged().map(|x| x.stack.as_str()).collect();
        assert_eq!(flagged, ["A1 (A);B1 (B)"]);
        let b1 = &r.rows[0];
        let (lo, hi) = b1.ci();
        assert!(lo < 1.5e6 && 1.5e6 < hi, "[{lo}, {hi}]");
        assert!(r.total.flagged);
        let text = r.to_text(10, false);
        assert!(text.contains("LARGER THAN NOISE"), "{text}");
        assert!(text.contains("A1 (A);B1 (B)"), "{text}");
        let csv = r.to_csv();
        assert!(csv.lines().nth(1).unwrap().starts_with("[total],"), "{csv}");
    }

    #[test]
    fn diff_stack_in_one_arm_only() {
        let base = agg(&[
            record(&[(&[("A", "A1")], 2, SegmentKind::Busy)]),
            record(&[(&[("A", "A1")], 4, SegmentKind::Busy)]),
        ]);
        let test = agg(&[
            record(&[
                (&[("A", "A1")], 2, SegmentKind::Busy),
                (&[("A", "A1"), ("A", "new")], 6, SegmentKind::Busy),
            ]),
            record(&[(&[("A", "A1")], 4, SegmentKind::Busy)]),
        ]);
        let r = diff(&base, &test, &DiffOptions::default());
        let new = r.rows.iter().find(|x| x.stack == "A1 (A);new (A)").unwrap();
        assert_eq!(new.base.mean_nanos, 0.0);
        assert_eq!(new.base.std_error_nanos, 0.0);
        assert_eq!(new.test.mean_nanos, 3e6);
        assert!(new.ci_half_nanos > 0.0);
    }
}
