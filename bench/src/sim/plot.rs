//! `--plot DIR`: two SVG charts of a simulation, drawn by hand (no plotting dependency): the TTFT CDF
//! of every policy (log-scaled time axis) and each policy's hit ratio stacked by tier.

use std::fmt::Write as _;
use std::path::Path;

use super::report::SimReport;

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 420.0;
const MARGIN: f64 = 60.0;
const COLOURS: [&str; 8] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"];

/// Writes `ttft_cdf.svg` and `hit_ratio.svg` into `dir` (created if needed).
pub fn write(report: &SimReport, dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("ttft_cdf.svg"), ttft_cdf(report))?;
    std::fs::write(dir.join("hit_ratio.svg"), hit_ratio(report))?;
    Ok(())
}

fn header(title: &str) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" font-family=\"sans-serif\" \
         font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">{title}</text>\n",
        WIDTH / 2.0
    )
}

fn ttft_cdf(report: &SimReport) -> String {
    let all = report.results.iter().flat_map(|r| r.ttft_sorted_s.iter().copied());
    let (low, high) = all.fold((f64::INFINITY, 0.0f64), |(lo, hi), v| (lo.min(v.max(1e-4)), hi.max(v)));
    let (low, high) =
        if low.is_finite() && high > low { (low.log10().floor(), high.log10().ceil()) } else { (-3.0, 1.0) };
    let x = |seconds: f64| MARGIN + (seconds.max(1e-4).log10() - low) / (high - low) * (WIDTH - 2.0 * MARGIN);
    let mut svg = header("TTFT CDF per policy");
    axes(&mut svg);
    let mut decade = low;
    while decade <= high {
        let at = x(10f64.powf(decade));
        let _ = writeln!(
            svg,
            "<text x=\"{at:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}s</text>",
            HEIGHT - MARGIN + 16.0,
            10f64.powf(decade)
        );
        decade += 1.0;
    }
    fraction_ticks(&mut svg, &[0.0, 0.5, 0.9, 0.99, 1.0]);
    for (i, result) in report.results.iter().enumerate() {
        let n = result.ttft_sorted_s.len().max(1) as f64;
        let step = (result.ttft_sorted_s.len() / 400).max(1);
        let points: Vec<String> = result
            .ttft_sorted_s
            .iter()
            .enumerate()
            .filter(|(k, _)| k % step == 0 || *k + 1 == result.ttft_sorted_s.len())
            .map(|(k, &t)| format!("{:.1},{:.1}", x(t), y_of((k + 1) as f64 / n)))
            .collect();
        let colour = COLOURS[i % COLOURS.len()];
        let _ = writeln!(
            svg,
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" points=\"{}\"/>",
            points.join(" ")
        );
        legend(&mut svg, i, colour, &result.policy);
    }
    svg.push_str("</svg>\n");
    svg
}

fn hit_ratio(report: &SimReport) -> String {
    let mut svg = header(&format!("Hit ratio per tier (one infinite cache: {:.3})", report.bound_hit_ratio));
    axes(&mut svg);
    let count = report.results.len().max(1) as f64;
    let slot = (WIDTH - 2.0 * MARGIN) / count;
    fraction_ticks(&mut svg, &[0.0, 0.25, 0.5, 0.75, 1.0]);
    let bound = y_of(report.bound_hit_ratio);
    let _ = writeln!(
        svg,
        "<line x1=\"{MARGIN}\" x2=\"{}\" y1=\"{bound:.1}\" y2=\"{bound:.1}\" stroke=\"black\" stroke-dasharray=\"4 3\"/>",
        WIDTH - MARGIN
    );
    for (i, result) in report.results.iter().enumerate() {
        let left = MARGIN + i as f64 * slot + slot * 0.15;
        let mut base = 0.0;
        for (tier, value, colour) in [
            ("gpu", result.hit_ratio_gpu, COLOURS[0]),
            ("host", result.hit_ratio_host, COLOURS[2]),
            ("network", result.hit_ratio_network, COLOURS[3]),
        ] {
            let (top, bottom) = (y_of(base + value), y_of(base));
            let _ = writeln!(
                svg,
                "<rect x=\"{left:.1}\" y=\"{top:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{colour}\"><title>{tier} {value:.3}</title></rect>",
                slot * 0.7,
                bottom - top
            );
            base += value;
        }
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"10\">{}</text>",
            left + slot * 0.35,
            HEIGHT - MARGIN + 14.0,
            result.policy
        );
    }
    for (i, (tier, colour)) in
        [("gpu", COLOURS[0]), ("host", COLOURS[2]), ("network", COLOURS[3])].into_iter().enumerate()
    {
        legend(&mut svg, i, colour, tier);
    }
    svg.push_str("</svg>\n");
    svg
}

/// The vertical position of a fraction (0 at the bottom axis, 1 at the top).
fn y_of(fraction: f64) -> f64 {
    HEIGHT - MARGIN - fraction * (HEIGHT - 2.0 * MARGIN)
}

/// Labels of fractions along the vertical axis.
fn fraction_ticks(svg: &mut String, ticks: &[f64]) {
    for tick in ticks {
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{tick}</text>",
            MARGIN - 6.0,
            y_of(*tick) + 4.0
        );
    }
}

fn axes(svg: &mut String) {
    let _ = writeln!(
        svg,
        "<path d=\"M{MARGIN},{MARGIN} V{bottom} H{right}\" fill=\"none\" stroke=\"black\"/>",
        bottom = HEIGHT - MARGIN,
        right = WIDTH - MARGIN
    );
}

fn legend(svg: &mut String, index: usize, colour: &str, label: &str) {
    let y = MARGIN + 14.0 * index as f64;
    let x = WIDTH - MARGIN - 110.0;
    let _ = writeln!(svg, "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"10\" height=\"10\" fill=\"{colour}\"/>", y - 9.0);
    let _ = writeln!(svg, "<text x=\"{:.1}\" y=\"{y:.1}\">{label}</text>", x + 14.0);
}
