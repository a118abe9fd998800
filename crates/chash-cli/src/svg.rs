//! Hand-written SVG charts for reports: bar charts (with a target mark per
//! bar), grouped bars, and a ring diagram. Self-contained markup, no scripts,
//! no external fonts.

use std::fmt::Write as _;

/// A colour per series or node, repeating after ten.
pub const PALETTE: [&str; 10] =
    ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];

/// Escapes text for SVG/HTML.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// One bar: a label, a value and an optional target drawn as a mark.
#[derive(Clone, Debug)]
pub struct Bar {
    /// Shown under the bar.
    pub label: String,
    /// Bar height.
    pub value: f64,
    /// Drawn as a dark line across the bar (e.g. the fair share).
    pub target: Option<f64>,
}

fn nice_max(v: f64) -> f64 {
    if v <= 0.0 {
        return 1.0;
    }
    let mag = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if v <= m * mag {
            return m * mag;
        }
    }
    10.0 * mag
}

fn axis(out: &mut String, x0: f64, y0: f64, h: f64, w: f64, max: f64, unit: &str) {
    for i in 0..=4 {
        let v = max * f64::from(i) / 4.0;
        let y = y0 + h - h * f64::from(i) / 4.0;
        let _ = write!(
            out,
            r##"<line x1="{x0}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end" fill="#555">{}{}</text>"##,
            x0 + w,
            x0 - 6.0,
            y + 4.0,
            fmt_num(v),
            esc(unit)
        );
    }
}

fn fmt_num(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// The bar charts' plot area: width, height, left and top margins.
const PLOT: (f64, f64, f64, f64) = (640.0, 220.0, 60.0, 36.0);

/// Opens a bar chart: the `<svg>` element sized for the plot area plus
/// `below` for labels, the title, and the value axis up to `max`.
fn open_chart(title: &str, unit: &str, max: f64, below: f64) -> String {
    let (w, h, left, top) = PLOT;
    let mut out = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif"><text x="{left}" y="20" font-size="14" font-weight="bold">{}</text>"##,
        w + left + 20.0,
        h + top + below,
        esc(title)
    );
    axis(&mut out, left, top, h, w, max, unit);
    out
}

/// A bar chart.
pub fn bar_chart(title: &str, unit: &str, bars: &[Bar]) -> String {
    let (w, h, left, top) = PLOT;
    let max = nice_max(bars.iter().map(|b| b.value.max(b.target.unwrap_or(0.0))).fold(0.0, f64::max));
    let mut out = open_chart(title, unit, max, 50.0);
    let slot = w / bars.len().max(1) as f64;
    for (i, b) in bars.iter().enumerate() {
        let bh = h * b.value / max;
        // The value sits above the bar and above its target mark.
        let label_y = top + h - bh.max(h * b.target.unwrap_or(0.0) / max) - 6.0;
        let x = left + slot * i as f64 + slot * 0.15;
        let bw = slot * 0.7;
        let _ = write!(
            out,
            r##"<rect x="{x:.1}" y="{:.1}" width="{bw:.1}" height="{bh:.1}" fill="{}"><title>{}: {}{}</title></rect><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="middle">{}</text><text x="{:.1}" y="{:.1}" font-size="10" text-anchor="middle" fill="#333">{}{}</text>"##,
            top + h - bh,
            PALETTE[i % PALETTE.len()],
            esc(&b.label),
            fmt_num(b.value),
            esc(unit),
            x + bw / 2.0,
            top + h + 16.0,
            esc(&b.label),
            x + bw / 2.0,
            label_y,
            fmt_num(b.value),
            esc(unit)
        );
        if let Some(t) = b.target {
            let y = top + h - h * t / max;
            let _ = write!(
                out,
                r##"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#222" stroke-width="2" stroke-dasharray="4 2"><title>target {}{}</title></line>"##,
                x - 4.0,
                x + bw + 4.0,
                fmt_num(t),
                esc(unit)
            );
        }
    }
    if bars.iter().any(|b| b.target.is_some()) {
        let _ = write!(
            out,
            r##"<line x1="{left}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#222" stroke-width="2" stroke-dasharray="4 2"/><text x="{:.1}" y="{:.1}" font-size="11">target (fair share)</text>"##,
            top + h + 34.0,
            left + 24.0,
            top + h + 34.0,
            left + 30.0,
            top + h + 38.0
        );
    }
    out.push_str("</svg>");
    out
}

