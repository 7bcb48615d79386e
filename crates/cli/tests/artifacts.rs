//! `anyshape compile -o`, then `anyshape run`/`bench` and `anyshape-rt`
//! (the runtime alone) on the artifact: ONNX Runtime's outputs on the bundled
//! cases; bad artifacts and flags are one-line errors with exit code 2.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("anyshape-cli-artifacts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    dir.join(name)
}

fn run(bin: &str, args: &[&str]) -> Output {
    Command::new(bin).args(args).output().expect("runs")
}

fn ok(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr: {err}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn assert_user_error(out: &Output, fragment: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one line, got: {err}");
    assert!(lines[0].contains(fragment), "`{fragment}` not in: {}", lines[0]);
}

/// `--input NAME=FILE` for every .npy of a case folder.
fn case_inputs(case: &Path) -> Vec<String> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(case).expect("case") {
        let p = e.expect("entry").path();
        if p.extension().is_some_and(|x| x == "npy") {
            let name = p.file_stem().expect("stem").to_string_lossy().into_owned();
            v.push("--input".to_string());
            v.push(format!("{name}={}", p.display()));
        }
    }
    v
}

/// Little-endian f32 values of a .npy file written by numpy or by us.
fn f32s(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).expect("npy");
    let header = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    bytes[10 + header..].chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

