//! Names for the generated code in Linux `perf` profiles. JIT code has no symbol
//! table, so `perf report` shows bare addresses in `[JIT]` memory; when
//! `ANYSHAPE_PERF_MAP` is set (to anything but `0`), every compiled function is
//! appended to `/tmp/perf-<pid>.map` (perf's convention for JIT code: one
//! `START SIZE name` line per function, in hex), so that a profile tells the
//! micro-kernels, the packing routines and the driver apart.
//!
//! The sizes come from an object file emitted from the same optimized module:
//! the JIT and the object are the same code generation of the same IR.

use std::io::Write;

use inkwell::execution_engine::ExecutionEngine;
use inkwell::module::Module;
use inkwell::targets::{FileType, TargetMachine};
use object::{Object, ObjectSymbol, SymbolKind};

use crate::{llvm, CodegenError};

/// Whether the environment asks for a perf map.
pub(crate) fn wanted() -> bool {
    std::env::var_os("ANYSHAPE_PERF_MAP").is_some_and(|v| v != "0")
}

/// The defined functions of `module` and their sizes in bytes, from an object
/// file of it (call before the module goes to an engine).
pub(crate) fn function_sizes(
    tm: &TargetMachine,
    module: &Module<'static>,
) -> Result<Vec<(String, u64)>, CodegenError> {
    let buf = tm.write_to_memory_buffer(module, FileType::Object).map_err(llvm)?;
    let file = object::File::parse(buf.as_slice()).map_err(llvm)?;
    Ok(file
        .symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.is_definition() && s.size() > 0)
        .filter_map(|s| Some((s.name().ok()?.to_string(), s.size())))
        .collect())
}

/// Append the functions' addresses in `engine` to this process's perf map.
pub(crate) fn append(engine: &ExecutionEngine<'static>, sizes: &[(String, u64)]) -> Result<(), CodegenError> {
    let mut lines = String::new();
    for (name, size) in sizes {
        let addr = engine.get_function_address(name).map_err(llvm)?;
        lines.push_str(&format!("{addr:x} {size:x} anyshape::{name}\n"));
    }
    let path = format!("/tmp/perf-{}.map", std::process::id());
    let io = |e: std::io::Error| CodegenError::Llvm(format!("perf map {path}: {e}"));
    // One write per module: appends from several compiling threads do not interleave.
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&path).map_err(io)?;
    f.write_all(lines.as_bytes()).map_err(io)
}
