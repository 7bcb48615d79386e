//! The measured peak of each element type this machine multiplies in, on 1 and
//! all threads: `cargo run --release -p anyshape-codegen --example peak`.

use anyshape_codegen::peak::measure_peak_gflops_of;
use kernels::{Target, ThreadPool};

fn main() {
    let t = Target::detect();
    for elem in kernels::CPU_ELEM_TYPES.into_iter().filter(|e| t.check_elem(*e).is_ok()) {
        for threads in [1, t.cores] {
            match measure_peak_gflops_of(&t, elem, &ThreadPool::new(threads), 300) {
                Ok(g) => println!("{elem} {threads} threads: {g:.1} GFLOP/s"),
                Err(e) => println!("{elem}: {e}"),
            }
        }
    }
}
