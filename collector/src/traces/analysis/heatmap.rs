//! The heat map of CRISP §6.1 (Figure 10): operations × traces, each cell
//! the operation's exclusive time on that trace's critical path (all call
//! paths ending in the operation collapsed into its row), colored by its
//! share of the trace's latency. Rows are sorted by a chosen percentile of
//! their cells (the page can re-sort by another), columns by latency, slowest
//! first. Hovering a row's name shows its top 5 call chains. The output is one self-contained HTML file (inline data, script
//! and style; no network).

use std::collections::HashMap;
use std::fmt::Write as _;

use cpt_sdk::Record;
use serde::Serialize;

use super::{exclusive_by_operation, quantile};

/// Choices for [`build`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HeatMapOptions {
    /// Sort rows by this quantile (0..=1) of their cells; default 0.5 (P50).
    pub sort_quantile: f64,
    /// At most this many traces (columns): when there are more, columns are
    /// taken at evenly spaced latency ranks (the slowest and fastest kept).
    pub max_traces: usize,
    /// At most this many operations (rows), the top ones by the sort key.
    pub max_rows: usize,
}

impl Default for HeatMapOptions {
    fn default() -> Self {
        HeatMapOptions {
            sort_quantile: 0.5,
            max_traces: 600,
            max_rows: 80,
        }
    }
}

/// One column: a trace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Column {
    /// Trace id (or request id when there is none).
    pub trace: String,
    /// Endpoint `service operation`.
    pub endpoint: String,
    /// End-to-end latency, ns.
    pub latency_ns: u64,
}

/// The matrix.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HeatMap {
    /// Row labels, `operation (service)`, in sorted order.
    pub rows: Vec<String>,
    /// Columns, slowest first.
    pub cols: Vec<Column>,
    /// Exclusive ns, row-major (`rows.len() × cols.len()`).
    pub cells: Vec<u64>,
    /// Per row, its top 5 call chains (root → operation) by total time over
    /// the columns, with that time in ns (CRISP: shown on hover).
    pub chains: Vec<Vec<(String, u64)>>,
    /// Records offered (before sampling columns).
    pub traces_total: usize,
}

impl HeatMap {
    /// The cell at row `r`, column `c`.
    pub fn cell(&self, r: usize, c: usize) -> u64 {
        self.cells[r * self.cols.len() + c]
    }
}

/// Build the matrix (see the module docs).
pub fn build(records: &[&Record], opts: &HeatMapOptions) -> HeatMap {
    let mut order: Vec<usize> = (0..records.len()).collect();
    order.sort_by(|&a, &b| records[b].latency.cmp(&records[a].latency).then(a.cmp(&b)));
    let picked: Vec<usize> = if order.len() <= opts.max_traces.max(1) {
        order
    } else {
        let k = opts.max_traces.max(2);
        let n = order.len();
        (0..k).map(|i| order[i * (n - 1) / (k - 1)]).collect()
    };
    let ncols = picked.len();
    let mut row_of: HashMap<String, usize> = HashMap::new();
    let mut rows: Vec<Vec<u64>> = Vec::new();
    let mut chains: Vec<HashMap<String, u64>> = Vec::new();
    for (c, &i) in picked.iter().enumerate() {
        for ((svc, op), ns) in exclusive_by_operation(records[i]) {
            let label = format!("{op} ({svc})");
            let r = *row_of.entry(label).or_insert_with(|| {
                rows.push(vec![0; ncols]);
                chains.push(HashMap::new());
                rows.len() - 1
            });
            rows[r][c] += ns;
        }
        let rec = records[i];
        for seg in rec.path.segments() {
            let Some(&leaf) = seg.stack.last() else {
                continue;
            };
            let f = rec.path.frame(leaf);
            let Some(&r) = row_of.get(&format!("{} ({})", f.name, f.service)) else {
                continue;
            };
            let chain = rec
                .path
                .stack_frames(seg)
                .map(|f| format!("{} ({})", f.name, f.service))
                .collect::<Vec<_>>()
                .join(" → ");
            *chains[r].entry(chain).or_default() +=
                u64::try_from(seg.duration.as_nanos()).unwrap_or(u64::MAX);
        }
    }
    let mut labels: Vec<(String, usize)> = row_of.into_iter().collect();
    let key = |r: usize| {
        (
            quantile(&rows[r], opts.sort_quantile),
            rows[r].iter().sum::<u64>(),
        )
    };
    labels.sort_by(|a, b| key(b.1).cmp(&key(a.1)).then_with(|| a.0.cmp(&b.0)));
    labels.truncate(opts.max_rows.max(1));
    let mut cells = Vec::with_capacity(labels.len() * ncols);
    let mut top_chains = Vec::with_capacity(labels.len());
    for (_, r) in &labels {
        cells.extend_from_slice(&rows[*r]);
        let mut v: Vec<(String, u64)> = chains[*r].drain().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        v.truncate(5);
        top_chains.push(v);
    }
    HeatMap {
        rows: labels.into_iter().map(|(l, _)| l).collect(),
        cols: picked
            .iter()
            .map(|&i| {
                let r = records[i];
                Column {
                    trace: r
                        .trace_id
                        .clone()
                        .or_else(|| r.request_id.clone())
                        .unwrap_or_default(),
                    endpoint: format!("{} {}", r.service, r.endpoint.as_deref().unwrap_or("")),
                    latency_ns: u64::try_from(r.latency.as_nanos()).unwrap_or(u64::MAX),
                }
            })
            .collect(),
        cells,
        chains: top_chains,
        traces_total: records.len(),
    }
}

