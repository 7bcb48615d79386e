//! Fused attention on the GPU backend (the attention kernel, FlashAttention-2's
//! schedule with `mma.sync`) on the host emulator against the interpreter: an
//! additive padding mask with queries and keys of different lengths (cross
//! attention), a causal mask, a mask of -inf over the leading keys (whole
//! chunks of a row weigh nothing); at lengths of 1, primes, a chunk of keys
//! (64) and one past it, past two; head dimensions 16, 32 and 64. The plan is
//! checked to hold the fused step (no silent fallback to the unfused steps),
//! and a head dimension the kernel is not built for (20) is checked to run
//! unfused.

#![cfg(feature = "gpu")]

mod common;

use anyshape::gpu::GpuTarget;
use anyshape::{Elems, LoadOptions, Model, Tensor};
use common::{shape_at, Lcg};
use plan::gpu::AttentionMma;

/// `softmax(Q·Kᵀ/4 + mask)·V` over `b × 3` heads of depth `D`, queries `q`, keys `k`.
fn padding_mask(d: usize) -> String {
    format!(
        r#"graph {{
  sym b param 1..3
  sym q param 1..200
  sym k param 1..2000
  input %qs: f32[b, 3, q, {d}]
  input %kt: f32[b, 3, {d}, k]
  input %v: f32[b, 3, k, {d}]
  input %mask: f32[b, 1, 1, k]
  %s: f32[b, 3, q, k] = matmul %qs, %kt
  %quarter: f32[1, 1, 1, 1] = constant [4.0]
  %qb: f32[b, 3, q, k] = broadcast %quarter
  %ss: f32[b, 3, q, k] = div %s, %qb
  %mb: f32[b, 3, q, k] = broadcast %mask
  %sm: f32[b, 3, q, k] = add %ss, %mb
  %mx: f32[b, 3, q, 1] = reduce_max[axes=[3], keep_dims=true] %sm
  %mxb: f32[b, 3, q, k] = broadcast %mx
  %sh: f32[b, 3, q, k] = sub %sm, %mxb
  %ex: f32[b, 3, q, k] = exp %sh
  %sum: f32[b, 3, q, 1] = reduce_sum[axes=[3], keep_dims=true] %ex
  %sumb: f32[b, 3, q, k] = broadcast %sum
  %p: f32[b, 3, q, k] = div %ex, %sumb
  %o: f32[b, 3, q, {d}] = matmul %p, %v
  output %o
}}
"#
    )
}

/// Self-attention of length `t`, depth 32, with a causal mask (key `j` seen by
/// query `i ≥ j`), its scale 1/√32.
const CAUSAL: &str = r#"graph {
  sym b param 1..3
  sym t param 1..200
  input %qs: f32[b, 2, t, 32]
  input %kt: f32[b, 2, 32, t]
  input %v: f32[b, 2, t, 32]
  %s0: f32[b, 2, t, t] = matmul %qs, %kt
  %scale: f32[1, 1, 1, 1] = constant [0.17677669]
  %scaleb: f32[b, 2, t, t] = broadcast %scale
  %s: f32[b, 2, t, t] = mul %s0, %scaleb
  %ri: i64[t, t] = iota[axis=0]
  %ci: i64[t, t] = iota[axis=1]
  %keep: bool[t, t] = less_eq %ci, %ri
  %keep4: bool[1, 1, t, t] = reshape %keep
  %keepb: bool[b, 2, t, t] = broadcast %keep4
  %low: f32[1, 1, 1, 1] = constant [-10000.0]
  %lowb: f32[b, 2, t, t] = broadcast %low
  %sm: f32[b, 2, t, t] = select %keepb, %s, %lowb
  %mx: f32[b, 2, t, 1] = reduce_max[axes=[3], keep_dims=true] %sm
  %mxb: f32[b, 2, t, t] = broadcast %mx
  %sh: f32[b, 2, t, t] = sub %sm, %mxb
  %ex: f32[b, 2, t, t] = exp %sh
  %sum: f32[b, 2, t, 1] = reduce_sum[axes=[3], keep_dims=true] %ex
  %sumb: f32[b, 2, t, t] = broadcast %sum
  %p: f32[b, 2, t, t] = div %ex, %sumb
  %o: f32[b, 2, t, 32] = matmul %p, %v
  output %o
}
"#;

