//! `anyshape bench-matmul`: the JSON it prints holds a measured rate, the chosen
//! schedule, the dispatch times and (with --exhaustive) every model's regret; it
//! dumps the kernels' IR and assembly; bad flags are user errors (exit 2);
//! `--cold` takes copies of the weight in turn; a u8s8 convolution of codes
//! storing codes runs every candidate.

use std::process::{Command, Output};

fn anyshape(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_anyshape")).args(args).output().expect("run anyshape")
}

fn supported() -> bool {
    kernels::testing::avx2()
}

#[test]
fn prints_rates_schedules_regret_and_dumps_kernels() {
    if !supported() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("anyshape-bench-{}", std::process::id()));
    let (cache, dump) = (dir.join("cache"), dir.join("llvm"));
    let out = anyshape(&[
        "bench-matmul",
        "--m",
        "1,13",
        "--n",
        "40",
        "--k",
        "17",
        "--threads",
        "2",
        "--json",
        "--exhaustive",
        "--cache-dir",
        cache.to_str().unwrap(),
        "--dump-llvm",
        dump.to_str().unwrap(),
        "--hold",
        "0.05",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    for l in lines {
        for key in [
            "\"gflops\"",
            "\"schedule\"",
            "\"dispatch_first_us\"",
            "\"regret\"",
            "\"hierarchical\"",
            "\"rule\"",
        ] {
            assert!(l.contains(key), "{key} missing in {l}");
        }
        let g: f64 = l.split("\"gflops\": ").nth(1).unwrap().split(',').next().unwrap().parse().unwrap();
        assert!(g > 0.0, "{l}");
    }
    let names: Vec<String> = std::fs::read_dir(&dump)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().any(|n| n.ends_with(".ll")) && names.iter().any(|n| n.ends_with(".s")), "{names:?}");
    // The record now holds the tiles and the calibrated model for two threads.
    let record = std::fs::read_dir(&cache).unwrap().next().unwrap().unwrap().path();
    let json = std::fs::read_to_string(record).unwrap();
    assert!(json.contains("\"dram_bw\"") && json.contains("\"threads\": 2"), "{json}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The bf16 family (where the host has AVX-512 BF16): the JSON says so, and the
/// rates are against the bf16 peak; its tuning record is a file of its own.
#[test]
fn bf16_family_runs_and_reports_its_type() {
    if !kernels::testing::bf16() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("anyshape-bench-bf16-{}", std::process::id()));
    let cache = dir.join("cache");
    let out = anyshape(&[
        "bench-matmul",
        "--m",
        "1,13",
        "--n",
        "40",
        "--k",
        "17",
        "--dtype",
        "bf16",
        "--threads",
        "2",
        "--json",
        "--cache-dir",
        cache.to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(text.lines().count(), 2, "{text}");
    for l in text.lines() {
        assert!(l.contains("\"dtype\": \"bf16\""), "{l}");
        assert!(!l.contains("direct"), "a weight packed as bf16 is read by bf16 kernels: {l}");
    }
    let names: Vec<String> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().any(|n| n.starts_with("tiles-bf16-")), "{names:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A u8s8 convolution over codes storing codes (as a statically quantized
/// model's products run), a batch of images: every candidate runs, the
/// direct ones reading the codes in place, the packed ones copying them.
#[test]
fn u8s8_convolution_of_codes_storing_codes_runs_every_candidate() {
    if !kernels::testing::vnni() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("anyshape-bench-u8s8-{}", std::process::id()));
    let cache = dir.join("cache");
    let out = anyshape(&[
        "bench-matmul",
        "--n",
        "40",
        "--conv",
        "2x9x9x16:3x3:s1:p1",
        "--dtype",
        "u8s8",
        "--codes",
        "--exhaustive",
        "--threads",
        "2",
        "--json",
        "--cache-dir",
        cache.to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(text.lines().count(), 1, "{text}");
    let l = text.lines().next().unwrap_or_default();
    assert!(l.contains("\"dtype\": \"u8s8\"") && l.contains("\"m\": 162") && l.contains("\"k\": 144"), "{l}");
    assert!(l.contains("\"candidates\": ") && l.contains("\"regret\""), "{l}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_flags_are_user_errors() {
    for (args, fragment) in [
        (&["--model", "magic"][..], "unknown cost model"),
        (&["--tile", "8y32"][..], "expected MRxNR"),
        (&["--batch", "0"][..], "--batch"),
        (&["--hold=-1"][..], "--hold"),
        (&["--hold", "NaN"][..], "--hold"),
        (&["--dtype", "int4"][..], "unknown element type"),
        (&["--dtype", "bf16", "--avx2"][..], "AVX-512 BF16"),
        (&["--codes"][..], "--dtype u8s8"),
    ] {
        let mut all = vec!["bench-matmul", "--m", "4", "--n", "4", "--k", "4"];
        all.extend_from_slice(args);
        let out = anyshape(&all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(fragment), "{args:?}: {err}");
    }
}

#[test]
fn samples_are_categorized_the_kept_family_serves_them_and_trees_choose() {
    if !supported() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("anyshape-samples-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cache, samples, kept) = (dir.join("cache"), dir.join("samples.txt"), dir.join("kernels.json"));
    std::fs::write(&samples, "# a tiny workload\n13,40,17\n1,40,17,1,3\n9,9,16,4\n").unwrap();
    let path = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let out = anyshape(&[
        "tune",
        "--samples",
        &path(&samples),
        "--tolerance",
        "0.05",
        "--out",
        &path(&kept),
        "--threads",
        "2",
        "--cache-dir",
        &path(&cache),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for fragment in ["mean slowdown", "# chosen within 5.0%", "# compile: whole family", "kept / whole"] {
        assert!(text.contains(fragment), "{fragment} missing in {text}");
    }
    let list = std::fs::read_to_string(&kept).unwrap();
    assert!(list.contains("\"kernels\"") && list.contains("\"mr\""), "{list}");
    // The kept family runs the samples' shapes.
    let out = anyshape(&[
        "bench-matmul",
        "--m",
        "13,1",
        "--n",
        "40",
        "--k",
        "17",
        "--threads",
        "2",
        "--json",
        "--kernels",
        &path(&kept),
        "--cache-dir",
        &path(&cache),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 2);
    // A decision tree distilled from the model picks a schedule that runs.
    let out = anyshape(&[
        "bench-matmul",
        "--m",
        "5,33",
        "--n",
        "40",
        "--k",
        "17",
        "--threads",
        "2",
        "--json",
        "--tree",
        "--cache-dir",
        &path(&cache),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for line in text.lines() {
        for key in ["\"tree\"", "\"regret_vs_model\"", "\"leaves\"", "\"choose_ns\""] {
            assert!(line.contains(key), "{key} missing in {line}");
        }
    }
    // The Bayesian search over macro-kernels, its table used by bench-matmul.
    let tuned = dir.join("tuned.json");
    let out = anyshape(&[
        "tune",
        "--samples",
        &path(&samples),
        "--search",
        "bayes",
        "--budget",
        "6",
        "--out",
        &path(&tuned),
        "--threads",
        "2",
        "--cache-dir",
        &path(&cache),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for fragment in ["1x40x17: ", "4x9x16: ", "untuned", "classes tuned in", "written to"] {
        assert!(text.contains(fragment), "{fragment} missing in {text}");
    }
    let table: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&tuned).unwrap()).unwrap();
    assert_eq!(table["threads"], 2, "{table}");
    let out = anyshape(&[
        "bench-matmul",
        "--m",
        "13,1,200",
        "--n",
        "40",
        "--k",
        "17",
        "--threads",
        "2",
        "--json",
        "--tuned",
        &path(&tuned),
        "--cache-dir",
        &path(&cache),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 3);
    // A table for other threads, a missing one and a budget too small are user errors.
    let out = anyshape(&[
        "bench-matmul",
        "--m",
        "4",
        "--n",
        "40",
        "--k",
        "17",
        "--threads",
        "1",
        "--tuned",
        &path(&tuned),
        "--cache-dir",
        &path(&cache),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    let out = anyshape(&["bench-matmul", "--m", "4", "--n", "4", "--k", "4", "--tuned", "/nonexistent.json"]);
    assert_eq!(out.status.code(), Some(2));
    let out = anyshape(&["tune", "--samples", &path(&samples), "--search", "bayes", "--budget", "2"]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    // A bad samples file names its line; a missing kernel list is a user error.
    std::fs::write(&samples, "13,40,17\n13,forty,17\n").unwrap();
    let out = anyshape(&["tune", "--samples", &path(&samples), "--cache-dir", &path(&cache)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("line 2"), "{err}");
    let out =
        anyshape(&["bench-matmul", "--m", "4", "--n", "4", "--k", "4", "--kernels", "/nonexistent.json"]);
    assert_eq!(out.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--cold`: the weight's copies (enough to overflow L3) are taken in turn, and
/// the JSON says how many; without it, one weight.
#[test]
fn cold_weights_are_copies_taken_in_turn() {
    if !supported() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("anyshape-bench-cold-{}", std::process::id()));
    let run = |cold: bool| {
        let mut args = vec![
            "bench-matmul",
            "--m",
            "3",
            "--n",
            "96",
            "--k",
            "64",
            "--threads",
            "1",
            "--json",
            "--cache-dir",
        ];
        args.push(dir.to_str().unwrap());
        if cold {
            args.push("--cold");
        }
        let out = anyshape(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let copies: usize =
            text.split("\"weight_copies\": ").nth(1).unwrap().split(',').next().unwrap().parse().unwrap();
        let g: f64 = text.split("\"gflops\": ").nth(1).unwrap().split(',').next().unwrap().parse().unwrap();
        assert!(g > 0.0, "{text}");
        copies
    };
    assert_eq!(run(false), 1);
    // 96 x 64 floats are 24 KB: copies overflow any L3 one and a half times, up to 64.
    assert!(run(true) >= 2);
    let _ = std::fs::remove_dir_all(&dir);
}
