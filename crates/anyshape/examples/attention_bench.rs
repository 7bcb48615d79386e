//! Fused attention against the unfused path (matmul, softmax program, matmul),
//! BERT-base's attention: 12 heads of depth 64, `Q·Kᵀ/8 + mask`, softmax, `·V`.
//!
//! ```sh
//! cargo run --release -p anyshape --example attention_bench -- [--threads 2] [--batch 1] \
//!     [--seq 1,8,17,32,64,128,256,384,512] [--runs 30] [--rounds 3] \
//!     [--systems fused,whole,online,unfused] [--chunk N]
//! ```
//! The systems: `fused` (the default: whole rows of scores while they stay in
//! L2, online softmax over chunks of keys beyond), `whole` (whole rows at every
//! length), `online` (chunks at every length; `--chunk N` keys each, else the
//! size the cache gives) and `unfused` (the three steps, the `T × T` scores in
//! memory; skipped past T = 8192, where they would take 6 GB). They run in
//! turns (one round: every length on each), and each reports the best of its
//! rounds' medians, with its time over the default's. GFLOP/s counts the two
//! products (4·b·h·T²·d). `--systems online` alone times one path (for `perf
//! record`).

use std::time::Instant;

use anyshape::{CompileOptions, CompiledModel, Elems, KeyChunks, LoadOptions, Model, Tensor};

const GRAPH: &str = r#"graph {
  sym b param 1..64
  sym t param 1..16384
  input %q: f32[b, 12, t, 64]
  input %kt: f32[b, 12, 64, t]
  input %v: f32[b, 12, t, 64]
  input %mask: f32[b, 1, 1, t]
  %s: f32[b, 12, t, t] = matmul %q, %kt
  %eighth: f32[1, 1, 1, 1] = constant [8.0]
  %eb: f32[b, 12, t, t] = broadcast %eighth
  %ss: f32[b, 12, t, t] = div %s, %eb
  %mb: f32[b, 12, t, t] = broadcast %mask
  %sm: f32[b, 12, t, t] = add %ss, %mb
  %mx: f32[b, 12, t, 1] = reduce_max[axes=[3], keep_dims=true] %sm
  %mxb: f32[b, 12, t, t] = broadcast %mx
  %sh: f32[b, 12, t, t] = sub %sm, %mxb
  %ex: f32[b, 12, t, t] = exp %sh
  %sum: f32[b, 12, t, 1] = reduce_sum[axes=[3], keep_dims=true] %ex
  %sumb: f32[b, 12, t, t] = broadcast %sum
  %p: f32[b, 12, t, t] = div %ex, %sumb
  %o: f32[b, 12, t, 64] = matmul %p, %v
  output %o
}
"#;

fn arg(args: &[String], name: &str, default: &str) -> String {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned().unwrap_or(default.into())
}

fn inputs(b: usize, t: usize) -> Vec<(&'static str, Tensor)> {
    let f = |shape: Vec<usize>, k: usize| {
        let n: usize = shape.iter().product();
        let v = (0..n).map(|i| ((i * k % 101) as f32 - 50.0) / 100.0).collect();
        Tensor::new(shape, Elems::F32(v)).expect("tensor")
    };
    vec![
        ("q", f(vec![b, 12, t, 64], 37)),
        ("kt", f(vec![b, 12, 64, t], 41)),
        ("v", f(vec![b, 12, t, 64], 43)),
        ("mask", Tensor::new(vec![b, 1, 1, t], Elems::F32(vec![0.0; b * t])).expect("mask")),
    ]
}

fn median_ms(cm: &CompiledModel, ins: &[(&str, Tensor)], runs: usize) -> f64 {
    cm.run(ins).expect("run");
    let mut v: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            cm.run(ins).expect("run");
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads: usize = arg(&args, "--threads", "2").parse().expect("--threads");
    let batch: usize = arg(&args, "--batch", "1").parse().expect("--batch");
    let runs: usize = arg(&args, "--runs", "30").parse().expect("--runs");
    let rounds: usize = arg(&args, "--rounds", "3").parse().expect("--rounds");
    let seqs: Vec<usize> = arg(&args, "--seq", "1,8,17,32,64,128,256,384,512")
        .split(',')
        .map(|s| s.parse().expect("--seq"))
        .collect();
    let systems: Vec<String> =
        arg(&args, "--systems", "fused,unfused").split(',').map(str::to_string).collect();
    let chunk: Option<usize> = args
        .iter()
        .position(|a| a == "--chunk")
        .map(|_| arg(&args, "--chunk", "0").parse().expect("--chunk"));
    let g = ir::parse_graph(GRAPH, &|_| None).expect("graph");
    let model = Model::from_ir(g, &LoadOptions::new()).expect("model");
    let opts = CompileOptions::new().threads(threads);
    let compiled: Vec<(String, CompiledModel)> = systems
        .iter()
        .map(|s| {
            let o = match s.as_str() {
                "fused" => opts.clone(),
                "whole" => opts.clone().key_chunks(KeyChunks::Never),
                "online" => match chunk {
                    Some(n) => opts.clone().key_chunks(KeyChunks::Every(n)),
                    None => opts.clone().key_chunks(KeyChunks::Always),
                },
                "unfused" => opts.clone().fuse_attention(false),
                other => panic!("unknown system {other}: fused, whole, online or unfused"),
            };
            (s.clone(), model.compile(&o).expect("compile"))
        })
        .collect();
    let mut best = vec![vec![f64::NAN; systems.len()]; seqs.len()];
    for _ in 0..rounds {
        for (i, &t) in seqs.iter().enumerate() {
            let ins = inputs(batch, t);
            for (j, (name, cm)) in compiled.iter().enumerate() {
                if name == "unfused" && t > 8192 {
                    continue;
                }
                best[i][j] = best[i][j].min(median_ms(cm, &ins, runs));
            }
        }
    }
    println!("attention, batch {batch}, 12 heads x 64, {threads} threads (best of {rounds} rounds' medians)");
    let mut head = String::from("| T |");
    for s in &systems {
        head += &format!(" {s} ms | GFLOP/s | / {} |", systems[0]);
    }
    println!("{head}");
    println!("|---|{}", "---|---|---|".repeat(systems.len()));
    for (i, &t) in seqs.iter().enumerate() {
        let flops = 4.0 * (batch * 12 * t * t * 64) as f64;
        let mut row = format!("| {t} |");
        for ms in &best[i] {
            row += &format!(" {ms:.3} | {:.1} | {:.2}x |", flops / ms / 1e6, ms / best[i][0]);
        }
        println!("{row}");
    }
}