/// `softmax(Q·Kᵀ·0.125 + lmask)·V`, depth 64, with a mask of -inf over the
/// first keys (left padding).
const LEFT_PADDED: &str = r#"graph {
  sym b param 1..2
  sym t param 1..200
  input %qs: f32[b, 2, t, 64]
  input %kt: f32[b, 2, 64, t]
  input %v: f32[b, 2, t, 64]
  input %lmask: f32[b, 1, 1, t]
  %s: f32[b, 2, t, t] = matmul %qs, %kt
  %eighth: f32[1, 1, 1, 1] = constant [0.125]
  %qb: f32[b, 2, t, t] = broadcast %eighth
  %ss: f32[b, 2, t, t] = mul %s, %qb
  %mb: f32[b, 2, t, t] = broadcast %lmask
  %sm: f32[b, 2, t, t] = add %ss, %mb
  %mx: f32[b, 2, t, 1] = reduce_max[axes=[3], keep_dims=true] %sm
  %mxb: f32[b, 2, t, t] = broadcast %mx
  %sh: f32[b, 2, t, t] = sub %sm, %mxb
  %ex: f32[b, 2, t, t] = exp %sh
  %sum: f32[b, 2, t, 1] = reduce_sum[axes=[3], keep_dims=true] %ex
  %sumb: f32[b, 2, t, t] = broadcast %sum
  %p: f32[b, 2, t, t] = div %ex, %sumb
  %o: f32[b, 2, t, 64] = matmul %p, %v
  output %o
}
"#;

/// `LEFT_PADDED` with its softmax's NaNs made 0 (PyTorch's scaled-dot-product
/// attention exported): `emask` masks a third of the first entry's keys and
/// every key of the second's, whose rows the interpreter gives 0.
fn nan_guarded() -> String {
    common::guard_softmax_nans(LEFT_PADDED, "[b, 2, t, t]")
}

fn model(text: &str) -> Model {
    let g = ir::parse_graph(text, &|_| None).unwrap_or_else(|e| panic!("{e}"));
    Model::from_ir(g, &LoadOptions::new()).unwrap_or_else(|e| panic!("{e}"))
}

/// Random inputs in [-1, 1) at the dims given; a padding mask of 0 and -10000
/// (the last keys padded), a left mask of -inf over up to two thirds of the
/// keys (one key stays).
fn inputs(m: &Model, dims: &[(&str, usize)], seed: u64) -> Vec<(String, Tensor)> {
    let mut rng = Lcg::new(seed);
    m.inputs()
        .into_iter()
        .map(|info| {
            let shape = shape_at(&info.ty, dims);
            let n: usize = shape.iter().product();
            let keys = *shape.last().expect("rank");
            let elems = match info.name.as_str() {
                "mask" => {
                    let keep = keys - (rng.next() as usize % keys.div_ceil(2));
                    Elems::F32((0..n).map(|i| if i % keys < keep { 0.0 } else { -10000.0 }).collect())
                }
                "emask" => Elems::F32(common::empty_rows_mask(n, keys)),
                "lmask" => {
                    let pad = rng.next() as usize % (2 * keys / 3 + 1);
                    Elems::F32((0..n).map(|i| if i % keys < pad { f32::NEG_INFINITY } else { 0.0 }).collect())
                }
                _ => Elems::F32((0..n).map(|_| rng.unit() / 2.0).collect()),
            };
            (info.name, Tensor::new(shape, elems).expect("tensor"))
        })
        .collect()
}

/// The bound on the relative L2 error of the output: Q, K, V and the
/// probabilities are rounded to bf16 (relative 2⁻⁹ each), so the logits are
/// off by about 2⁻⁹·Σ|q·k|·scale and the output by the probabilities'
/// and V's roundings (errors of independent terms, which average out).
const ATTENTION_L2: f64 = 1e-2;