/// Grouped bars: one group per category, one bar per series.
pub fn grouped_bars(title: &str, unit: &str, categories: &[String], series: &[(String, Vec<f64>)]) -> String {
    let (w, h, left, top) = PLOT;
    let max = nice_max(series.iter().flat_map(|s| s.1.iter().copied()).fold(0.0, f64::max));
    let mut out = open_chart(title, unit, max, 60.0);
    let group = w / categories.len().max(1) as f64;
    let bw = group * 0.8 / series.len().max(1) as f64;
    for (c, cat) in categories.iter().enumerate() {
        for (s, (name, values)) in series.iter().enumerate() {
            let v = values.get(c).copied().unwrap_or(0.0);
            let bh = h * v / max;
            let x = left + group * c as f64 + group * 0.1 + bw * s as f64;
            let _ = write!(
                out,
                r##"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{bh:.1}" fill="{}"><title>{} / {}: {}{}</title></rect><text x="{:.1}" y="{:.1}" font-size="10" text-anchor="middle" fill="#333">{}</text>"##,
                top + h - bh,
                bw * 0.92,
                PALETTE[s % PALETTE.len()],
                esc(cat),
                esc(name),
                fmt_num(v),
                esc(unit),
                x + bw * 0.46,
                top + h - bh - 4.0,
                fmt_num(v)
            );
        }
        let _ = write!(
            out,
            r##"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="middle">{}</text>"##,
            left + group * c as f64 + group / 2.0,
            top + h + 16.0,
            esc(cat)
        );
    }
    for (s, (name, _)) in series.iter().enumerate() {
        let x = left + 150.0 * s as f64;
        let _ = write!(
            out,
            r##"<rect x="{x:.1}" y="{:.1}" width="12" height="12" fill="{}"/><text x="{:.1}" y="{:.1}" font-size="11">{}</text>"##,
            top + h + 30.0,
            PALETTE[s % PALETTE.len()],
            x + 16.0,
            top + h + 40.0,
            esc(name)
        );
    }
    out.push_str("</svg>");
    out
}

/// A ring diagram: each arc of the hash space coloured by its owner.
/// `arcs` are `(start, end, owner)` as fractions of the space (0..1).
pub fn ring_diagram(title: &str, arcs: &[(f64, f64, usize)], names: &[String]) -> String {
    let (cx, cy, r) = (170.0, 190.0, 130.0);
    let mut out = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="560" height="380" font-family="sans-serif"><text x="20" y="22" font-size="14" font-weight="bold">{}</text>"##,
        esc(title)
    );
    for &(a, b, owner) in arcs {
        if b <= a {
            continue;
        }
        let (a0, a1) = (
            a * std::f64::consts::TAU - std::f64::consts::FRAC_PI_2,
            b * std::f64::consts::TAU - std::f64::consts::FRAC_PI_2,
        );
        let large = u8::from(b - a > 0.5);
        let _ = write!(
            out,
            r##"<path d="M {:.2} {:.2} A {r} {r} 0 {large} 1 {:.2} {:.2}" stroke="{}" stroke-width="34" fill="none"/>"##,
            cx + r * a0.cos(),
            cy + r * a0.sin(),
            cx + r * a1.cos(),
            cy + r * a1.sin(),
            PALETTE[owner % PALETTE.len()]
        );
    }
    for (i, name) in names.iter().enumerate() {
        let y = 60.0 + 22.0 * i as f64;
        let _ = write!(
            out,
            r##"<rect x="350" y="{:.1}" width="14" height="14" fill="{}"/><text x="372" y="{:.1}" font-size="12">{}</text>"##,
            y - 11.0,
            PALETTE[i % PALETTE.len()],
            y,
            esc(name)
        );
    }
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_wellformed_svg() {
        let bars = vec![
            Bar { label: "a<b".into(), value: 12.5, target: Some(10.0) },
            Bar { label: "c".into(), value: 7.0, target: None },
        ];
        let svg = bar_chart("t & t", "%", &bars);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert!(svg.contains("a&lt;b") && svg.contains("t &amp; t"));
        assert_eq!(svg.matches("<rect").count(), 2);
        let g = grouped_bars(
            "g",
            "",
            &["x".into(), "y".into()],
            &[("s1".into(), vec![1.0, 2.0]), ("s2".into(), vec![3.0, 4.0])],
        );
        assert_eq!(g.matches("<rect").count(), 4 + 2);
        assert!(g.contains(">4.00<"), "values are printed on the bars");
        let r = ring_diagram("r", &[(0.0, 0.3, 0), (0.3, 1.0, 1)], &["n0".into(), "n1".into()]);
        assert_eq!(r.matches("<path").count(), 2);
    }

    #[test]
    fn nice_axis_maxima() {
        assert_eq!(nice_max(0.0), 1.0);
        assert_eq!(nice_max(7.3), 10.0);
        assert_eq!(nice_max(12.0), 20.0);
        assert_eq!(nice_max(240.0), 250.0);
    }
}
