//! Names for the generated code in Linux `perf` profiles. JIT code has no symbol
//! table, so `perf report` shows bare addresses in `[JIT]` memory; when
//! `ANYSHAPE_PERF_MAP` is set (to anything but `0`), every compiled function is
//! appended to `/tmp/perf-<pid>.map` (perf's convention for JIT code: one
//! `START SIZE name` line per function, in hex), so that a profile tells the
//! micro-kernels, the packing routines and the driver apart.
//! The names, addresses and sizes come from the loaded object's symbols.

use std::io::Write;

use kernels::CodeImage;

use crate::CodegenError;

/// Whether the environment asks for a perf map.
pub(crate) fn wanted() -> bool {
    std::env::var_os("ANYSHAPE_PERF_MAP").is_some_and(|v| v != "0")
}

/// Append the functions of `image` to this process's perf map.
pub(crate) fn append(image: &CodeImage) -> Result<(), CodegenError> {
    let mut lines = String::new();
    for (name, addr, size) in image.functions() {
        lines.push_str(&format!("{addr:x} {size:x} anyshape::{name}\n"));
    }
    let path = format!("/tmp/perf-{}.map", std::process::id());
    let io = |e: std::io::Error| CodegenError::Llvm(format!("perf map {path}: {e}"));
    // One write per module: appends from several compiling threads do not interleave.
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&path).map_err(io)?;
    f.write_all(lines.as_bytes()).map_err(io)
}
