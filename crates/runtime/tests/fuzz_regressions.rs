//! Inputs that once crashed the artifact loader under `cargo fuzz` (target
//! `load_artifact`; each file is the fuzzer's input: a mode byte, then the
//! artifact, whose hashes are recomputed when the mode byte is odd). Each must
//! now load or give an error, never panic.

use std::sync::Arc;

use runtime::{CompiledModel, LoadOptions};

const HEADER: usize = 112;

/// The hashes recomputed as the writer computes them (the layout in `artifact.rs`).
fn reseal(bytes: &mut [u8]) {
    if bytes.len() < HEADER {
        return;
    }
    let field = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
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

#[test]
fn former_crashes_are_errors() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_inputs");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("fuzz inputs") {
        let path = entry.expect("entry").path();
        let data = std::fs::read(&path).expect("read");
        let Some((&mode, rest)) = data.split_first() else { continue };
        let mut bytes = rest.to_vec();
        if mode & 1 == 1 {
            reseal(&mut bytes);
        }
        let r = CompiledModel::from_artifact(Arc::new(bytes), &LoadOptions::new().threads(1));
        assert!(r.is_err(), "{}: a damaged artifact loaded", path.display());
        seen += 1;
    }
    assert!(seen > 0, "no inputs in {}", dir.display());
}
