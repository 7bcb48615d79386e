//! The wave model replayed on the committed device records: a replay of an
//! unchanged model gives back the regret the device run printed (so the replay is
//! the bench's choice, taken again), and bad records are errors that say where.

use gpu::candidates::plain_family;
use gpu::replay::{replay, Record, Regret, ReplayError};
use gpu::{BLayout, Elem, GemmKernel};

fn family() -> Vec<GemmKernel> {
    [Elem::Bf16, Elem::F16].into_iter().flat_map(plain_family).collect()
}

fn record(file: &str) -> Record {
    let path = format!("{}/../../bench/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    Record::parse(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The regret line the device run wrote last in its record.
fn printed_regret(file: &str) -> Regret {
    let path = format!("{}/../../bench/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(path).unwrap();
    let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    let r = &last["regret"];
    Regret {
        mean: r["model_mean"].as_f64().unwrap(),
        median: r["model_median"].as_f64().unwrap(),
        max: r["model_max"].as_f64().unwrap(),
    }
}

fn replayed_regret(rec: &Record) -> (Regret, usize) {
    let rows = replay(rec, &family()).unwrap();
    let regrets: Vec<f64> = rows.iter().filter_map(|r| r.regret()).collect();
    assert_eq!(regrets.len(), rows.len(), "every pick was measured");
    (Regret::of(&regrets), rows.len())
}

#[test]
fn the_h100_run_of_session_14_replays_to_its_printed_regret() {
    let file = "results-2026-11-26-gpu-h100-s14-bench.jsonl";
    let rec = record(file);
    assert_eq!(rec.rates.len(), 45);
    let (got, n) = replayed_regret(&rec);
    assert_eq!(n, 83);
    let want = printed_regret(file);
    for (g, w) in [(got.mean, want.mean), (got.median, want.median), (got.max, want.max)] {
        assert!((g - w).abs() < 1e-9, "replayed {got:?}, printed {want:?}");
    }
}

#[test]
fn the_h200_run_of_session_11_replays_to_its_printed_regret() {
    // Written before calibrations had a short product: the model falls back to its line.
    let file = "results-2026-11-26-gpu-h200-bench.jsonl";
    let rec = record(file);
    assert!(rec.rates.iter().all(|r| r.short == 0.0));
    let (got, _) = replayed_regret(&rec);
    let want = printed_regret(file);
    assert!((got.mean - want.mean).abs() < 1e-9 && (got.max - want.max).abs() < 1e-9, "{got:?} vs {want:?}");
}

#[test]
fn the_replayed_model_per_layout_holds_that_layouts_kernels() {
    let rec = record("results-2026-11-26-gpu-h100-s14-bench.jsonl");
    for layout in [BLayout::KMajor, BLayout::NMajor] {
        let m = rec.model(layout, &family()).unwrap();
        assert!(!m.kernels.is_empty());
        assert!(m.kernels.iter().all(|k| k.b == layout));
        assert!(m.kernels.iter().zip(&m.rates).all(|(k, r)| k.name() == r.name));
    }
}

#[test]
fn bad_records_are_errors_that_name_the_line() {
    let calib = r#"{"calibration":{"name":"gemm_bf16_nt_16x64_w1x4_s4","regs":40,"occupancy":10,"fixed":1e-6,"per_kstep":1e-7,"fixed_alone":1e-6,"per_kstep_alone":1e-7}}"#;
    let cases: [(String, &str); 5] = [
        (String::new(), "no calibration"),
        (format!("{calib}\n{{\"what\": 1}}"), "line 2"),
        (
            format!("{calib}\n{{\"layout\":\"nx\",\"batch\":1,\"m\":1,\"n\":8,\"k\":8,\"all\":{{}}}}"),
            "unknown layout",
        ),
        (
            format!(
                "{calib}\n{{\"layout\":\"nt\",\"batch\":1,\"m\":1,\"n\":8,\"k\":8,\"all\":{{\"x\":-1.0}}}}"
            ),
            "not a time",
        ),
        (calib[..40].to_string(), "line 1"),
    ];
    for (text, want) in cases {
        let e = Record::parse(&text).unwrap_err().to_string();
        assert!(e.contains(want), "{text:?}: {e}");
    }
    let unknown = calib.replace("16x64", "16x96");
    let rec = Record::parse(&unknown).unwrap();
    assert!(matches!(rec.model(BLayout::KMajor, &family()), Err(ReplayError::UnknownKernel(_))));
}
