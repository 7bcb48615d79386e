//! Fused attention (one step per block of query rows: scores and probabilities
//! in tiles, never in memory) against the reference interpreter, at query and
//! key lengths of 1, primes, one past a vector and past a query block (64
//! rows), with an additive padding mask (cross attention, lengths differing)
//! and with a causal mask; on one thread and two; and the unfused path beside
//! it. The plan is checked to hold the fused step, so a silent fallback to the
//! three unfused steps fails here. Online softmax (keys in chunks) runs beside
//! them with chunks of 7 and 16 keys, so that rows span one chunk, several, and
//! a short last one; a mask of -inf over the first keys (left padding) makes
//! whole chunks of a row weigh nothing.

mod common;

use anyshape::{CompileOptions, CompiledModel, Elems, KeyChunks, LoadOptions, Model, Tensor};
use common::{shape_at, Lcg};

/// `softmax(Q·Kᵀ/4 + mask)·V` over `b × 3` heads of depth 20, queries `q`, keys `k`.
const PADDING_MASK: &str = r#"graph {
  sym b param 1..3
  sym q param 1..200
  sym k param 1..200
  input %qs: f32[b, 3, q, 20]
  input %kt: f32[b, 3, 20, k]
  input %v: f32[b, 3, k, 20]
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
  %o: f32[b, 3, q, 20] = matmul %p, %v
  output %o
}
"#;

/// Self-attention of length `t` with a causal mask (key `j` seen by query `i ≥ j`).
const CAUSAL: &str = r#"graph {
  sym b param 1..3
  sym t param 1..200
  input %qs: f32[b, 2, t, 16]
  input %kt: f32[b, 2, 16, t]
  input %v: f32[b, 2, t, 16]
  %s: f32[b, 2, t, t] = matmul %qs, %kt
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
  %o: f32[b, 2, t, 16] = matmul %p, %v
  output %o
}
"#;

/// `softmax(Q·Kᵀ·0.25 + mask)·V` with a mask of -inf over the first keys (left
/// padding), queries and keys of one length.
const LEFT_PADDED: &str = r#"graph {
  sym b param 1..2
  sym t param 1..200
  input %qs: f32[b, 2, t, 8]
  input %kt: f32[b, 2, 8, t]
  input %v: f32[b, 2, t, 8]
  input %lmask: f32[b, 1, 1, t]
  %s: f32[b, 2, t, t] = matmul %qs, %kt
  %quarter: f32[1, 1, 1, 1] = constant [0.25]
  %qb: f32[b, 2, t, t] = broadcast %quarter
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
  %o: f32[b, 2, t, 8] = matmul %p, %v
  output %o
}
"#;

/// `LEFT_PADDED` with its softmax's NaNs made 0, as PyTorch's
/// scaled-dot-product attention exports it (the optimum Llama's): rows whose
/// every key is masked (`emask`: all of the second entry's keys) are 0.
fn nan_guarded() -> String {
    common::guard_softmax_nans(LEFT_PADDED, "[b, 2, t, t]")
}

fn model(text: &str) -> Model {
    let g = ir::parse_graph(text, &|_| None).unwrap_or_else(|e| panic!("{e}"));
    Model::from_ir(g, &LoadOptions::new()).unwrap_or_else(|e| panic!("{e}"))
}

/// Random inputs at the dims given; a padding mask of 0 and -10000 (the last
/// keys padded, as a tokenizer pads), everything else in [-2, 2).
fn inputs(m: &Model, dims: &[(&str, usize)], seed: u64) -> Vec<(String, Tensor)> {
    let mut rng = Lcg::new(seed);
    m.inputs()
        .into_iter()
        .map(|info| {
            let shape = shape_at(&info.ty, dims);
            let n: usize = shape.iter().product();
            let elems = if info.name == "mask" {
                let keys = *shape.last().expect("rank");
                let keep = keys - (rng.next() as usize % keys.div_ceil(2));
                Elems::F32((0..n).map(|i| if i % keys < keep { 0.0 } else { -10000.0 }).collect())
            } else if info.name == "emask" {
                Elems::F32(common::empty_rows_mask(n, *shape.last().expect("rank")))
            } else if info.name == "lmask" {
                // -inf over up to two thirds of the keys, from the first; one key stays.
                let keys = *shape.last().expect("rank");
                let pad = rng.next() as usize % (2 * keys / 3 + 1);
                Elems::F32((0..n).map(|i| if i % keys < pad { f32::NEG_INFINITY } else { 0.0 }).collect())
            } else {
                Elems::F32((0..n).map(|_| rng.unit()).collect())
            };
            (info.name, Tensor::new(shape, elems).expect("tensor"))
        })
        .collect()
}

