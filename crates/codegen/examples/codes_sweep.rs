//! Each AMX u8s8 tile's rate storing 8-bit codes, swept over C's column panels
//! as the driver runs a product (`time_codes_sweep`), at several depths, beside
//! its rate on L1's panels: `cargo run --release -p anyshape-codegen --example
//! codes_sweep`. What the tuning record keeps is the rate at `CODES_DEPTH`.

use anyshape_codegen::{compile_microkernel_with, time_codes_sweep, time_microkernel, tuning};
use kernels::{ElemType, Target, AMX_TILES};
use plan::Epilogue;

fn main() {
    let t = Target::detect();
    if !AMX_TILES.iter().any(|&(mr, nr)| t.amx_tile(ElemType::U8S8, mr, nr)) {
        println!("this CPU has no AMX-INT8 tiles: nothing to measure");
        return;
    }
    let codes = tuning::codes_epilogue();
    for &(mr, nr) in AMX_TILES.iter().filter(|&&(mr, nr)| t.amx_tile(ElemType::U8S8, mr, nr)) {
        let compile = |ep| compile_microkernel_with(&t, ElemType::U8S8, mr, nr, ep).expect("compile");
        let l1 = time_microkernel(&compile(Epilogue::default()).kernel(), &t);
        let k = compile(codes);
        let rates: Vec<String> = [64, 128, 256, 576, 1152]
            .iter()
            .map(|&depth| format!("K {depth}: {:.0}", time_codes_sweep(&k.kernel(), depth)))
            .collect();
        println!("{mr}x{nr}: L1's panels {l1:.0} GOP/s; storing codes {}", rates.join(", "));
    }
}