/// The most any element is off, relative to the output's largest magnitude.
const ATTENTION_MAX: f64 = 5e-2;

/// Compile `m` for the emulated GPU, check its plan fused the attention on
/// the kernel (`fused`) or not, and compare it with the interpreter at each
/// of `shapes`; returns the largest relative L2 error seen.
fn check(m: &Model, fused: bool, shapes: &[Vec<(&str, usize)>]) -> f64 {
    let plan = anyshape::inspect::print_plan(&m.lower_gpu().expect("lower"));
    assert_eq!(plan.contains("attention, fused per block of query rows"), fused, "{plan}");
    let gm = m.compile_host_gpu().unwrap_or_else(|e| panic!("{e}"));
    compare(m, &gm, shapes)
}

fn compare<D: anyshape::gpu::Device>(
    m: &Model,
    gm: &anyshape::gpu::GpuModel<D>,
    shapes: &[Vec<(&str, usize)>],
) -> f64 {
    let mut worst: f64 = 0.0;
    for (seed, dims) in shapes.iter().enumerate() {
        let ins = inputs(m, dims, seed as u64);
        let named: Vec<(&str, Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        let want = m.interpret(&named).unwrap_or_else(|e| panic!("{dims:?}: interpreter: {e}"));
        let got = gm.run(&named).unwrap_or_else(|e| panic!("{dims:?}: gpu: {e}"));
        assert_eq!(got[0].1.shape(), want[0].1.shape(), "{dims:?}");
        let (g, w) = (got[0].1.to_f64_vec(), want[0].1.to_f64_vec());
        let num: f64 = g.iter().zip(&w).map(|(a, b)| (a - b) * (a - b)).sum();
        let den: f64 = w.iter().map(|b| b * b).sum();
        let l2 = (num / den.max(1e-30)).sqrt();
        let top = w.iter().fold(0.0f64, |a, b| a.max(b.abs()));
        let far = g.iter().zip(&w).map(|(a, b)| (a - b).abs()).fold(0.0f64, f64::max);
        assert!(g.iter().all(|x| x.is_finite()), "{dims:?}: a value is not finite");
        assert!(l2 < ATTENTION_L2, "{dims:?}: relative L2 error {l2:e}");
        assert!(far <= ATTENTION_MAX * top.max(1e-3), "{dims:?}: an element off by {far:e} of {top:e}");
        worst = worst.max(l2);
    }
    worst
}

/// Lengths: 1, primes, a chunk of keys, one past it, past two.
const LENGTHS: [usize; 6] = [1, 2, 17, 64, 65, 131];

#[test]
fn padding_mask_and_cross_attention_run_on_the_attention_kernel() {
    let m = model(&padding_mask(16));
    let mut shapes = Vec::new();
    for (i, &q) in LENGTHS.iter().enumerate() {
        let k = LENGTHS[(i * 5 + 2) % LENGTHS.len()];
        shapes.push(vec![("b", 1 + i % 2), ("q", q), ("k", q)]);
        shapes.push(vec![("b", 1), ("q", q), ("k", k)]);
    }
    let worst = check(&m, true, &shapes);
    eprintln!("padding mask, head 16: relative L2 error at most {worst:.2e}");
}

#[test]
fn causal_mask_runs_on_the_attention_kernel() {
    let m = model(CAUSAL);
    let shapes: Vec<_> = LENGTHS.iter().enumerate().map(|(i, &t)| vec![("b", 1 + i % 2), ("t", t)]).collect();
    let worst = check(&m, true, &shapes);
    eprintln!("causal mask, head 32: relative L2 error at most {worst:.2e}");
}

#[test]
fn leading_keys_masked_out_run_on_the_attention_kernel() {
    let m = model(LEFT_PADDED);
    let shapes: Vec<_> = [1, 17, 65, 131].iter().map(|&t| vec![("b", 1), ("t", t)]).collect();
    let worst = check(&m, true, &shapes);
    eprintln!("leading keys masked, head 64: relative L2 error at most {worst:.2e}");
}

/// A softmax whose NaNs the model makes 0 runs on the attention kernel
/// (`OnlineSoftmax::nan_to_zero`): a fully masked row is 0, as the
/// interpreter says (a row that weighs nothing is the kernel's 0).
#[test]
fn a_nan_guarded_softmax_runs_on_the_attention_kernel() {
    let m = model(&nan_guarded());
    assert!(nan_guarded().contains("select %nan"), "the guard is in the model");
    let shapes: Vec<_> = [1, 17, 65].iter().map(|&t| vec![("b", 2), ("t", t)]).collect();
    let worst = check(&m, true, &shapes);
    eprintln!("NaN-guarded softmax, fully masked rows, head 64: relative L2 error at most {worst:.2e}");
}

/// A decode step (one query row, or a few) against a long cache: the keys of
/// each block of rows split among blocks, each storing its partial maxima,
/// sums and outputs, the last combining them; also a block of rows past the
/// first (65 queries) and keys in splits of unequal length (13 chunks in 3).
#[test]
fn long_keys_split_among_blocks_and_combine() {
    let m = model(&padding_mask(16));
    let gm = m.compile_host_gpu().unwrap_or_else(|e| panic!("{e}"));
    let mut shapes = Vec::new();
    for (q, k, splits) in [(1, 520, 2), (3, 1100, 4), (65, 800, 3), (1, 200, 1)] {
        let dims = vec![("b", 1), ("q", q), ("k", k)];
        let ins = inputs(&m, &dims, 7);
        let named: Vec<(&str, Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        let at = gm.attentions_at(&named).expect("plans");
        assert!(at.len() == 1 && at[0].2 == splits, "{dims:?}: {at:?}");
        // Twice in a row: the second call finds its tables in place (not
        // uploaded again), its split counters set back to zero by the first.
        shapes.push(dims.clone());
        shapes.push(dims);
    }
    let worst = compare(&m, &gm, &shapes);
    eprintln!("split keys, head 16: relative L2 error at most {worst:.2e}");
}

/// Attention of depth `d` over 3 heads whose output is merged
/// (`[b, 3, q, d] → [b, q, 3·d]`) and projected by a weight: the head merge
/// a BERT layer has before its output projection.
fn head_merge(d: usize) -> String {
    let w: Vec<String> =
        (0..3 * d * 8).map(|i| format!("{:.3}", ((i * 37 % 17) as f32 - 8.0) / 16.0)).collect();
    let hd = 3 * d;
    let merge = format!(
        "  %t: f32[b, q, 3, {d}] = transpose[perm=[0, 2, 1, 3]] %o
  %m: f32[b*q, {hd}] = reshape %t
  %w: f32[{hd}, 8] = constant [{}]
  %y: f32[b*q, 8] = matmul %m, %w
  output %y
",
        w.join(", ")
    );
    padding_mask(d).replace("  output %o\n", &merge)
}

/// A head merge after the attention (the copy BERT's output projection
/// reads) is written by the attention kernel itself on the GPU: its output
/// view strided into the merged layout, no copy step; the CPU's plan keeps
/// the copy (its attention writes each entry's rows as one block). Only the
/// projection reads it, so it is stored in bf16 (`lower::bf16_products`)
/// and read in place, by both the whole-row and the split-key (combining)
/// stores. Both forms (`mma.sync`, Hopper's `wgmma`) against the interpreter.
#[test]
fn head_merges_are_written_by_the_attention() {
    for d in [16, 64] {
        let m = model(&head_merge(d));
        let plan = m.lower_gpu().expect("lower");
        let kinds: Vec<&str> = plan.steps.iter().map(|s| s.kind.name()).collect();
        assert_eq!(kinds, ["attention", "matmul"], "head {d}: {}", anyshape::inspect::print_plan(&plan));
        let (plan::StepKind::Attention(a), plan::StepKind::MatMul(mm)) =
            (&plan.steps[0].kind, &plan.steps[1].kind)
        else {
            unreachable!()
        };
        assert_eq!(a.output.c.buf, mm.a.buf, "the projection reads what the attention writes");
        assert_eq!(plan.buffers[mm.a.buf].dtype, ir::DType::BF16, "head {d}: the attention stores bf16");
        let cpu = m.lower().expect("lower");
        assert!(cpu.steps.iter().any(|s| s.kind.name() == "loop"), "the CPU keeps the copy");
        let mut shapes = Vec::new();
        for (i, &q) in LENGTHS.iter().enumerate() {
            shapes.push(vec![("b", 1 + i % 3), ("q", q), ("k", LENGTHS[(i + 3) % LENGTHS.len()])]);
        }
        // Keys split among blocks (2 and 4 splits), combined into the output.
        shapes.push(vec![("b", 1), ("q", 1), ("k", 520)]);
        shapes.push(vec![("b", 1), ("q", 3), ("k", 1100)]);
        let gm = m.compile_host_gpu().unwrap_or_else(|e| panic!("{e}"));
        let named_at = |dims: &[(&str, usize)]| {
            let ins = inputs(&m, dims, 1);
            gm.attentions_at(&ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect::<Vec<_>>())
                .expect("plans")
        };
        assert_eq!(named_at(&[("b", 1), ("q", 3), ("k", 1100)])[0].2, 4, "head {d}: split keys");
        let ins = inputs(&m, &[("b", 2), ("q", 65), ("k", 17)], 1);
        let named: Vec<(&str, Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        assert!(gm.copies_at(&named).expect("plans").iter().all(|(_, c)| *c == 0), "head {d}: a copy of A");
        let worst = compare(&m, &gm, &shapes);
        eprintln!("head merge, head {d}: relative L2 error at most {worst:.2e}");
        if plan::gpu::attention_wgmma_ok(d) {
            let worst = check_hopper(&m, &shapes);
            eprintln!("head merge, wgmma, head {d}: relative L2 error at most {worst:.2e}");
        }
    }
}

/// Grouped-query attention (6 query heads over 2 key and value heads, as a
/// Llama's: the attention's batch `[b, 2, 3]`) whose output is merged to
/// `[b·q, 96]` and projected: the merge folds into the attention too, its
/// heads' two dims strided into the merged row.
#[test]
fn grouped_query_head_merges_are_written_by_the_attention() {
    let w: Vec<String> = (0..96 * 8).map(|i| format!("{:.3}", ((i * 37 % 17) as f32 - 8.0) / 16.0)).collect();
    let shared = |name: &str, to: &str| {
        format!(
            "  %{to}5: f32[b, 2, 1, k, 16] = reshape %{name}
  %{to}x: f32[b, 2, 3, k, 16] = broadcast %{to}5
  %{to}: f32[b, 6, k, 16] = reshape %{to}x
"
        )
    };
    let text = format!(
        "graph {{
  sym b param 1..3
  sym q param 1..200
  sym k param 1..1200
  input %qs: f32[b, 6, q, 16]
  input %keys: f32[b, 2, k, 16]
  input %vals: f32[b, 2, k, 16]
  input %mask: f32[b, 1, 1, k]
{}{}  %kt: f32[b, 6, 16, k] = transpose[perm=[0, 1, 3, 2]] %kr
  %s: f32[b, 6, q, k] = matmul %qs, %kt
  %quarter: f32[1, 1, 1, 1] = constant [0.25]
  %qb: f32[b, 6, q, k] = broadcast %quarter
  %ss: f32[b, 6, q, k] = mul %s, %qb
  %mb: f32[b, 6, q, k] = broadcast %mask
  %sm: f32[b, 6, q, k] = add %ss, %mb
  %mx: f32[b, 6, q, 1] = reduce_max[axes=[3], keep_dims=true] %sm
  %mxb: f32[b, 6, q, k] = broadcast %mx
  %sh: f32[b, 6, q, k] = sub %sm, %mxb
  %ex: f32[b, 6, q, k] = exp %sh
  %sum: f32[b, 6, q, 1] = reduce_sum[axes=[3], keep_dims=true] %ex
  %sumb: f32[b, 6, q, k] = broadcast %sum
  %p: f32[b, 6, q, k] = div %ex, %sumb
  %o: f32[b, 6, q, 16] = matmul %p, %v
  %t: f32[b, q, 6, 16] = transpose[perm=[0, 2, 1, 3]] %o
  %m: f32[b*q, 96] = reshape %t
  %w: f32[96, 8] = constant [{}]
  %y: f32[b*q, 8] = matmul %m, %w
  output %y
}}
",
        shared("keys", "kr"),
        shared("vals", "v"),
        w.join(", ")
    );
    let m = model(&text);
    let plan = m.lower_gpu().expect("lower");
    let kinds: Vec<&str> = plan.steps.iter().map(|s| s.kind.name()).collect();
    assert_eq!(kinds, ["attention", "matmul"], "{}", anyshape::inspect::print_plan(&plan));
    let plan::StepKind::Attention(a) = &plan.steps[0].kind else { unreachable!() };
    assert_eq!(a.output.batch.len(), 3, "the heads as [kv heads, group]");
    let shapes: Vec<_> = [(1, 1, 17), (2, 13, 13), (1, 65, 131), (1, 3, 520)]
        .iter()
        .map(|&(b, q, k)| vec![("b", b), ("q", q), ("k", k)])
        .collect();
    let worst = check(&m, true, &shapes);
    eprintln!("grouped-query head merge, head 16: relative L2 error at most {worst:.2e}");
}

/// Compile `m` for an emulated Hopper, check its attention steps take the
/// `wgmma` kernel, and compare it with the interpreter at each of `shapes`.
fn check_hopper(m: &Model, shapes: &[Vec<(&str, usize)>]) -> f64 {
    let plan = m.lower_gpu().expect("lower");
    let text = anyshape::gpu::attention_text(&plan, GpuTarget::Sm90a);
    assert!(
        !text.is_empty() && text.lines().all(|l| l.contains("_wgmma: ") || l.contains("_wgmma_o16: ")),
        "{text}"
    );
    let gm = m.compile_host_gpu_for(GpuTarget::Sm90a).unwrap_or_else(|e| panic!("{e}"));
    compare(m, &gm, shapes)
}

/// Hopper's attention kernel (`wgmma`: `S = Q·Kᵀ` from the swizzled Q and K
/// tiles, `O += P·V` with P from the score registers and Vᵀ from its tile)
/// on the emulator: heads 64 and 128 (one and two swizzle slabs), a padding
/// mask with cross attention, leading keys masked out, and keys split among
/// blocks (1 and 3 queries against 520 and 1100 keys).
#[test]
fn hopper_attention_runs_on_wgmma() {
    for d in [64, 128] {
        let m = model(&padding_mask(d));
        let mut shapes = Vec::new();
        for (i, &q) in LENGTHS.iter().enumerate() {
            let k = LENGTHS[(i * 5 + 2) % LENGTHS.len()];
            shapes.push(vec![("b", 1 + i % 2), ("q", q), ("k", k)]);
        }
        shapes.push(vec![("b", 1), ("q", 1), ("k", 520)]);
        shapes.push(vec![("b", 1), ("q", 3), ("k", 1100)]);
        let worst = check_hopper(&m, &shapes);
        eprintln!("wgmma, padding mask, head {d}: relative L2 error at most {worst:.2e}");
    }
    let m = model(LEFT_PADDED);
    let shapes: Vec<_> = [1, 17, 65, 131].iter().map(|&t| vec![("b", 2), ("t", t)]).collect();
    let worst = check_hopper(&m, &shapes);
    eprintln!("wgmma, leading keys masked, head 64: relative L2 error at most {worst:.2e}");
}

/// Heads `wgmma`'s tiles do not take (not a multiple of 64) keep `mma.sync`
/// on a Hopper.
#[test]
fn hopper_keeps_mma_sync_for_narrow_heads() {
    let plan = model(CAUSAL).lower_gpu().expect("lower");
    let text = anyshape::gpu::attention_text(&plan, GpuTarget::Sm90a);
    assert!(text.contains("_d32: ") && text.contains("mma.sync"), "{text}");
}

#[test]
fn a_head_dimension_the_kernel_lacks_runs_unfused() {
    let m = model(&padding_mask(20));
    let shapes = vec![vec![("b", 1), ("q", 17), ("k", 5)]];
    check(&m, false, &shapes);
}

/// A GPU artifact of a model with fused attention: its attention kernel
/// saved with what it is (program, parameters, head), loaded without the
/// compiler and run on the emulator (the kernel rebuilt from its role).
#[test]
fn an_artifact_keeps_the_attention_kernel() {
    let m = model(CAUSAL);
    let opts = anyshape::gpu::GpuArtifactOptions::new().targets(&[anyshape::gpu::GpuTarget::Sm90a]);
    let a = m.gpu_artifact(&opts).expect("an artifact");
    let path = std::env::temp_dir().join(format!("anyshape-gpu-attention-{}.anyshape", std::process::id()));
    a.save(&path).expect("saves");
    let b = anyshape::gpu::GpuArtifact::load(&path).expect("loads");
    let _ = std::fs::remove_file(&path);
    let heads: Vec<usize> = b.code[0]
        .kernels
        .iter()
        .filter_map(|(_, r)| match r {
            anyshape::gpu::KernelRole::Attention { head, .. } => Some(*head),
            _ => None,
        })
        .collect();
    assert_eq!(heads, [32], "the artifact's attention kernels");
    let gm = anyshape::gpu::host_model_of(b, None).expect("runs on the emulator");
    compare(&m, &gm, &[vec![("b", 2), ("t", 70)]]);

    // A head of 64: Hopper's code holds the wgmma kernel, every GPU's mma.sync's.
    let m = model(LEFT_PADDED);
    let a = m.gpu_artifact(&anyshape::gpu::GpuArtifactOptions::new()).expect("an artifact");
    a.save(&path).expect("saves");
    let b = anyshape::gpu::GpuArtifact::load(&path).expect("loads");
    let _ = std::fs::remove_file(&path);
    for (code, want) in b.code.iter().zip([AttentionMma::Wgmma, AttentionMma::Sync]) {
        let forms: Vec<AttentionMma> = code
            .kernels
            .iter()
            .filter_map(|(_, r)| match r {
                anyshape::gpu::KernelRole::Attention { mma, .. } => Some(*mma),
                _ => None,
            })
            .collect();
        assert_eq!(forms, [want], "{}", code.arch);
    }
    let gm = anyshape::gpu::host_model_of(b, Some("sm_90a")).expect("runs on the emulator");
    compare(&m, &gm, &[vec![("b", 2), ("t", 70)]]);
}

/// The plan's first fused attention step.
fn attention_step(plan: &plan::ModelPlan) -> Option<&plan::AttentionStep> {
    plan.steps.iter().find_map(|s| match &s.kind {
        plan::StepKind::Attention(a) => Some(&**a),
        _ => None,
    })
}

/// The logits' reads of the buffer and dim tables are invariant loads from
/// tables the kernel declares aligned and dereferenceable, so that they are
/// hoisted out of the chunks of keys (with the mask's row address), and the
/// PTX loads each table word once where the IR's chunk loop would repeat it.
#[test]
fn the_logits_table_reads_are_hoisted_out_of_the_chunks() {
    let plan = model(&padding_mask(64)).lower_gpu().expect("lower");
    let a = attention_step(&plan).expect("attention fused");
    let online = a.online.as_ref().expect("online softmax");
    for mma in [AttentionMma::Sync, AttentionMma::Wgmma] {
        let name = plan::gpu::attention_kernel_name(online.program, 64, mma, false);
        let args = (&plan.programs[online.program], (a.scores_param as u32, online.logits_param as u32));
        let ir = codegen::nvptx::attention_ir(args.0, args.1, (64, mma, false), &name).expect("IR");
        assert!(ir.contains("ptr align 8 dereferenceable("), "{name}: the tables' parameters");
        assert!(ir.contains("!invariant.load"), "{name}: the logits' table loads");
        let ptx = codegen::nvptx::attention_ptx(args.0, args.1, (64, mma, false), &name).expect("PTX");
        // The logits' table words: read by `ld.global` (the tables are the
        // kernel's first two parameters), each once.
        let table_loads: Vec<&str> = ptx
            .lines()
            .filter(|l| l.contains("ld.global") && l.contains(".u64") && !l.contains("%rd1+"))
            .collect();
        let mut words = table_loads.iter().map(|l| l.split('[').nth(1).unwrap_or("")).collect::<Vec<_>>();
        let all = words.len();
        words.sort();
        words.dedup();
        assert_eq!(words.len(), all, "{name}: a table word loaded twice: {table_loads:#?}");
    }
}

/// Bytes a thread may spill at heads wider than 64: ptxas gives those 255
/// registers (the output accumulators of a 128-wide head are 64 of them) and,
/// depending on its scheduling, stores a few words on the stack (L1).
const MOST_SPILL_WIDE: usize = 64;

/// The kernel at every head dimension it is built for assembles for sm_90a
/// (ptxas, from `ANYSHAPE_PTXAS`): without spilling registers up to a head of
/// 64 (BERT's, GPT-2's, ViT's), a few words at most beyond; at 64 also
/// storing its output in bf16.
#[test]
fn every_head_dimension_assembles_for_hopper() {
    let ptxas = std::env::var("ANYSHAPE_PTXAS").ok();
    if !kernels::testing::require("ANYSHAPE_REQUIRE_PTXAS", ptxas.is_some(), "ptxas in ANYSHAPE_PTXAS") {
        return;
    }
    let ptxas = ptxas.unwrap_or_default();
    let tmp = std::env::temp_dir().join(format!("anyshape-attention-ptx-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).expect("temp dir");
    let forms = (16..=plan::gpu::ATTENTION_MAX_HEAD).step_by(16).flat_map(|d| {
        let wgmma = plan::gpu::attention_wgmma_ok(d).then_some((d, AttentionMma::Wgmma));
        let bf16 = [(d, AttentionMma::Sync, true), (d, AttentionMma::Wgmma, true)]
            .into_iter()
            .filter(move |_| d == 64);
        std::iter::once((d, AttentionMma::Sync)).chain(wgmma).map(|(d, m)| (d, m, false)).chain(bf16)
    });
    for (d, mma, out_bf16) in forms {
        let plan = model(&padding_mask(d)).lower_gpu().expect("lower");
        let a = attention_step(&plan).unwrap_or_else(|| panic!("head {d}: attention not fused"));
        let online = a.online.as_ref().expect("online softmax");
        let name = plan::gpu::attention_kernel_name(online.program, d, mma, out_bf16);
        let ptx = codegen::nvptx::attention_ptx(
            &plan.programs[online.program],
            (a.scores_param as u32, online.logits_param as u32),
            (d, mma, out_bf16),
            &name,
        )
        .unwrap_or_else(|e| panic!("head {d}: {e}"));
        assert_eq!(ptx.contains("wgmma.mma_async"), mma == AttentionMma::Wgmma, "{name}");
        let file = tmp.join(format!("{name}.ptx"));
        std::fs::write(&file, &ptx).expect("write");
        let out = std::process::Command::new(&ptxas)
            .args(["-v", "-arch", "sm_90a", "-o", "/dev/null"])
            .arg(&file)
            .output()
            .expect("ptxas runs");
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: {log}");
        let spilled: usize = log
            .split(" bytes spill stores")
            .next()
            .and_then(|s| s.rsplit(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        let most = if d <= 64 { 0 } else { MOST_SPILL_WIDE };
        assert!(spilled <= most, "{name}: {spilled} bytes spilled (at most {most}): {log}");
        eprintln!(
            "{name}: {}",
            log.lines().filter(|l| l.contains("registers")).collect::<Vec<_>>().join("; ")
        );
    }
    let _ = std::fs::remove_dir_all(&tmp);
}
