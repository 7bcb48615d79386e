//! Each u8s8 tile's rate storing 8-bit codes, swept over C's column panels as
//! the driver runs a product (`time_codes_sweep`), at several depths, beside
//! its rate on L1's panels: the AMX tiles where the CPU has them, then every
//! vector register tile (VNNI, or AVX2 without it). `cargo run --release -p
//! anyshape-codegen --example codes_sweep`. What the tuning record keeps is the
//! AMX tiles' rate at `CODES_DEPTH`; the vector tiles' rates show whether a
//! taller or wider one would store codes faster than the record's ranking
//! (on L1's panels) assumes. A tile that does not divide the sweep prints `-`.

use anyshape_codegen::{
    compile_microkernel_with, register_tiles, time_codes_sweep, time_microkernel, tuning,
};
use kernels::{ElemType, Target, AMX_TILES};
use plan::Epilogue;

fn main() {
    let t = Target::detect();
    let codes = tuning::codes_epilogue();
    let amx = AMX_TILES.iter().copied().filter(|&(mr, nr)| t.amx_tile(ElemType::U8S8, mr, nr));
    let tiles: Vec<(usize, usize)> = amx.chain(register_tiles(&t)).collect();
    for (mr, nr) in tiles {
        let compile = |ep| compile_microkernel_with(&t, ElemType::U8S8, mr, nr, ep).expect("compile");
        let l1 = time_microkernel(&compile(Epilogue::default()).kernel(), &t);
        let k = compile(codes);
        let rates: Vec<String> = [64, 128, 256, 576, 1152]
            .iter()
            .map(|&depth| {
                let rate = time_codes_sweep(&k.kernel(), depth);
                match rate > 0.0 {
                    true => format!("K {depth}: {rate:.0}"),
                    false => format!("K {depth}: -"),
                }
            })
            .collect();
        println!("{mr}x{nr}: L1's panels {l1:.0} GOP/s; storing codes {}", rates.join(", "));
    }
}
