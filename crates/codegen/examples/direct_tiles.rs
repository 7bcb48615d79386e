//! L0 throughput of every register tile, packed-panel kernel against direct
//! (in-place operands) kernel, single thread, operands in L1:
//! `cargo run --release -p anyshape-codegen --example direct_tiles [-- avx2]`.

use anyshape_codegen::{compile_direct_kernel, compile_microkernel, register_tiles, time_direct_kernel};
use kernels::Target;
use plan::Epilogue;

fn main() {
    let host = Target::detect();
    let t = if std::env::args().any(|a| a == "avx2") { host.avx2_only().expect("avx2") } else { host };
    println!("tile     packed  direct  (GFLOP/s, 1 thread)");
    for (mr, nr) in register_tiles(&t) {
        let packed = compile_microkernel(&t, mr, nr).expect("compile");
        let direct = compile_direct_kernel(&t, mr, nr, Epilogue::default()).expect("compile");
        let p = anyshape_codegen::time_microkernel(&packed.kernel(), &t);
        let d = time_direct_kernel(&direct.kernel(), &t);
        println!("{mr:>2}x{nr:<3} {p:8.1} {d:7.1}");
    }
}
