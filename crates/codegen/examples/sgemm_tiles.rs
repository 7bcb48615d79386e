//! Single-thread GFLOP/s of each register tile on one square f32 matmul:
//! `cargo run --release -p anyshape-codegen --example sgemm_tiles [-- N]`.
//! A first look at the L0 level; the full benchmark with peers comes with the
//! contraction engine's `bench-matmul`.

use anyshape_codegen::{compile_microkernel, register_tiles};
use kernels::{gemm, Blocking, MatMut, MatRef, Target};

fn main() {
    let n: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(512);
    let host = Target::detect();
    let targets: Vec<(&str, Target)> = [("host", Some(host.clone())), ("avx2", host.avx2_only())]
        .into_iter()
        .filter_map(|(k, t)| t.map(|t| (k, t)))
        .collect();
    let a: Vec<f32> = (0..n * n).map(|i| (i % 17) as f32 * 0.01).collect();
    let b: Vec<f32> = (0..n * n).map(|i| (i % 13) as f32 * 0.01).collect();
    let mut c = vec![0.0f32; n * n];
    for (name, t) in targets {
        let mut best = (0.0, 0, 0);
        for (mr, nr) in register_tiles(&t) {
            if mr < 4 {
                continue;
            }
            let jit = compile_microkernel(&t, mr, nr).expect("compile");
            let uk = jit.kernel();
            let blk = Blocking::for_target(&t, kernels::ElemType::F32, mr, nr);
            let run = |c: &mut Vec<f32>| {
                gemm(
                    &uk,
                    &blk,
                    MatRef::row_major(&a, n, n).unwrap(),
                    MatRef::row_major(&b, n, n).unwrap(),
                    &mut MatMut::new(c, n, n, n).unwrap(),
                )
                .unwrap()
            };
            run(&mut c);
            let reps = 5;
            let start = std::time::Instant::now();
            for _ in 0..reps {
                run(&mut c);
            }
            let secs = start.elapsed().as_secs_f64() / reps as f64;
            let gflops = 2.0 * (n * n * n) as f64 / secs / 1e9;
            if gflops > best.0 {
                best = (gflops, mr, nr);
            }
            println!("{name} {mr:>2}x{nr:<3} {blk:?}: {gflops:6.1} GFLOP/s");
        }
        println!("{name} best: {}x{} at {:.1} GFLOP/s (1 thread, n = {n})", best.1, best.2, best.0);
    }
}
