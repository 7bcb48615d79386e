//! Any bytes given to the artifact loader give a model or an error, never a
//! panic or a crash (loading runs none of the artifact's code).
//!
//! Most mutations break the BLAKE3 hashes and stop at the first check. So that
//! the fuzzer also reaches what lies behind them (the metadata's decoding, the
//! plan's validation, the relocation of each object), an input whose first
//! byte is odd has its hashes recomputed, as the writer computes them
//! (`runtime::reseal_artifact`), before it is loaded.
#![no_main]

use std::sync::Arc;

use runtime::{reseal_artifact, CompiledModel, ArtifactOptions};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let mut bytes = rest.to_vec();
    if mode & 1 == 1 {
        reseal_artifact(&mut bytes);
    }
    let _ = CompiledModel::from_artifact(Arc::new(bytes), &ArtifactOptions::new().threads(1));
});