#[test]
fn compile_then_run_without_the_compiler() {
    let anyshape = env!("CARGO_BIN_EXE_anyshape");
    let rt = env!("CARGO_BIN_EXE_anyshape-rt");
    let model = root().join("tests/fixtures/bert/model.onnx");
    let art = tmp("bert.anyshape");
    let out = ok(&run(
        anyshape,
        &["compile", &model.to_string_lossy(), "-o", &art.to_string_lossy(), "--threads", "2"],
    ));
    assert!(out.contains("wrote"), "{out}");

    for case in ["case0", "case2"] {
        let dir = root().join("tests/fixtures/bert").join(case);
        let outdir = tmp(&format!("out-{case}"));
        let mut args = vec!["run".to_string(), art.to_string_lossy().into_owned()];
        args.extend(case_inputs(&dir));
        args.extend(["--output-dir".to_string(), outdir.to_string_lossy().into_owned()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        // The runtime alone, and the full CLI on the same artifact.
        for bin in [rt, anyshape] {
            ok(&run(bin, &args));
            for name in ["last_hidden_state", "pooler_output"] {
                let got = f32s(&outdir.join(format!("{name}.npy")));
                let want = f32s(&dir.join("expected").join(format!("{name}.npy")));
                assert_eq!(got.len(), want.len(), "{case} {name}");
                let worst =
                    got.iter().zip(&want).map(|(g, w)| (g - w).abs() / (1.0 + w.abs())).fold(0.0, f32::max);
                assert!(worst < 1e-4, "{case} {name}: off by {worst}");
            }
        }
    }

    let bench = ok(&run(rt, &["bench", &art.to_string_lossy(), "--shape", "batch=2,seq=9", "--runs", "3"]));
    assert!(bench.contains("loaded the artifact") && bench.contains("batch=2,seq=9: first call"), "{bench}");
    let bench =
        ok(&run(anyshape, &["bench", &art.to_string_lossy(), "--shape", "batch=1,seq=5", "--runs", "2"]));
    assert!(bench.contains("loaded the artifact"), "{bench}");
    // A range of shapes, each called once in order (a decoder's steps);
    // the planning reported within a first call.
    for bin in [rt, anyshape] {
        let once = ok(&run(bin, &["bench", &art.to_string_lossy(), "--shape", "batch=1,seq=3..5", "--once"]));
        for line in ["batch=1,seq=3: one call", "batch=1,seq=4: one call", "batch=1,seq=5: one call"] {
            assert!(once.contains(line), "{once}");
        }
        assert!(once.contains("3 shapes called once each, in order: median"), "{once}");
        let args = ["bench", &art.to_string_lossy(), "--shape", "batch=1,seq=3", "--runs", "2"];
        assert!(ok(&run(bin, &args)).contains("ms (planning "), "planning");
        assert_user_error(
            &run(bin, &["bench", &art.to_string_lossy(), "--shape", "batch=1,seq=5..3"]),
            "5..3",
        );
        assert_user_error(&run(bin, &[&args[..], &["--once", "--json"]].concat()), "--once");
    }
    // Calls after an idle pause, timed on their own.
    for bin in [rt, anyshape] {
        let args =
            ["bench", &art.to_string_lossy(), "--shape", "batch=1,seq=3", "--runs", "2", "--pause", "1.5"];
        let line = ok(&run(bin, &[&args[..], &["--json"]].concat()));
        assert!(line.contains("\"pause_ms\": 1.5, \"after_pause_ms\": "), "{line}");
        let text = ok(&run(bin, &args));
        assert!(text.contains("after a 2 ms pause") && text.contains("(median)"), "{text}");
        for bad in ["-1", "60001", "NaN"] {
            let bad_args =
                ["bench", &art.to_string_lossy(), "--shape", "batch=1,seq=3", &format!("--pause={bad}")];
            assert_user_error(&run(bin, &bad_args), "--pause");
        }
    }
    // A reader that stops early (`| head -1`) ends the program quietly, not in a panic.
    for bin in [rt, anyshape] {
        let mut child = Command::new(bin)
            .args(["bench", &art.to_string_lossy(), "--shape", "batch=1,seq=3", "--shape", "batch=1,seq=5"])
            .args(["--runs", "300"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("runs");
        let mut first = String::new();
        BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut first).expect("a line");
        assert!(first.contains("loaded the artifact"), "{first}");
        let out = child.wait_with_output().expect("exits");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "stderr: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let info = ok(&run(rt, &["info", &art.to_string_lossy()]));
    assert!(info.contains("input input_ids: i64 [batch, seq]"), "{info}");

    // The stages an artifact keeps read as the compiler printed them.
    let from_art = ok(&run(anyshape, &["inspect", &art.to_string_lossy(), "--stage", "programs"]));
    let from_onnx = ok(&run(anyshape, &["inspect", &model.to_string_lossy(), "--stage", "programs"]));
    // (Weights read only packed are kept only packed: the artifact says so.)
    assert!(from_art.contains("(packed weight)"), "{from_art}");
    let from_art = from_art.replace("(packed weight)", "(constant)");
    assert!(from_art.len() > 100 && from_onnx.starts_with(&from_art), "{from_art}");
    let dispatch = ok(&run(
        anyshape,
        &["inspect", &art.to_string_lossy(), "--stage", "dispatch", "--shape", "batch=1,seq=5"],
    ));
    assert!(dispatch.contains("fused attention"), "{dispatch}");
    assert_user_error(
        &run(anyshape, &["inspect", &art.to_string_lossy(), "--stage", "fusion"]),
        "programs, kernels and dispatch",
    );

    // Flags that only an ONNX model takes, and shapes the model rejects.
    assert_user_error(&run(anyshape, &["run", &art.to_string_lossy(), "--dim", "seq=1..8"]), "artifact");
    assert_user_error(
        &run(anyshape, &["bench", &art.to_string_lossy(), "--shape", "batch=1,seq=1", "--dim", "seq=1..8"]),
        "artifact",
    );
    assert_user_error(&run(rt, &["bench", &art.to_string_lossy(), "--shape", "batch=1"]), "seq");

    // A damaged artifact: one line, exit code 2, from both.
    let bytes = std::fs::read(&art).expect("read");
    let cut = tmp("cut.anyshape");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).expect("write");
    for bin in [rt, anyshape] {
        assert_user_error(
            &run(bin, &["bench", &cut.to_string_lossy(), "--shape", "batch=1,seq=1"]),
            "truncated",
        );
    }
    let mut flipped = bytes.clone();
    flipped[200] ^= 4;
    std::fs::write(&cut, &flipped).expect("write");
    assert_user_error(&run(rt, &["run", &cut.to_string_lossy()]), "corrupted");
    // An ONNX model is not an artifact for the runtime alone.
    assert_user_error(&run(rt, &["info", &model.to_string_lossy()]), "not an anyshape artifact");
    let _ = std::fs::remove_dir_all(tmp(""));
}
