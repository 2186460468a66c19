//! Folded stacks and flame graph SVGs of an [`Aggregate`] (CPT Fig. 3: "a
//! latency-critical path represented as columns of boxes, and each box
//! representing a subcomponent"), drawn by `inferno`.
//!
//! Folded stacks are Brendan Gregg's format, one line per sample stack:
//! frames root first joined with `;`, a space, and the stack's mean
//! critical-path nanoseconds per request (the profile's `critical_path`
//! value). Lines come in canonical stack order, so the text is
//! deterministic; stacks whose mean rounds to 0 ns are left out.

use std::fmt::Write as _;
use std::io;

use inferno::flamegraph::{self, Options};

use crate::format::fmt_ns;
use crate::profile::aggregate::{Aggregate, frame_label};
use crate::visible::visible;

/// A frame label made safe for the folded format (`;` separates frames and
/// line breaks separate stacks) and shown as a reader sees it
/// ([`visible`]: control characters as `␀`, `␛`, bidirectional and
/// invisible ones as `⟨U+202E⟩`), so the flame graph SVG is well-formed XML
/// whatever a service named its frames.
fn folded_frame(label: &str) -> String {
    visible(&label.replace(';', ":")).into_owned()
}

/// The aggregate as folded stacks (see the [module docs](self)).
///
/// # Examples
///
/// ```
/// # use std::time::Duration;
/// use cpt_collector::{aggregate::Aggregate, flame, selection::Selection};
/// use cpt_sdk::path::{CriticalPath, Frame, SegmentKind};
/// use cpt_sdk::{record::Record, trigger::Trigger};
///
/// let mut p = CriticalPath::new();
/// p.push_frames([Frame::new("A", "A1")], Duration::from_millis(1), SegmentKind::Busy);
/// p.push_frames([Frame::new("A", "A1"), Frame::new("B", "B1")], Duration::from_millis(2), SegmentKind::Network);
/// let agg = Aggregate::from_records(&Selection::new(), [Record::new("A", Trigger::Sampled, p)]);
/// assert_eq!(flame::folded(&agg), "A1 (A) 1000000\nA1 (A);B1 (B);[network] 2000000\n");
/// ```
pub fn folded(agg: &Aggregate) -> String {
    let labels: Vec<String> = agg
        .frames()
        .iter()
        .map(|f| folded_frame(&frame_label(f)))
        .collect();
    let mut out = String::new();
    for (s, mean) in agg.stacks().iter().zip(agg.mean_nanos()) {
        if mean == 0 {
            continue;
        }
        for (i, &f) in s.stack.iter().enumerate() {
            if i > 0 {
                out.push(';');
            }
            out.push_str(&labels[f as usize]);
        }
        let _ = writeln!(out, " {mean}");
    }
    out
}

/// Knobs for [`flame_svg`].
#[derive(Clone, Debug, Default)]
pub struct FlameOptions {
    /// Title; default "cpt critical path: mean LATENCY over N requests".
    pub title: Option<String>,
    /// Subtitle; default: the selection.
    pub subtitle: Option<String>,
    /// Draw icicles (root at the top) instead of flames.
    pub inverted: bool,
}

/// The title and subtitle (a selection, which names services and labels)
/// as a reader sees them ([`visible`]).
fn shown(o: &mut Options<'_>) {
    o.title = visible(&o.title).into_owned();
    if let Some(sub) = &o.subtitle {
        o.subtitle = Some(visible(sub).into_owned());
    }
}

/// The aggregate as a flame graph SVG.
///
/// # Errors
///
/// If the aggregate has no samples (inferno refuses to draw nothing) or
/// inferno fails.
pub fn flame_svg(agg: &Aggregate, opts: &FlameOptions) -> io::Result<Vec<u8>> {
    let text = folded(agg);
    if text.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "no critical-path time in the selection: nothing to draw",
        ));
    }
    let mut o = Options::default();
    o.title = opts.title.clone().unwrap_or_else(|| {
        format!(
            "cpt critical path: mean {} over {}",
            fmt_ns(agg.mean_latency().as_nanos() as u64),
            crate::format::plural(agg.requests(), "request")
        )
    });
    o.subtitle = opts.subtitle.clone().or_else(|| {
        agg.comments()
            .iter()
            .find_map(|c| c.strip_prefix("cpt selection: ").map(str::to_owned))
    });
    shown(&mut o);
    o.count_name = "ns/request".into();
    o.name_type = "Frame:".into();
    o.deterministic = true;
    o.hash = true;
    if opts.inverted {
        o.direction = flamegraph::Direction::Inverted;
    }
    let mut svg = Vec::new();
    flamegraph::from_lines(&mut o, text.lines(), &mut svg)?;
    Ok(svg)
}