fn check(m: &Model, compiled: &[(&str, &CompiledModel)], dims: &[(&str, usize)], seed: u64) {
    let ins = inputs(m, dims, seed);
    let named: Vec<(&str, Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let want = m.interpret(&named).unwrap_or_else(|e| panic!("{dims:?}: interpreter: {e}"));
    for (what, cm) in compiled {
        // The chunked models take their keys in chunks, the others whole rows.
        if what.contains("fused") || what.contains("online") {
            let plan = cm.dispatch_text(&named).unwrap_or_else(|e| panic!("{dims:?}: {what}: {e}"));
            let online = plan.contains("online softmax") && plan.contains("chunks of");
            assert_eq!(online, what.starts_with("online"), "{dims:?}: {what}:\n{plan}");
        }
        let got = cm.run(&named).unwrap_or_else(|e| panic!("{dims:?}: {what}: {e}"));
        let (g, w) = (got[0].1.to_f64_vec(), want[0].1.to_f64_vec());
        assert_eq!(got[0].1.shape(), want[0].1.shape(), "{dims:?}: {what}");
        for (i, (a, b)) in g.iter().zip(&w).enumerate() {
            assert!(
                (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                "{dims:?}: {what}: o[{i}] = {a}, the interpreter says {b}"
            );
        }
    }
}

fn compile_all(m: &Model) -> Vec<(&'static str, CompiledModel)> {
    let fused = anyshape::inspect::print_plan(&m.lower().expect("lower"));
    assert!(fused.contains("attention, fused per block of query rows"), "attention not fused:\n{fused}");
    assert!(fused.contains("temp, unused"), "the score buffers are still allocated:\n{fused}");
    assert!(fused.contains("online softmax"), "no online softmax program:\n{fused}");
    let unfused = m.lower_with(&CompileOptions::new().fuse_attention(false)).expect("lower");
    assert!(!anyshape::inspect::print_plan(&unfused).contains("fused per block"));
    let c = |o: CompileOptions| m.compile(&o).unwrap_or_else(|e| panic!("{e}"));
    let whole = CompileOptions::new().key_chunks(KeyChunks::Never);
    let chunks = |n: usize| CompileOptions::new().key_chunks(KeyChunks::Every(n));
    vec![
        ("fused, 2 threads", c(whole.clone().threads(2).canaries(true))),
        ("fused, 1 thread", c(whole.threads(1))),
        ("online, chunks of 7, 2 threads", c(chunks(7).threads(2).canaries(true))),
        ("online, chunks of 16, 1 thread", c(chunks(16).threads(1).canaries(true))),
        ("unfused", c(CompileOptions::new().threads(2).fuse_attention(false).canaries(true))),
    ]
}

/// Lengths: 1, primes, one past 8 and 16 lanes, one past a 64-row block, the range's end.
const LENGTHS: [usize; 10] = [1, 2, 7, 13, 17, 33, 64, 65, 131, 200];

#[test]
fn fused_attention_with_padding_mask() {
    let m = model(PADDING_MASK);
    let compiled = compile_all(&m);
    let refs: Vec<(&str, &CompiledModel)> = compiled.iter().map(|(w, c)| (*w, c)).collect();
    for (i, &q) in LENGTHS.iter().enumerate() {
        // Keys both equal to the queries and not (cross attention).
        let k = LENGTHS[(i * 7 + 3) % LENGTHS.len()];
        let b = 1 + i % 3;
        check(&m, &refs, &[("b", b), ("q", q), ("k", q)], i as u64);
        check(&m, &refs, &[("b", b), ("q", q), ("k", k)], 100 + i as u64);
    }
}

#[test]
fn fused_attention_with_causal_mask() {
    let m = model(CAUSAL);
    let compiled = compile_all(&m);
    let refs: Vec<(&str, &CompiledModel)> = compiled.iter().map(|(w, c)| (*w, c)).collect();
    for (i, &t) in LENGTHS.iter().enumerate() {
        check(&m, &refs, &[("b", 1 + i % 3), ("t", t)], i as u64);
    }
}

#[test]
fn online_softmax_with_leading_keys_masked_out() {
    let m = model(LEFT_PADDED);
    let compiled = compile_all(&m);
    let refs: Vec<(&str, &CompiledModel)> = compiled.iter().map(|(w, c)| (*w, c)).collect();
    for (i, &t) in LENGTHS.iter().enumerate() {
        check(&m, &refs, &[("b", 1 + i % 2), ("t", t)], 300 + i as u64);
    }
}

/// A softmax whose NaNs the model makes 0 fuses with online softmax
/// (`OnlineSoftmax::nan_to_zero`): a fully masked row is 0 whole, in
/// chunks and unfused, as the interpreter says.
#[test]
fn fully_masked_rows_of_a_nan_guarded_softmax_are_zero() {
    assert!(nan_guarded().contains("select %nan"), "the guard is in the model");
    let m = model(&nan_guarded());
    let compiled = compile_all(&m);
    let refs: Vec<(&str, &CompiledModel)> = compiled.iter().map(|(w, c)| (*w, c)).collect();
    for (i, &t) in LENGTHS.iter().enumerate() {
        check(&m, &refs, &[("b", 2), ("t", t)], 400 + i as u64);
    }
    let ins = inputs(&m, &[("b", 2), ("t", 13)], 1);
    let named: Vec<(&str, Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let want = m.interpret(&named).expect("interprets")[0].1.to_f64_vec();
    assert!(want[want.len() / 2..].iter().all(|x| *x == 0.0), "the second entry's rows are 0");
}

/// Keys as a model holds them, `[b, heads, keys, depth]`, transposed into Kᵀ:
/// a plain operand with keys `depth` apart, which each task packs (a thread's
/// next block of queries of the same entry reuses its pack).
#[test]
fn fused_attention_with_keys_transposed() {
    let text = PADDING_MASK.replace(
        "  input %kt: f32[b, 3, 20, k]\n",
        "  input %keys: f32[b, 3, k, 20]\n  %kt: f32[b, 3, 20, k] = transpose[perm=[0, 1, 3, 2]] %keys\n",
    );
    let m = model(&text);
    let compiled = compile_all(&m);
    let refs: Vec<(&str, &CompiledModel)> = compiled.iter().map(|(w, c)| (*w, c)).collect();
    for (i, &q) in LENGTHS.iter().enumerate() {
        let k = LENGTHS[(i * 3 + 5) % LENGTHS.len()];
        let b = 1 + (i + 1) % 3;
        check(&m, &refs, &[("b", b), ("q", q), ("k", q)], 500 + i as u64);
        check(&m, &refs, &[("b", b), ("q", q), ("k", k)], 600 + i as u64);
    }
}

/// Grouped-query attention as decoders export it, twice (two layers): six query
/// heads share two key/value heads (the cache expanded and reshaped, PyTorch's
/// `repeat_kv`), queries and keys each scaled by `sqrt(1/sqrt(d))` (decomposed
/// scaled-dot-product attention), one padding mask computed once and expanded
/// by each layer. Each layer has its own keys; both read one expanded value
/// (stored by neither). The plan reads the shared heads in place (a batch of
/// `b × 2 × 3` products, the keys and values the inputs' buffers), never stores
/// an expanded mask, and fuses both layers.
const GROUPED_QUERIES: &str = r#"graph {
  sym b param 1..3
  sym q param 1..200
  sym k param 1..200
  input %qs: f32[b, 6, q, 20]
  input %keys: f32[b, 2, k, 20]
  input %vals: f32[b, 2, k, 20]
  input %mask: f32[b, 1, 1, k]
  input %keys2: f32[b, 2, k, 20]
  %k5: f32[b, 2, 1, k, 20] = reshape %keys
  %kx: f32[b, 2, 3, k, 20] = broadcast %k5
  %kr: f32[b, 6, k, 20] = reshape %kx
  %kt: f32[b, 6, 20, k] = transpose[perm=[0, 1, 3, 2]] %kr
  %v5: f32[b, 2, 1, k, 20] = reshape %vals
  %vx: f32[b, 2, 3, k, 20] = broadcast %v5
  %v: f32[b, 6, k, 20] = reshape %vx
  %root: f32[1, 1, 1, 1] = constant [0.4728708]
  %rq: f32[b, 6, q, 20] = broadcast %root
  %rk: f32[b, 6, 20, k] = broadcast %root
  %q2: f32[b, 6, q, 20] = mul %qs, %rq
  %k2: f32[b, 6, 20, k] = mul %kt, %rk
  %low: f32[1, 1, 1, 1] = constant [-10000.0]
  %lowb: f32[b, 1, 1, k] = broadcast %low
  %zero: f32[1, 1, 1, 1] = constant [0.0]
  %zerob: f32[b, 1, 1, k] = broadcast %zero
  %padded: bool[b, 1, 1, k] = less %mask, %zerob
  %msk: f32[b, 1, 1, k] = select %padded, %lowb, %zerob
  %s: f32[b, 6, q, k] = matmul %q2, %k2
  %mb: f32[b, 6, q, k] = broadcast %msk
  %sm: f32[b, 6, q, k] = add %s, %mb
  %mx: f32[b, 6, q, 1] = reduce_max[axes=[3], keep_dims=true] %sm
  %mxb: f32[b, 6, q, k] = broadcast %mx
  %sh: f32[b, 6, q, k] = sub %sm, %mxb
  %ex: f32[b, 6, q, k] = exp %sh
  %sum: f32[b, 6, q, 1] = reduce_sum[axes=[3], keep_dims=true] %ex
  %sumb: f32[b, 6, q, k] = broadcast %sum
  %p: f32[b, 6, q, k] = div %ex, %sumb
  %o: f32[b, 6, q, 20] = matmul %p, %v
  %o2: f32[b, 6, q, 20] = mul %o, %rq
  %j5: f32[b, 2, 1, k, 20] = reshape %keys2
  %jx: f32[b, 2, 3, k, 20] = broadcast %j5
  %jr: f32[b, 6, k, 20] = reshape %jx
  %jt: f32[b, 6, 20, k] = transpose[perm=[0, 1, 3, 2]] %jr
  %j2: f32[b, 6, 20, k] = mul %jt, %rk
  %s2: f32[b, 6, q, k] = matmul %o2, %j2
  %mb2: f32[b, 6, q, k] = broadcast %msk
  %sm2: f32[b, 6, q, k] = add %s2, %mb2
  %mx2: f32[b, 6, q, 1] = reduce_max[axes=[3], keep_dims=true] %sm2
  %mxb2: f32[b, 6, q, k] = broadcast %mx2
  %sh2: f32[b, 6, q, k] = sub %sm2, %mxb2
  %ex2: f32[b, 6, q, k] = exp %sh2
  %sum2: f32[b, 6, q, 1] = reduce_sum[axes=[3], keep_dims=true] %ex2
  %sumb2: f32[b, 6, q, k] = broadcast %sum2
  %p2: f32[b, 6, q, k] = div %ex2, %sumb2
  %out: f32[b, 6, q, 20] = matmul %p2, %v
  output %out
}
"#;

#[test]
fn grouped_queries_read_the_shared_heads_in_place() {
    let m = model(GROUPED_QUERIES);
    let plan = anyshape::inspect::print_plan(&m.lower().expect("lower"));
    assert_eq!(plan.matches("attention, fused per block of query rows").count(), 2, "{plan}");
    // Both products of both layers read the inputs' buffers (keys b1 and b4,
    // values b2), as a batch refined into the key/value heads and their query heads.
    assert_eq!(plan.matches("· B b1+").count(), 1, "the keys are copied:\n{plan}");
    assert_eq!(plan.matches("· B b4+").count(), 1, "the keys are copied:\n{plan}");
    assert_eq!(plan.matches("· B b2+").count(), 2, "the values are copied:\n{plan}");
    // The mask is stored as [b, 1, 1, k], never expanded to the scores' shape.
    // (The scores' and probabilities' buffers are allocated by no step.)
    let expanded = plan.lines().filter(|l| l.contains(": f32[b, 6, q, k]") && !l.contains("unused"));
    assert_eq!(expanded.count(), 0, "the mask is stored expanded:\n{plan}");
    assert!(plan.contains(": f32[b, 1, 1, k] \"msk\" (temp"), "{plan}");
    let compiled = compile_all(&m);
    let refs: Vec<(&str, &CompiledModel)> = compiled.iter().map(|(w, c)| (*w, c)).collect();
    for (i, &q) in LENGTHS.iter().enumerate() {
        let k = LENGTHS[(i * 7 + 3) % LENGTHS.len()];
        let b = 1 + i % 3;
        check(&m, &refs, &[("b", b), ("q", q), ("k", q)], 700 + i as u64);
        check(&m, &refs, &[("b", b), ("q", q), ("k", k)], 800 + i as u64);
    }
}
