//! Any bytes given to the artifact loader give a model or an error, never a
//! panic or a crash (loading runs none of the artifact's code).
//!
//! Most mutations break the BLAKE3 hashes and stop at the first check. So that
//! the fuzzer also reaches what lies behind them (the metadata's decoding, the
//! plan's validation, the relocation of each object), an input whose first
//! byte is odd has its hashes recomputed, as the writer computes them (the
//! layout in `crates/runtime/src/artifact.rs`), before it is loaded.
#![no_main]

use std::sync::Arc;

use runtime::{CompiledModel, LoadOptions};

const HEADER: usize = 112;

fn reseal(bytes: &mut [u8]) {
    if bytes.len() < HEADER {
        return;
    }
    let field = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or([0; 8]));
    let (meta, code, weights_at) = (field(16), field(24), field(32));
    let code_end = (HEADER as u64).saturating_add(meta).saturating_add(code);
    if code_end > bytes.len() as u64 || weights_at > bytes.len() as u64 {
        return;
    }
    let mut h = blake3::Hasher::new();
    h.update(&bytes[0..48]);
    h.update(&bytes[HEADER..code_end as usize]);
    let first = h.finalize();
    let second = blake3::hash(&bytes[weights_at as usize..]);
    bytes[48..80].copy_from_slice(first.as_bytes());
    bytes[80..112].copy_from_slice(second.as_bytes());
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let mut bytes = rest.to_vec();
    if mode & 1 == 1 {
        reseal(&mut bytes);
    }
    let _ = CompiledModel::from_artifact(Arc::new(bytes), &LoadOptions::new().threads(1));
});
