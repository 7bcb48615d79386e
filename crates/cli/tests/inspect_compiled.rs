//! `inspect --stage kernels` and `--stage dispatch --shape ...` on the bundled
//! BERT: the kernel families with their rates, and per step at each shape the
//! schedule chosen, fused attention's query blocks included.

use std::path::PathBuf;
use std::process::Command;

fn bert() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/bert/model.onnx")
        .display()
        .to_string()
}

fn anyshape(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_anyshape")).args(args).output().expect("run anyshape");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn kernels_and_dispatch_stages() {
    let m = bert();
    let (code, out, err) = anyshape(&["inspect", &m, "--stage", "kernels", "--threads", "2"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("contraction family, epilogue") && out.contains("direct kernels in f32: "), "{out}");
    assert!(out.contains("loop programs: ") && out.contains("threads: 2"), "{out}");

    let (code, out, err) = anyshape(&[
        "inspect",
        &m,
        "--stage",
        "dispatch",
        "--shape",
        "batch=1,seq=17",
        "--shape",
        "batch=2,seq=64",
        "--threads",
        "2",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("# stage: dispatch at batch=1,seq=17")
            && out.contains("# stage: dispatch at batch=2,seq=64")
    );
    // BERT's 2 heads: entries = batch × 2; the first shape's 17 queries, the second's 64.
    assert!(out.contains("fused attention over 2 entries, 17 queries x 17 keys, depth 16"), "{out}");
    assert!(out.contains("fused attention over 4 entries, 64 queries x 64 keys, depth 16"), "{out}");
    assert!(out.contains("matmul 1 x [17x96x32]") && out.contains("matmul 1 x [128x96x32]"), "{out}");
    assert!(out.contains("loop p") && out.contains("arena: "), "{out}");

    let (code, _, err) = anyshape(&["inspect", &m, "--stage", "dispatch"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--stage dispatch needs --shape"), "{err}");
    let (code, _, err) = anyshape(&["inspect", &m, "--stage", "dispatch", "--shape", "batch=1,seq=99"]);
    assert_eq!(code, Some(2), "{err}");
}

/// `inspect --stage programs --device cuda`: the GPU's plan (loop programs
/// with each kernel's schedule, contraction steps with their GEMM kernels),
/// and with `--dump-llvm` every kernel's PTX; other stages with a GPU device
/// refused.
#[test]
fn the_gpus_plan_and_its_ptx() {
    let m = bert();
    let dir = std::env::temp_dir().join(format!("anyshape-gpu-inspect-{}", std::process::id()));
    let d = dir.display().to_string();
    let (code, out, err) =
        anyshape(&["inspect", &m, "--stage", "programs", "--device", "cuda", "--dump-llvm", &d]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("the GPU's plan") && out.contains("gpu: a warp per row"), "{out}");
    assert!(out.contains("matmul ["), "no contraction step in the GPU's plan:\n{out}");
    assert!(out.contains("gemm_gemv_bf16_nt_1x4") && out.contains("(M <= 5)"), "{out}");
    assert!(
        out.contains("attention_p6_d16_o16: 64 query rows a block") && out.contains("2 fused attentions"),
        "{out}"
    );
    let ptx = std::fs::read_to_string(dir.join("programs.ptx")).expect("programs.ptx");
    let kernels = ptx.matches(".entry").count();
    assert!(ptx.contains(".entry operand_copy_bf16(") && ptx.contains("mma.sync.aligned.m16n8k16"), "{ptx}");
    assert!(ptx.contains(".entry attention_p6_d16_o16("), "no attention kernel in the PTX");
    assert!(kernels >= 5 && out.contains(&format!("({kernels} kernels)")), "{kernels} kernels:\n{out}");
    let _ = std::fs::remove_dir_all(&dir);
    let (code, _, err) = anyshape(&["inspect", &m, "--stage", "fusion", "--device", "cuda"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--stage programs"), "{err}");
}