/// The self-contained HTML page.
pub fn to_html(map: &HeatMap, title: &str, sort_quantile: f64) -> String {
    let data = serde_json::to_string(map)
        .expect("a heat map serializes; this is a bug")
        .replace("</", "<\\/");
    let mut s = String::with_capacity(data.len() + PAGE.len() + 256);
    let title = html_escape(title);
    let q = (sort_quantile * 100.0).round();
    let _ = write!(
        s,
        "{}",
        PAGE.replace("{{TITLE}}", &title)
            .replace("{{DATA}}", &data)
            .replace("{{SORTQ}}", &format!("{q}"))
    );
    s
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const PAGE: &str = r##"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{{TITLE}}</title>
<style>
 body { font: 13px/1.4 system-ui, sans-serif; margin: 16px; color: #222; background: #fff; }
 h1 { font-size: 18px; margin: 0 0 4px; }
 .sub { color: #666; margin-bottom: 10px; }
 .controls { margin: 8px 0 12px; display: flex; gap: 16px; align-items: center; flex-wrap: wrap; }
 select { font: inherit; }
 #wrap { overflow: auto; border: 1px solid #ddd; max-height: 80vh; }
 #tip { position: fixed; pointer-events: none; background: #222; color: #fff; padding: 6px 8px;
        border-radius: 4px; font-size: 12px; display: none; white-space: pre; z-index: 2; }
 .legend { display: inline-flex; align-items: center; gap: 6px; }
 .legend canvas { border: 1px solid #ccc; }
</style></head>
<body>
<h1>{{TITLE}}</h1>
<div class="sub" id="sub"></div>
<div class="controls">
 <label>Sort operations by <select id="q">
  <option value="50">P50</option><option value="90">P90</option><option value="95">P95</option>
  <option value="99">P99</option><option value="100">max</option><option value="mean">mean</option>
 </select> of exclusive time</label>
 <label>Columns <select id="cols"><option value="lat">latency, slowest first</option>
  <option value="top">top row's time, largest first</option></select></label>
 <span class="legend">share of trace latency <span>0%</span><canvas id="leg" width="160" height="12"></canvas><span>100%</span></span>
</div>
<div id="wrap"><canvas id="c"></canvas></div>
<div id="tip"></div>
<script>
const D = {{DATA}};
const SORTQ = "{{SORTQ}}";
const R = D.rows.length, C = D.cols.length;
const cell = (r, c) => D.cells[r * C + c];
function fmt(ns) {
  if (ns >= 1e9) return (ns / 1e9).toFixed(2) + " s";
  if (ns >= 1e6) return (ns / 1e6).toFixed(2) + " ms";
  if (ns >= 1e3) return (ns / 1e3).toFixed(1) + " µs";
  return ns + " ns";
}
function quant(vals, q) {
  if (!vals.length) return 0;
  const v = vals.slice().sort((a, b) => a - b);
  if (q === "mean") return v.reduce((a, b) => a + b, 0) / v.length;
  const rank = Math.ceil(Number(q) / 100 * v.length);
  return v[Math.min(Math.max(rank - 1, 0), v.length - 1)];
}
function color(share) {
  if (share <= 0) return "#f3f3f3";
  const t = Math.sqrt(Math.min(share, 1));
  // white-yellow -> orange -> dark red
  const r = 255 - Math.round(90 * Math.max(0, t - 0.6) / 0.4);
  const g = Math.round(245 - 215 * t);
  const b = Math.round(200 - 190 * Math.min(1, t * 1.6));
  return `rgb(${r},${g},${Math.max(b, 10)})`;
}
const leg = document.getElementById("leg").getContext("2d");
for (let x = 0; x < 160; x++) { leg.fillStyle = color(x / 159); leg.fillRect(x, 0, 1, 12); }
document.getElementById("sub").textContent =
  `${R} operations × ${C} traces` + (D.traces_total > C ? ` (sampled at even latency ranks from ${D.traces_total})` : "") +
  `; cell = the operation's exclusive time on the trace's critical path`;
const qSel = document.getElementById("q"), cSel = document.getElementById("cols");
qSel.value = ["50","90","95","99","100"].includes(SORTQ) ? SORTQ : "50";
let rowOrder = [], colOrder = [];
const cv = document.getElementById("c"), ctx = cv.getContext("2d");
const LABEL = 300, TOP = 60, CH = 16;
let CW = 4;
function layout() {
  const q = qSel.value;
  const keys = D.rows.map((_, r) => {
    const vals = []; for (let c = 0; c < C; c++) vals.push(cell(r, c));
    return [quant(vals, q), vals.reduce((a, b) => a + b, 0)];
  });
  rowOrder = D.rows.map((_, r) => r).sort((a, b) => (keys[b][0] - keys[a][0]) || (keys[b][1] - keys[a][1]) || (a - b));
  colOrder = D.cols.map((_, c) => c);
  if (cSel.value === "top" && R > 0) {
    const top = rowOrder[0];
    colOrder.sort((a, b) => (cell(top, b) - cell(top, a)) || (D.cols[b].latency_ns - D.cols[a].latency_ns));
  }
  draw(keys, q);
}
function draw(keys, q) {
  const avail = Math.max(400, window.innerWidth - 60 - LABEL - 110);
  CW = Math.max(1, Math.min(14, Math.floor(avail / Math.max(C, 1))));
  const dpr = window.devicePixelRatio || 1;
  const W = LABEL + C * CW + 110, H = TOP + R * CH + 10;
  cv.width = W * dpr; cv.height = H * dpr; cv.style.width = W + "px"; cv.style.height = H + "px";
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, W, H);
  // latency bars on top
  const maxLat = Math.max(1, ...D.cols.map(c => c.latency_ns));
  ctx.fillStyle = "#7a8fb8";
  colOrder.forEach((c, i) => {
    const h = Math.max(1, Math.round((TOP - 14) * D.cols[c].latency_ns / maxLat));
    ctx.fillRect(LABEL + i * CW, TOP - 4 - h, Math.max(1, CW - (CW > 3 ? 1 : 0)), h);
  });
  ctx.fillStyle = "#444"; ctx.font = "11px system-ui, sans-serif"; ctx.textAlign = "right";
  ctx.fillText("trace latency (max " + fmt(maxLat) + ")", LABEL - 6, TOP - 8);
  rowOrder.forEach((r, y) => {
    ctx.fillStyle = "#222"; ctx.textAlign = "right";
    let label = D.rows[r]; if (label.length > 46) label = label.slice(0, 45) + "…";
    ctx.fillText(label, LABEL - 6, TOP + y * CH + 12);
    colOrder.forEach((c, x) => {
      const v = cell(r, c), lat = D.cols[c].latency_ns;
      ctx.fillStyle = color(lat > 0 ? v / lat : 0);
      ctx.fillRect(LABEL + x * CW, TOP + y * CH, Math.max(1, CW - (CW > 3 ? 1 : 0)), CH - 1);
    });
    ctx.fillStyle = "#555"; ctx.textAlign = "left";
    ctx.fillText(fmt(Math.round(keys[r][0])), LABEL + C * CW + 6, TOP + y * CH + 12);
  });
  ctx.fillStyle = "#444"; ctx.textAlign = "left";
  ctx.fillText((q === "mean" ? "mean" : q === "100" ? "max" : "P" + q), LABEL + C * CW + 6, TOP - 8);
}
const tip = document.getElementById("tip");
cv.addEventListener("mousemove", e => {
  const rect = cv.getBoundingClientRect();
  const x = Math.floor((e.clientX - rect.left - LABEL) / CW), y = Math.floor((e.clientY - rect.top - TOP) / CH);
  if (x < 0 && y >= 0 && y < R) {
    const r = rowOrder[y];
    tip.textContent = D.rows[r] + "\ntop call chains (time over these traces):\n" +
      D.chains[r].map(([c, ns]) => "  " + fmt(ns) + "  " + c).join("\n");
    tip.style.left = (e.clientX + 14) + "px"; tip.style.top = (e.clientY + 14) + "px"; tip.style.display = "block";
    return;
  }
  if (x < 0 || x >= C || y < 0 || y >= R) { tip.style.display = "none"; return; }
  const r = rowOrder[y], c = colOrder[x], col = D.cols[c], v = cell(r, c);
  tip.textContent = `${D.rows[r]}\ntrace ${col.trace}  (${col.endpoint})\nexclusive ${fmt(v)}  = ${(100 * v / Math.max(col.latency_ns, 1)).toFixed(1)}% of ${fmt(col.latency_ns)}`;
  tip.style.left = (e.clientX + 14) + "px"; tip.style.top = (e.clientY + 14) + "px"; tip.style.display = "block";
});
cv.addEventListener("mouseleave", () => tip.style.display = "none");
qSel.addEventListener("change", layout); cSel.addEventListener("change", layout);
window.addEventListener("resize", layout);
layout();
</script>
</body></html>
"##;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use cpt_sdk::{CriticalPath, Frame, SegmentKind, Trigger};

    use super::*;

    fn rec(id: &str, db_ms: u64, cache_ms: u64) -> Record {
        let mut p = CriticalPath::new();
        p.push_frames(
            [Frame::new("A", "/x")],
            Duration::from_millis(1),
            SegmentKind::Busy,
        );
        p.push_frames(
            [Frame::new("A", "/x"), Frame::new("B", "db")],
            Duration::from_millis(db_ms),
            SegmentKind::Busy,
        );
        p.push_frames(
            [Frame::new("A", "/x"), Frame::new("C", "cache")],
            Duration::from_millis(cache_ms),
            SegmentKind::Busy,
        );
        let mut r = Record::new("A", Trigger::Sampled, p);
        r.trace_id = Some(id.into());
        r
    }

    #[test]
    fn cells_are_exclusive_time_rows_sorted_by_percentile_columns_by_latency() {
        // db is large in one trace only; cache is moderate in all.
        let rs = [rec("t1", 50, 5), rec("t2", 0, 6), rec("t3", 0, 7)];
        let refs: Vec<&Record> = rs.iter().collect();
        let m = build(&refs, &HeatMapOptions::default());
        assert_eq!(m.cols[0].trace, "t1");
        // P50: cache 6 ms > /x 1 ms > db 0.
        assert_eq!(m.rows, ["cache (C)", "/x (A)", "db (B)"]);
        assert_eq!(m.cell(0, 0), 5_000_000);
        assert_eq!(m.cell(2, 0), 50_000_000);
        assert_eq!(
            m.chains[2],
            vec![("/x (A) → db (B)".to_string(), 50_000_000)]
        );
        // By max, db leads.
        let m = build(
            &refs,
            &HeatMapOptions {
                sort_quantile: 1.0,
                ..Default::default()
            },
        );
        assert_eq!(m.rows[0], "db (B)");
        let html = to_html(&m, "t <x>", 1.0);
        assert!(html.contains("t &lt;x&gt;") && html.contains("\"rows\":[\"db (B)\""));
        assert!(
            !html.contains("http://") && !html.contains("https://"),
            "self-contained"
        );
    }

    #[test]
    fn many_traces_are_sampled_at_even_latency_ranks() {
        let rs: Vec<Record> = (1..=100).map(|i| rec(&format!("t{i}"), i, 1)).collect();
        let refs: Vec<&Record> = rs.iter().collect();
        let m = build(
            &refs,
            &HeatMapOptions {
                max_traces: 10,
                ..Default::default()
            },
        );
        assert_eq!(m.cols.len(), 10);
        assert_eq!(m.cols[0].trace, "t100");
        assert_eq!(m.cols[9].trace, "t1");
        assert_eq!(m.traces_total, 100);
    }
}
