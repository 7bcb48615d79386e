//! Inputs that once crashed the artifact loader under `cargo fuzz` (target
//! `load_artifact`; each file is the fuzzer's input: a mode byte, then the
//! artifact, whose hashes are recomputed when the mode byte is odd). Each must
//! now load or give an error, never panic.

use std::sync::Arc;

use runtime::{reseal_artifact, ArtifactOptions, CompiledModel};

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
            reseal_artifact(&mut bytes);
        }
        let r = CompiledModel::from_artifact(Arc::new(bytes), &ArtifactOptions::new().threads(1));
        assert!(r.is_err(), "{}: a damaged artifact loaded", path.display());
        seen += 1;
    }
    assert!(seen > 0, "no inputs in {}", dir.display());
}
