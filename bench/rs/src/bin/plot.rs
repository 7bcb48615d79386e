//! SVG plots of `bench/matmul_peers.py --json FILE` results.
//!
//!     plot --input results.json --out-dir bench/plots [--peak GFLOPS]
//!
//! The input is a list of rows {"batch", "m", "n", "k", "anyshape", "peak_fraction",
//! and one GFLOP/s figure per peer ("numpy", "onnxruntime", "openvino",
//! "gemm_crate", ...)}. One chart per shape family, GFLOP/s against T, one line per
//! system; `--peak` adds the measured peak as a dashed horizontal line. A family with
//! no rows in the input is skipped.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use plotters::prelude::*;
use serde_json::{Map, Value};

#[derive(Parser)]
#[command(about = "Plot matmul_peers.py JSON results as SVG, one chart per shape family")]
struct Args {
    /// JSON written by `bench/matmul_peers.py --json FILE`
    #[arg(long)]
    input: PathBuf,
    /// Folder for the SVGs (made if missing)
    #[arg(long, default_value = "bench/plots")]
    out_dir: PathBuf,
    /// Measured peak GFLOP/s, drawn as a dashed horizontal line
    #[arg(long)]
    peak: Option<f64>,
}

/// Line colours (Tableau 10), anyshape first; readable on white.
const COLORS: &[RGBColor] = &[
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x17, 0xbe, 0xcf),
    RGBColor(0xbc, 0xbd, 0x22),
    RGBColor(0x7f, 0x7f, 0x7f),
];

/// Keys of a row that are not a system's GFLOP/s.
const NOT_SYSTEMS: &[&str] = &["batch", "m", "n", "k", "peak_fraction"];

struct Family {
    name: &'static str,
    title: &'static str,
    x_label: &'static str,
    /// Does the row (batch, m, n, k) belong here?
    matches: fn(usize, usize, usize, usize) -> bool,
    /// Its x coordinate.
    x: fn(usize, usize, usize, usize) -> f64,
}

const FAMILIES: &[Family] = &[
    Family {
        name: "dense",
        title: "dense: X[16T, 768] · W[768, 2304]",
        x_label: "T (m = 16T)",
        matches: |b, _m, n, k| b == 1 && n == 2304 && k == 768,
        x: |_b, m, _n, _k| m as f64 / 16.0,
    },
    Family {
        name: "ffn-in",
        title: "ffn-in: X[T, 1024] · W[1024, 4096]",
        x_label: "T (m)",
        matches: |b, _m, n, k| b == 1 && n == 4096 && k == 1024,
        x: |_b, m, _n, _k| m as f64,
    },
    Family {
        name: "ffn-out",
        title: "ffn-out: X[T, 4096] · W[4096, 1024]",
        x_label: "T (m)",
        matches: |b, _m, n, k| b == 1 && n == 1024 && k == 4096,
        x: |_b, m, _n, _k| m as f64,
    },
    Family {
        name: "attention-qk",
        title: "attention Q·Kᵀ: [12, T, 64] · [12, 64, T]",
        x_label: "T (m = n)",
        matches: |b, m, n, k| b == 12 && k == 64 && m == n,
        x: |_b, m, _n, _k| m as f64,
    },
    Family {
        name: "attention-pv",
        title: "attention P·V: [12, T, T] · [12, T, 64]",
        x_label: "T (m = k)",
        matches: |b, m, n, k| b == 12 && n == 64 && m == k,
        x: |_b, m, _n, _k| m as f64,
    },
];

fn dim(row: &Map<String, Value>, key: &str) -> Result<usize, String> {
    row.get(key)
        .and_then(Value::as_u64)
        .map(|v| v as usize)
        .ok_or_else(|| format!("a row has no integer {key:?}: {}", Value::Object(row.clone())))
}

/// Every system named in the rows, anyshape first, then the peers by name. A
/// system's place here picks its colour, the same in every chart.
fn systems(rows: &[Map<String, Value>]) -> Vec<String> {
    let mut set = BTreeSet::new();
    for row in rows {
        for (key, v) in row {
            if !NOT_SYSTEMS.contains(&key.as_str()) && v.is_number() {
                set.insert(key.clone());
            }
        }
    }
    let mut order: Vec<String> = set.into_iter().collect();
    order.sort_by_key(|s| (s != "anyshape", s.clone()));
    order
}

