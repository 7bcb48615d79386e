//! What planning a new shape costs: the part of a first call at a shape that
//! runs before any kernel (binding the symbols, the per-shape plan: dims,
//! arena, kernel variants, launches), on the CPU or the GPU's runtime (here
//! through the emulator, whose planning is the GPU's).
//!
//! ```sh
//! cargo run --release -p anyshape --example plan_cost -- MODEL.onnx \
//!     [--device cpu|gpu-emulator] [--sweep batch=1..8] [--sweep seq=1..512] [--fix past=0]
//! ```
//! Every combination of the `--sweep` ranges (both ends included) with the
//! `--fix` values is planned once (nothing runs); the inputs are made
//! before the clock starts. Past 512 shapes the least recently used plans
//! go, so long sweeps also time that.

use std::time::Instant;

use anyshape::{DType, Elems, LoadOptions, Model, Tensor};

/// Plans one shape's inputs.
type Planner = dyn Fn(&[(&str, Tensor)]);

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        eprintln!(
            "usage: plan_cost MODEL.onnx [--device cpu|gpu-emulator] [--sweep SYM=LO..HI] [--fix SYM=N]"
        );
        std::process::exit(2);
    };
    let mut device = "cpu".to_string();
    let mut sweeps: Vec<(String, Vec<i64>)> = Vec::new();
    let mut i = 1;
    while i + 1 < args.len() {
        let (k, v) = (&args[i], &args[i + 1]);
        if k == "--device" {
            device = v.clone();
            i += 2;
            continue;
        }
        let (name, range) = v.split_once('=').unwrap_or_else(|| panic!("{k} {v}: expected SYM=..."));
        match k.as_str() {
            "--sweep" => {
                let (lo, hi) = range.split_once("..").expect("--sweep SYM=LO..HI");
                let (lo, hi): (i64, i64) = (lo.parse().expect("LO"), hi.parse().expect("HI"));
                sweeps.push((name.to_string(), (lo..=hi).collect()));
            }
            "--fix" => sweeps.push((name.to_string(), vec![range.parse().expect("--fix SYM=N")])),
            _ => panic!("unknown option {k}"),
        }
        i += 2;
    }
    let model = Model::load(path, &LoadOptions::new()).expect("load");
    // Every combination of the swept values.
    let mut shapes: Vec<Vec<(String, i64)>> = vec![Vec::new()];
    for (name, values) in &sweeps {
        shapes = shapes
            .iter()
            .flat_map(|s| {
                values.iter().map(move |v| {
                    let mut s = s.clone();
                    s.push((name.clone(), *v));
                    s
                })
            })
            .collect();
    }
    let feeds: Vec<Vec<(String, Tensor)>> = shapes
        .iter()
        .map(|shape| {
            model
                .inputs()
                .iter()
                .map(|io| {
                    let value = |s: &str| shape.iter().find(|(n, _)| n == s).map(|(_, v)| *v);
                    let dims: Vec<usize> = io
                        .ty
                        .shape
                        .iter()
                        .map(|d| {
                            d.eval(&value).unwrap_or_else(|e| panic!("input {}: {d}: {e}", io.name)) as usize
                        })
                        .collect();
                    let n = dims.iter().product();
                    let elems = match io.ty.dtype {
                        DType::F32 => Elems::F32(vec![0.0; n]),
                        DType::I64 => Elems::I64(vec![1; n]),
                        dt => panic!("input {}: no {dt} inputs made here", io.name),
                    };
                    (io.name.clone(), Tensor::new(dims, elems).expect("tensor"))
                })
                .collect()
        })
        .collect();
    let t = Instant::now();
    let plan: Box<Planner> = match device.as_str() {
        "cpu" => {
            let cm = model.compile(&Default::default()).expect("compile");
            Box::new(move |f| cm.plan_shape(f).expect("plan"))
        }
        "gpu-emulator" => {
            let gm = model.compile_host_gpu().expect("compile");
            Box::new(move |f| gm.plan_shape(f).expect("plan"))
        }
        d => panic!("--device {d}: cpu or gpu-emulator"),
    };
    eprintln!("compiled in {:.1} s", t.elapsed().as_secs_f64());
    let mut ms: Vec<f64> = feeds
        .iter()
        .map(|f| {
            let named: Vec<(&str, Tensor)> = f.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
            let t = Instant::now();
            plan(&named);
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    let total: f64 = ms.iter().sum();
    ms.sort_by(f64::total_cmp);
    println!(
        "{} shapes on {device}: planning a new shape {:.4} ms mean, {:.4} median, {:.4} max",
        ms.len(),
        total / ms.len() as f64,
        ms[ms.len() / 2],
        ms[ms.len() - 1]
    );
}
