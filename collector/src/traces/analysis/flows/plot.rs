//! Mann Figure 2 as SVG: per method, the ratio estimate / actual over the
//! test invocations sorted by it (left, log scale), and the share of
//! predictions within each discrepancy `max(est, actual) / min(est,
//! actual)` (right, log scale).

use plotters::prelude::*;

use super::Evaluation;

const COLORS: [RGBColor; 6] = [
    RGBColor(0x99, 0x99, 0x99),
    RGBColor(0xcc, 0x79, 0xa7),
    RGBColor(0xe6, 0x9f, 0x00),
    RGBColor(0x56, 0xb4, 0xe9),
    RGBColor(0x00, 0x9e, 0x73),
    RGBColor(0xd5, 0x5e, 0x00),
];

/// At most this many points per curve (evenly spaced over the ranks).
const POINTS: usize = 400;

fn thin(v: &[f64]) -> Vec<(f64, f64)> {
    let n = v.len();
    if n == 0 {
        return Vec::new();
    }
    let step = n.div_ceil(POINTS).max(1);
    (0..n)
        .step_by(step)
        .chain(std::iter::once(n - 1))
        .map(|i| ((i + 1) as f64 / n as f64, v[i]))
        .collect()
}

/// Both panels of Mann Figure 2 for `eval`, as an SVG document.
///
/// # Errors
///
/// When plotters fails to lay the chart out (a message).
pub fn figure2_svg(eval: &Evaluation, title: &str) -> Result<String, String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1100, 460)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let root = root
            .titled(title, ("sans-serif", 18))
            .map_err(|e| e.to_string())?;
        let (left, right) = root.split_horizontally(550);
        let e = |e: DrawingAreaErrorKind<_>| e.to_string();
        let clamp = |r: f64| r.clamp(1e-2, 1e2);

        let mut l = ChartBuilder::on(&left)
            .caption("estimated / actual (sorted)", ("sans-serif", 14))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..1f64, (1e-2f64..1e2f64).log_scale())
            .map_err(e)?;
        l.configure_mesh()
            .x_desc("fraction of test invocations")
            .y_desc("ratio")
            .draw()
            .map_err(e)?;
        for (i, (m, s)) in eval.methods.iter().enumerate() {
            let pts: Vec<(f64, f64)> = thin(&s.ratios)
                .into_iter()
                .map(|(x, y)| (x, clamp(y)))
                .collect();
            l.draw_series(LineSeries::new(
                pts,
                COLORS[i % COLORS.len()].stroke_width(2),
            ))
            .map_err(e)?
            .label(m.label())
            .legend(move |(x, y)| {
                PathElement::new(
                    [(x, y), (x + 18, y)],
                    COLORS[i % COLORS.len()].stroke_width(2),
                )
            });
        }
        l.configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .draw()
            .map_err(e)?;

        let mut r = ChartBuilder::on(&right)
            .caption(
                "discrepancy: share of predictions within",
                ("sans-serif", 14),
            )
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(50)
            .build_cartesian_2d((1f64..100f64).log_scale(), 0f64..1f64)
            .map_err(e)?;
        r.configure_mesh()
            .x_desc("max(est, actual) / min(est, actual)")
            .y_desc("fraction")
            .draw()
            .map_err(e)?;
        for (i, (_, s)) in eval.methods.iter().enumerate() {
            // errors are sorted: the CDF of 1 + error.
            let pts: Vec<(f64, f64)> = thin(&s.errors)
                .into_iter()
                .map(|(frac, err)| ((1.0 + err).clamp(1.0, 100.0), frac))
                .collect();
            r.draw_series(LineSeries::new(
                pts,
                COLORS[i % COLORS.len()].stroke_width(2),
            ))
            .map_err(e)?;
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}