/// Lines of one family: (colour index, system, points sorted by x); a system with
/// no figure in this family has no points.
type Lines = Vec<(usize, String, Vec<(f64, f64)>)>;

fn lines_for(family: &Family, rows: &[Map<String, Value>], systems: &[String]) -> Result<Lines, String> {
    let mut picked = Vec::new();
    for row in rows {
        let (b, m, n, k) = (dim(row, "batch")?, dim(row, "m")?, dim(row, "n")?, dim(row, "k")?);
        if (family.matches)(b, m, n, k) {
            picked.push(((family.x)(b, m, n, k), row));
        }
    }
    picked.sort_by(|a, b| a.0.total_cmp(&b.0));
    Ok(systems
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let pts = picked
                .iter()
                .filter_map(|(x, row)| row.get(s).and_then(Value::as_f64).map(|g| (*x, g)))
                .collect();
            (i, s.clone(), pts)
        })
        .collect())
}

fn draw(
    family: &Family,
    lines: &Lines,
    peak: Option<f64>,
    path: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let xs = lines.iter().flat_map(|(_, _, p)| p.iter().map(|q| q.0));
    let (x_min, x_max) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| (lo.min(x), hi.max(x)));
    let y_top = lines.iter().flat_map(|(_, _, p)| p.iter().map(|q| q.1)).fold(peak.unwrap_or(0.0), f64::max);
    let pad = ((x_max - x_min) * 0.03).max(0.5);
    let (x0, x1) = (x_min.min(0.0).max(x_min - pad), x_max + pad);

    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(family.title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(x0..x1, 0.0..(y_top * 1.08).max(1.0))?;
    chart
        .configure_mesh()
        .x_desc(family.x_label)
        .y_desc("GFLOP/s")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;

    for (i, system, pts) in lines {
        if pts.is_empty() {
            continue;
        }
        let color = COLORS[*i % COLORS.len()].to_rgba();
        let style = ShapeStyle { color, filled: false, stroke_width: 2 };
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), style).point_size(4))?
            .label(system.as_str())
            .legend(move |(x, y)| {
                EmptyElement::at((x, y))
                    + PathElement::new(vec![(0, 0), (20, 0)], style)
                    + Circle::new((10, 0), 4, color.filled())
            });
    }
    if let Some(p) = peak {
        let style = ShapeStyle { color: BLACK.mix(0.7), filled: false, stroke_width: 1 };
        chart
            .draw_series(DashedLineSeries::new(vec![(x0, p), (x1, p)], 8, 6, style))?
            .label(format!("measured peak ({p:.0} GFLOP/s)"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .draw()?;
    root.present()?;
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    let run = || -> Result<usize, Box<dyn std::error::Error>> {
        let text =
            std::fs::read_to_string(&args.input).map_err(|e| format!("{}: {e}", args.input.display()))?;
        let rows: Vec<Map<String, Value>> = serde_json::from_str(&text)
            .map_err(|e| format!("{}: expected a list of rows: {e}", args.input.display()))?;
        std::fs::create_dir_all(&args.out_dir).map_err(|e| format!("{}: {e}", args.out_dir.display()))?;
        let systems = systems(&rows);
        let mut written = 0;
        for family in FAMILIES {
            let lines = lines_for(family, &rows, &systems)?;
            if lines.iter().all(|(_, _, p)| p.is_empty()) {
                eprintln!("plot: {}: no rows, skipped", family.name);
                continue;
            }
            let path = args.out_dir.join(format!("{}.svg", family.name));
            draw(family, &lines, args.peak, &path)?;
            println!("{}", path.display());
            written += 1;
        }
        Ok(written)
    };
    match run() {
        Ok(0) => {
            eprintln!("plot: no row of {} belongs to a known shape family", args.input.display());
            ExitCode::FAILURE
        }
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("plot: {e}");
            ExitCode::FAILURE
        }
    }
}