/// A differential flame graph (inferno): frame widths are the test
/// selection's mean times, colours the change from the base selection (red:
/// slower, blue: faster), as `difffolded.pl` + `flamegraph.pl` draw it.
///
/// # Errors
///
/// If both aggregates are empty or inferno fails.
pub fn diff_flame_svg(
    base: &Aggregate,
    test: &Aggregate,
    opts: &FlameOptions,
) -> io::Result<Vec<u8>> {
    let mut diffed = Vec::new();
    inferno::differential::from_readers(
        inferno::differential::Options::default(),
        folded(base).as_bytes(),
        folded(test).as_bytes(),
        &mut diffed,
    )?;
    if diffed.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "both selections are empty: nothing to draw",
        ));
    }
    let mut o = Options::default();
    o.title = opts.title.clone().unwrap_or_else(|| {
        format!(
            "cpt diff: mean {} ({}) → {} ({})",
            fmt_ns(base.mean_latency().as_nanos() as u64),
            crate::format::plural(base.requests(), "request"),
            fmt_ns(test.mean_latency().as_nanos() as u64),
            crate::format::plural(test.requests(), "request")
        )
    });
    o.subtitle = opts.subtitle.clone();
    shown(&mut o);
    o.count_name = "ns/request".into();
    o.name_type = "Frame:".into();
    o.deterministic = true;
    if opts.inverted {
        o.direction = flamegraph::Direction::Inverted;
    }
    let text =
        String::from_utf8(diffed).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort_unstable();
    let mut svg = Vec::new();
    flamegraph::from_lines(&mut o, lines, &mut svg)?;
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::selection::Selection;
    use cpt_sdk::testing::fixtures::table1;

    #[test]
    fn cpt_table1_folded() {
        let agg = Aggregate::from_records(&Selection::new(), table1());
        assert_eq!(
            folded(&agg),
            "A1 (A) 5000000\nA1 (A);A2 (A) 5000000\nA1 (A);B1 (B) 2000000\n"
        );
    }

    #[test]
    fn cpt_table1_flame_svg_names_frames() {
        let agg = Aggregate::from_records(&Selection::new(), table1());
        let svg = String::from_utf8(flame_svg(&agg, &FlameOptions::default()).unwrap()).unwrap();
        assert!(svg.starts_with("<?xml"), "{}", &svg[..80]);
        for name in ["A1 (A)", "A2 (A)", "B1 (B)", "mean 12.00ms over 2 requests"] {
            assert!(svg.contains(name), "svg lacks {name}");
        }
    }

    #[test]
    fn cpt_table1_diff_flame_colours_changes() {
        let t = table1();
        let base = Aggregate::from_records(&Selection::new(), &t[..1]);
        let test = Aggregate::from_records(&Selection::new(), &t[1..]);
        let svg = diff_flame_svg(&base, &test, &FlameOptions::default()).unwrap();
        let svg = String::from_utf8(svg).unwrap();
        assert!(
            svg.contains("B1 (B)") && svg.contains("16.00ms (1 request)"),
            "{}",
            &svg[..400]
        );
        // B1 is new in the test arm (+4 ms of 8 ms), A2 gone (-10 ms).
        assert!(
            svg.contains("B1 (B) (4,000,000 ns/request, 50.00%; +50.00%)"),
            "{svg}"
        );
        // A1 self time fell from 6 to 4 ms: -2 ms of 8 ms.
        assert!(
            svg.contains("A1 (A) (8,000,000 ns/request, 100.00%; -25.00%)"),
            "{svg}"
        );
    }

    #[test]
    fn folded_escapes_separators() {
        assert_eq!(folded_frame("a;b\nc\0"), "a:b\u{240a}c\u{2400}");
        let empty =
            Aggregate::from_records(&Selection::new(), Vec::<cpt_sdk::record::Record>::new());
        assert!(flame_svg(&empty, &FlameOptions::default()).is_err());
    }
}
