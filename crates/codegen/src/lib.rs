//! Code generation with LLVM 19 (through `inkwell`): the only crate that links
//! LLVM. It generates a model's loop programs (`loops`), the contraction
//! engine's micro-kernels, direct kernels and packing routines (`family`,
//! `direct`, `pack`), JIT-compiled in memory for the host (or restricted to
//! AVX2) or kept as objects (`objects`), and the GPU GEMM family's PTX
//! (`nvptx`), with their IR and assembly kept for inspection.
//!
//! A micro-kernel computes an `MR × NR` tile of C from packed panels (the ABI in
//! `kernels::gemm`): `NR / W` vector accumulators per row (`W` f32 lanes), a K
//! loop of one broadcast of A per row and fused multiply-adds, and a store that
//! either overwrites C or adds to it. The element type is a parameter: a bf16
//! kernel's K loop steps over words of two depths, broadcasts one word of A per
//! row and multiplies with `vdpbf16ps` (two products per f32 lane), and
//! everything around the loop (accumulators, store, epilogue) is the f32 kernel's. `MR` and `NR` are chosen so that the
//! accumulators, the B vectors and the broadcast fit the register file.

use inkwell::attributes::AttributeLoc;
use inkwell::basic_block::BasicBlock;
use inkwell::context::Context;
use inkwell::intrinsics::Intrinsic;
use inkwell::module::Module;
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{
    CodeModel, FileType, InitializationConfig, RelocMode, Target as LlvmTarget, TargetMachine,
};
use inkwell::values::{BasicValue, BasicValueEnum, FloatValue, IntValue, PointerValue, VectorValue};
use inkwell::{AddressSpace, FloatPredicate, IntPredicate, OptimizationLevel};
use kernels::{CodeImage, DirectKernel, ElemType, MicroKernel, MicroKernelFn, Target};
use plan::Epilogue;

pub use direct::{compile_direct_kernel, compile_direct_kernel_cached, time_direct_kernel};
pub use family::{direct_family_tiles, family_tiles, Contraction, ContractionBuilder};
pub use loops::{compile_programs, compile_programs_with, CompiledPrograms};
pub use objects::ObjectCache;
pub use pack::{compile_packers, compile_packers_cached, JitPackers};

/// Errors from code generation.
#[derive(Debug, thiserror::Error)]
pub enum CodegenError {
    #[error("LLVM: {0}")]
    Llvm(String),
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The contraction engine refused a schedule or operand while measuring.
    #[error("kernel: {0}")]
    Kernel(String),
}

fn llvm<E: std::fmt::Display>(e: E) -> CodegenError {
    CodegenError::Llvm(e.to_string())
}

/// Progress of a compilation, for a progress bar: `Add(n)` announces `n` more
/// units (kernels, modules) to compile, `Done` says one is compiled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    Add(usize),
    Done,
}

/// Where a compilation reports its [`Progress`].
pub type ProgressFn<'a> = &'a (dyn Fn(Progress) + Sync);

/// A compiled kernel (`K`: its descriptor, with the function pointer). The
/// machine code lives as long as this value.
pub struct JitKernel<K> {
    kernel: K,
    ir: OptimizedIr,
    // Owns the machine code the function pointer points into; only dropped.
    _image: CodeImage,
}

/// A packed-panel micro-kernel, compiled.
pub type JitMicroKernel = JitKernel<MicroKernel>;
/// A direct (in-place operands) micro-kernel, compiled.
pub type JitDirectKernel = JitKernel<DirectKernel>;

impl<K: Copy> JitKernel<K> {
    pub fn kernel(&self) -> K {
        self.kernel
    }
    /// The optimized LLVM IR.
    pub fn ir(&self) -> &str {
        self.ir.text()
    }
    /// The generated assembly (emitted again from the IR, on demand).
    pub fn asm(&self) -> String {
        self.ir.asm()
    }
    /// The machine code the kernel's function pointer points into (which
    /// stays valid while the image lives).
    pub fn into_image(self) -> CodeImage {
        self._image
    }
}

/// The most lines of the next B panel a tile asks for in one burst at its start
/// (more are spread over its K loop).
const BURST_LINES: usize = 32;

/// The micro-kernel's K steps a trip of its unrolled loop.
const K_UNROLL: usize = 4;

/// The register tiles that fit `t`'s register file: accumulators `MR·NR/W`, plus
/// the `NR/W` B vectors and one broadcast (Vortex's L0 filter: ISA and register
/// budget).
pub fn register_tiles(t: &Target) -> Vec<(usize, usize)> {
    let w = t.f32_lanes;
    let mut out = Vec::new();
    for nv in 1..=4 {
        for mr in 1..=16 {
            // accumulators + B vectors + one broadcast
            if mr * nv + nv < t.vector_registers {
                out.push((mr, nv * w));
            }
        }
    }
    out
}

mod amx;
mod direct;

/// The AMX tile whose steps the peak loop of an AMX family multiplies.
const AMX_PEAK_TILE: (usize, usize) = (32, 32);
#[cfg(feature = "nvptx")]
pub mod emulator;
mod family;
mod loops;
#[cfg(feature = "nvptx")]
pub mod nvptx;
mod objects;
mod pack;
pub mod peak;
mod perfmap;
pub mod refine;
pub mod tuning;
mod vmath;

/// What every CPU emitter answers for f16, which `Target::check_elem` refuses
/// before any of them runs.
fn f16_on_cpu() -> CodegenError {
    CodegenError::Unsupported("the CPU kernel families have no f16 form (f32, bf16, u8s8, i16)".into())
}

/// Compile an `mr × nr` f32 micro-kernel for `t` (`nr` a multiple of its lanes).
pub fn compile_microkernel(t: &Target, mr: usize, nr: usize) -> Result<JitMicroKernel, CodegenError> {
    compile_microkernel_with(t, ElemType::F32, mr, nr, Epilogue::default())
}

/// [`compile_microkernel_with`] through `cache`.
pub fn compile_microkernel_cached(
    t: &Target,
    elem: ElemType,
    mr: usize,
    nr: usize,
    epilogue: Epilogue,
    cache: &ObjectCache,
) -> Result<JitMicroKernel, CodegenError> {
    let w = check_tile(t, mr, nr)?;
    t.check_elem(elem).map_err(|e| CodegenError::Unsupported(e.to_string()))?;
    let amx = t.amx_tile(elem, mr, nr);
    let name = format!(
        "ukernel_{elem}_{mr}x{nr}{}{}",
        if amx { "_amx" } else { "" },
        if epilogue.is_identity() { "" } else { "_epilogue" }
    );
    let jit = jit_function(t, &name, cache, |ctx, module, cpu, features| match amx {
        true => amx::build_microkernel(ctx, module, &name, (mr, nr, w, elem), &epilogue, cpu, features),
        false => build_microkernel(ctx, module, &name, (mr, nr, w, elem), &epilogue, cpu, features),
    })?;
    // SAFETY: `name` was just generated with exactly the `MicroKernelFn` signature
    // and the C calling convention; the image that holds it lives in the returned value.
    let func: MicroKernelFn = unsafe { jit.image.entry(&name) }.map_err(|e| llvm(e.to_string()))?;
    Ok(JitMicroKernel {
        kernel: MicroKernel { mr, nr, elem, func, epilogue, packers: Default::default(), amx },
        ir: jit.ir,
        _image: jit.image,
    })
}

/// Compile an `mr × nr` micro-kernel multiplying `elem` with `epilogue` applied
/// to each tile in registers when the driver asks for it (the last K block).
pub fn compile_microkernel_with(
    t: &Target,
    elem: ElemType,
    mr: usize,
    nr: usize,
    epilogue: Epilogue,
) -> Result<JitMicroKernel, CodegenError> {
    compile_microkernel_cached(t, elem, mr, nr, epilogue, &ObjectCache::none())
}

/// The target must have the kernels' ISA, and the tile be `mr` rows by a multiple
/// of the vector width; returns that width (f32 lanes).
pub(crate) fn check_tile(t: &Target, mr: usize, nr: usize) -> Result<usize, CodegenError> {
    let w = t.f32_lanes;
    if !t.supported() {
        return Err(CodegenError::Unsupported("kernels need x86-64 with AVX2 and FMA".into()));
    }
    if mr == 0 || nr == 0 || !nr.is_multiple_of(w) {
        return Err(CodegenError::Unsupported(format!(
            "a {mr}x{nr} tile: NR must be a positive multiple of {w}"
        )));
    }
    Ok(w)
}

/// A function compiled into executable memory.
pub(crate) struct Jitted {
    pub addr: usize,
    pub ir: OptimizedIr,
    pub image: CodeImage,
}

/// A module's IR, kept as built (before optimization): its optimized form and
/// its assembly are made again from it on demand (`--dump-llvm`, tests), which
/// a compile whose objects come from the cache never needs.
#[derive(Debug, Default)]
pub struct OptimizedIr {
    source: String,
    cpu: String,
    features: String,
    optimized: std::sync::OnceLock<String>,
}

impl Clone for OptimizedIr {
    fn clone(&self) -> Self {
        OptimizedIr {
            source: self.source.clone(),
            cpu: self.cpu.clone(),
            features: self.features.clone(),
            optimized: self.optimized.clone(),
        }
    }
}

impl OptimizedIr {
    /// The optimized IR (a comment line naming the failure when LLVM cannot
    /// make it again).
    pub fn text(&self) -> &str {
        self.optimized.get_or_init(|| {
            self.with_optimized(|m, _| Ok(m.print_to_string().to_string()))
                .unwrap_or_else(|e| format!("; no optimized IR: {e}\n"))
        })
    }

    /// The assembly LLVM makes of this IR for its CPU (a comment line naming the
    /// failure when it cannot).
    pub fn asm(&self) -> String {
        self.with_optimized(|m, tm| {
            let asm = tm.write_to_memory_buffer(m, FileType::Assembly).map_err(llvm)?;
            Ok(String::from_utf8_lossy(asm.as_slice()).into_owned())
        })
        .unwrap_or_else(|e| format!("; no assembly: {e}\n"))
    }

    /// Parse the IR again, optimize it as the compile did, and pass it on.
    fn with_optimized<T>(
        &self,
        f: impl FnOnce(&Module<'_>, &TargetMachine) -> Result<T, CodegenError>,
    ) -> Result<T, CodegenError>
    where
        T: Default,
    {
        if self.source.is_empty() {
            return Ok(T::default());
        }
        let ctx = Context::create();
        let buf =
            inkwell::memory_buffer::MemoryBuffer::create_from_memory_range_copy(self.source.as_bytes(), "ir");
        let module = ctx.create_module_from_ir(buf).map_err(llvm)?;
        let tm = target_machine(&self.cpu, &self.features)?;
        module.run_passes(objects::PIPELINE, &tm, PassBuilderOptions::create()).map_err(llvm)?;
        f(&module, &tm)
    }
}

/// The host's target machine for `cpu` with `features`, optimizing fully, for
/// position-independent code in the small code model (what
/// [`CodeImage::load`] relocates).
fn target_machine(cpu: &str, features: &str) -> Result<TargetMachine, CodegenError> {
    LlvmTarget::initialize_native(&InitializationConfig::default()).map_err(CodegenError::Llvm)?;
    let triple = TargetMachine::get_default_triple();
    let target = LlvmTarget::from_triple(&triple).map_err(llvm)?;
    target
        .create_target_machine(
            &triple,
            cpu,
            features,
            OptimizationLevel::Aggressive,
            RelocMode::PIC,
            CodeModel::Small,
        )
        .ok_or_else(|| CodegenError::Llvm("no target machine for the host".into()))
}

/// Build one function with `build`, compile it (O3) for `t` through `cache`,
/// load it.
pub(crate) fn jit_function(
    t: &Target,
    name: &str,
    cache: &ObjectCache,
    build: impl FnOnce(&'static Context, &Module<'static>, &str, &str) -> Result<(), CodegenError>,
) -> Result<Jitted, CodegenError> {
    let (image, ir) = jit_module(t, name, cache, build)?;
    let addr = image.function(name).ok_or_else(|| llvm(format!("no function {name} in its object")))?;
    Ok(Jitted { addr, ir, image })
}

/// Build a module of functions with `build`; take its object from `cache`, or
/// optimize it (O3) for `t`, emit the object and store it there; load the
/// object into executable memory. Returns the loaded code and the module's IR.
pub(crate) fn jit_module(
    t: &Target,
    name: &str,
    cache: &ObjectCache,
    build: impl FnOnce(&'static Context, &Module<'static>, &str, &str) -> Result<(), CodegenError>,
) -> Result<(CodeImage, OptimizedIr), CodegenError> {
    LlvmTarget::initialize_native(&InitializationConfig::default()).map_err(CodegenError::Llvm)?;
    // One context per compiled module. The builders type their values with the
    // context's lifetime as `'static`; the context is freed once the module
    // and every value made from it are gone (the end of `compiled` below).
    let owner = Box::new(Context::create());
    // SAFETY: `owner` outlives every use of `ctx`: `ctx` goes only to `build` and
    // to the module made in `compiled`, which drops that module before returning;
    // `build` returns nothing that borrows the context (its result holds
    // `CodegenError`s: owned strings), and the crate's builders keep none of its
    // values past their return. `owner` is dropped after `compiled` returns.
    let ctx: &'static Context = unsafe { &*(owner.as_ref() as *const Context) };
    let (cpu, features) = cpu_and_features(t);
    let compiled = || -> Result<(Vec<u8>, String), CodegenError> {
        let module = ctx.create_module(name);
        build(ctx, &module, &cpu, &features)?;
        module.verify().map_err(|e| CodegenError::Llvm(format!("invalid IR: {e}")))?;
        let source = module.print_to_string().to_string();
        let key = ObjectCache::key(&source, &cpu, &features);
        let object = match cache.get(&key) {
            Some(object) => object,
            None => {
                let tm = target_machine(&cpu, &features)?;
                module.run_passes(objects::PIPELINE, &tm, PassBuilderOptions::create()).map_err(llvm)?;
                let object =
                    tm.write_to_memory_buffer(&module, FileType::Object).map_err(llvm)?.as_slice().to_vec();
                cache.put(&key, &object);
                object
            }
        };
        Ok((object, source))
    };
    let compiled = compiled();
    drop(owner);
    let (object, source) = compiled?;
    let image = CodeImage::load(&object).map_err(|e| CodegenError::Llvm(format!("loading {name}: {e}")))?;
    if perfmap::wanted() {
        perfmap::append(&image)?;
    }
    Ok((image, OptimizedIr { source, cpu, features, optimized: Default::default() }))
}

/// The CPU name and feature string kernels for `t` are generated for (what a
/// compiled artifact requires of the machine that loads it).
pub fn code_target(t: &Target) -> (String, String) {
    cpu_and_features(t)
}

/// CPU name and features for LLVM: the host's, or AVX2 only.
fn cpu_and_features(t: &Target) -> (String, String) {
    if t.isa.avx512f {
        (TargetMachine::get_host_cpu_name().to_string(), TargetMachine::get_host_cpu_features().to_string())
    } else {
        // x86-64-v3: AVX2, FMA, BMI; no AVX-512, whatever the host has.
        ("x86-64-v3".to_string(), String::new())
    }
}

/// The features code multiplying in `elem` needs beyond `features`: AVX-VNNI
/// for u8s8 on an AVX2 target (an AVX-512 target's host features have VNNI), so
/// that only code that uses it asks a machine for it.
pub fn features_for(elem: ElemType, features: &str) -> String {
    if elem == ElemType::U8S8 && !features.contains("vnni") {
        let sep = if features.is_empty() { "" } else { "," };
        format!("{features}{sep}+avxvnni")
    } else {
        features.to_string()
    }
}

/// Set the target CPU and features, and the vector width LLVM must use, on `f`.
pub(crate) fn target_attributes(
    ctx: &'static Context,
    f: inkwell::values::FunctionValue<'static>,
    cpu: &str,
    features: &str,
    lanes: usize,
) {
    for (k, v) in [("target-cpu", cpu), ("target-features", features)] {
        f.add_attribute(AttributeLoc::Function, ctx.create_string_attribute(k, v));
    }
    let width = (lanes * 32).to_string();
    for k in ["prefer-vector-width", "min-legal-vector-width"] {
        f.add_attribute(AttributeLoc::Function, ctx.create_string_attribute(k, &width));
    }
}

#[allow(clippy::too_many_arguments)]
fn build_microkernel(
    ctx: &'static Context,
    module: &Module<'static>,
    name: &str,
    (mr, nr, w, elem): (usize, usize, usize, ElemType),
    epilogue: &Epilogue,
    cpu: &str,
    features: &str,
) -> Result<(), CodegenError> {
    let (f32t, i64t) = (ctx.f32_type(), ctx.i64_type());
    let ptr = ctx.ptr_type(AddressSpace::default());
    let vt = f32t.vec_type(w as u32);
    let acc_t = accumulator_type(ctx, elem, w);
    let nv = nr / w;
    let f = declare_microkernel(ctx, module, name, cpu, &features_for(elem, features), w);
    let kc = f.get_nth_param(0).ok_or_else(|| llvm("param"))?.into_int_value();
    let a = f.get_nth_param(1).ok_or_else(|| llvm("param"))?.into_pointer_value();
    let b = f.get_nth_param(2).ok_or_else(|| llvm("param"))?.into_pointer_value();
    let c = f.get_nth_param(3).ok_or_else(|| llvm("param"))?.into_pointer_value();
    let ldc = f.get_nth_param(4).ok_or_else(|| llvm("param"))?.into_int_value();
    let flags = f.get_nth_param(5).ok_or_else(|| llvm("param"))?.into_int_value();
    let bias = f.get_nth_param(6).ok_or_else(|| llvm("param"))?.into_pointer_value();
    let res = f.get_nth_param(7).ok_or_else(|| llvm("param"))?.into_pointer_value();
    let ldr = f.get_nth_param(8).ok_or_else(|| llvm("param"))?.into_int_value();
    let tiles = f.get_nth_param(9).ok_or_else(|| llvm("param"))?.into_int_value();
    let next_b = f.get_nth_param(10).ok_or_else(|| llvm("param"))?.into_pointer_value();
    let cscale = f.get_nth_param(11).ok_or_else(|| llvm("param"))?.into_pointer_value();
    let params = f.get_nth_param(12).ok_or_else(|| llvm("param"))?.into_pointer_value();

    let bld = ctx.create_builder();
    let entry = ctx.append_basic_block(f, "entry");
    let tile_head = ctx.append_basic_block(f, "tile.head");
    let pf_cond = ctx.append_basic_block(f, "prefetch.cond");
    let pf_body = ctx.append_basic_block(f, "prefetch.body");
    let kpre = ctx.append_basic_block(f, "k.pre");
    let u_header = ctx.append_basic_block(f, "k.unrolled.header");
    let u_body = ctx.append_basic_block(f, "k.unrolled.body");
    let header = ctx.append_basic_block(f, "k.header");
    let body = ctx.append_basic_block(f, "k.body");
    let body_pf = ctx.append_basic_block(f, "k.prefetch");
    let body_main = ctx.append_basic_block(f, "k.main");
    let done = ctx.append_basic_block(f, "k.done");
    let add_c = ctx.append_basic_block(f, "store.add");
    let set_c = ctx.append_basic_block(f, "store.set");
    let merge = ctx.append_basic_block(f, "store.merge");
    let epi = ctx.append_basic_block(f, "store.epilogue");
    let plain = ctx.append_basic_block(f, "store.plain");
    let exit = ctx.append_basic_block(f, "exit");
    let tile_latch = ctx.append_basic_block(f, "tile.latch");
    let ret = ctx.append_basic_block(f, "ret");

    bld.position_at_end(entry);
    let c_i64 = |v: usize| i64t.const_int(v as u64, false);
    // The loop runs over panel words: `kc` of them for f32, `⌈kc / 2⌉` for bf16.
    let g = elem.k_group();
    let kc = if g == 1 {
        kc
    } else {
        let up = bld.build_int_add(kc, c_i64(g - 1), "kc.up").map_err(llvm)?;
        bld.build_int_unsigned_div(up, c_i64(g), "kw").map_err(llvm)?
    };
    // The next B panel's cache lines (`kw·NR` words, 64 bytes to a line), a share
    // per tile; none when `next_b` is null.
    let b_words_per_line = 64 / elem.b_word_bytes();
    let lines = bld
        .build_int_unsigned_div(
            bld.build_int_mul(kc, c_i64(nr), "bw").map_err(llvm)?,
            c_i64(b_words_per_line),
            "lines",
        )
        .map_err(llvm)?;
    let has_next = bld.build_is_not_null(next_b, "has.next").map_err(llvm)?;
    let lines = bld.build_select(has_next, lines, c_i64(0), "lines").map_err(llvm)?.into_int_value();
    let tiles1 = bld.build_int_compare(IntPredicate::SGT, tiles, c_i64(1), "tiles.gt1").map_err(llvm)?;
    let tiles = bld.build_select(tiles1, tiles, c_i64(1), "tiles").map_err(llvm)?.into_int_value();
    let share = bld
        .build_int_add(lines, bld.build_int_sub(tiles, c_i64(1), "t1").map_err(llvm)?, "share.up")
        .map_err(llvm)?;
    let share = bld.build_int_unsigned_div(share, tiles, "share").map_err(llvm)?;
    // A small share (many tiles to a panel) is asked for in a burst at the tile's
    // start; a large one (few tiles: a short M streaming a weight) is spread over
    // the K loop at the rate the loop reads B, since a burst of hundreds of lines
    // stalls on the cache's miss buffers.
    let spread =
        bld.build_int_compare(IntPredicate::UGT, share, c_i64(BURST_LINES), "pf.spread").map_err(llvm)?;
    bld.build_unconditional_branch(tile_head).map_err(llvm)?;

    // tile.head: the tile's A panel, C tile and residual tile as phis (MR rows each).
    bld.position_at_end(tile_head);
    let t_phi = bld.build_phi(i64t, "t").map_err(llvm)?;
    let a_phi = bld.build_phi(ptr, "a.t").map_err(llvm)?;
    let c_phi = bld.build_phi(ptr, "c.t").map_err(llvm)?;
    let r_phi = bld.build_phi(ptr, "res.t").map_err(llvm)?;
    let t = t_phi.as_basic_value().into_int_value();
    let pf_lo = bld.build_int_mul(t, share, "pf.lo").map_err(llvm)?;
    let pf_hi = bld.build_int_add(pf_lo, share, "pf.hi").map_err(llvm)?;
    let over = bld.build_int_compare(IntPredicate::UGT, pf_hi, lines, "pf.over").map_err(llvm)?;
    let pf_hi = bld.build_select(over, lines, pf_hi, "pf.end").map_err(llvm)?.into_int_value();
    let burst_hi = bld.build_select(spread, pf_lo, pf_hi, "pf.burst").map_err(llvm)?.into_int_value();
    bld.build_unconditional_branch(pf_cond).map_err(llvm)?;
    bld.position_at_end(pf_cond);
    let l_phi = bld.build_phi(i64t, "l").map_err(llvm)?;
    let l = l_phi.as_basic_value().into_int_value();
    let more_pf = bld.build_int_compare(IntPredicate::ULT, l, burst_hi, "pf.more").map_err(llvm)?;
    bld.build_conditional_branch(more_pf, pf_body, kpre).map_err(llvm)?;
    bld.position_at_end(pf_body);
    let off = bld.build_int_mul(l, c_i64(16), "pf.off").map_err(llvm)?;
    // SAFETY (of the IR): a prefetch never faults; the address is only a hint.
    let at = unsafe { bld.build_gep(f32t, next_b, &[off], "pf.at") }.map_err(llvm)?;
    prefetch_to_l2(ctx, module, &bld, at.into())?;
    let l_next = bld.build_int_add(l, c_i64(1), "l.next").map_err(llvm)?;
    bld.build_unconditional_branch(pf_cond).map_err(llvm)?;
    l_phi.add_incoming(&[(&pf_lo, tile_head), (&l_next, pf_body)]);
    bld.position_at_end(kpre);
    let (a0, c0, r0) = (a, c, res);
    let a = a_phi.as_basic_value().into_pointer_value();
    let c = c_phi.as_basic_value().into_pointer_value();
    let res = r_phi.as_basic_value().into_pointer_value();
    // Without a spread share the K loop is unrolled (`K_UNROLL` steps a trip, the
    // rest one at a time below): a step's loads and FMAs are few against the
    // loop's own instructions, which would otherwise take the core's issue slots.
    bld.build_conditional_branch(spread, header, u_header).map_err(llvm)?;

    // k.header: the accumulators and k as phis.
    bld.position_at_end(header);
    let k_phi = bld.build_phi(i64t, "k").map_err(llvm)?;
    let mut acc_phis = Vec::with_capacity(mr * nv);
    for i in 0..mr * nv {
        acc_phis.push(bld.build_phi(acc_t, &format!("acc{i}")).map_err(llvm)?);
    }
    let k = k_phi.as_basic_value().into_int_value();
    let more = bld.build_int_compare(IntPredicate::SLT, k, kc, "more").map_err(llvm)?;
    bld.build_conditional_branch(more, body, done).map_err(llvm)?;

    // k.body: B vectors, one broadcast of A per row, FMAs (f32) or pair dot
    // products (bf16). An A panel word is 4 bytes whatever it holds, so A's
    // addresses step in f32 units; B's in units of its word (i16s8's are 2 bytes).
    bld.position_at_end(body);
    // The word vectors the multiply takes: W f32, or 2W bf16 (W pairs).
    let (wt, mul) = match elem {
        ElemType::F32 => {
            let fma = Intrinsic::find("llvm.fma").ok_or_else(|| llvm("no llvm.fma"))?;
            let fma = fma
                .get_declaration(module, &[vt.into()])
                .ok_or_else(|| llvm("no llvm.fma for the vector type"))?;
            (vt, fma)
        }
        ElemType::Bf16 => (ctx.bf16_type().vec_type(2 * w as u32), dpbf16ps(ctx, module, w)),
        // u8 words of A against s8 words of B, into i32 lanes.
        ElemType::U8S8 => (acc_t, vpdpbusd(ctx, module, w)),
        // Pairs of i16 into i32 lanes, then added to the accumulator (i16s8's B
        // bytes widened to such pairs as they load).
        ElemType::I16 | ElemType::I16S8 => (ctx.i16_type().vec_type(2 * w as u32), pmaddwd(ctx, module, w)),
        ElemType::F16 => return Err(f16_on_cpu()),
    };
    let gep = |base, idx: IntValue<'static>, n: &str| {
        // SAFETY (of the IR, not of Rust): indices stay inside the packed panels
        // and the C tile the ABI promises; the builder only records the address.
        unsafe { bld.build_in_bounds_gep(f32t, base, &[idx], n) }.map_err(llvm)
    };
    // B's word `idx` of the panel at `base`.
    let b_word_t: inkwell::types::BasicTypeEnum =
        if elem.b_word_bytes() == 2 { ctx.i16_type().into() } else { f32t.into() };
    let b_gep = |base, idx: IntValue<'static>, n: &str| {
        // SAFETY (of the IR): as `gep`, in units of B's word.
        unsafe { bld.build_in_bounds_gep(b_word_t, base, &[idx], n) }.map_err(llvm)
    };
    // One step at `k`: B's vectors, one broadcast of A per row, the multiplies
    // into `accs`; the new accumulators.
    let zero_mask = ctx.i32_type().vec_type(w as u32).const_zero();
    let step_at = |k: IntValue<'static>,
                   accs: &[BasicValueEnum<'static>]|
     -> Result<Vec<BasicValueEnum<'static>>, CodegenError> {
        let kb = bld.build_int_mul(k, c_i64(nr), "kb").map_err(llvm)?;
        let mut bvecs: Vec<VectorValue> = Vec::with_capacity(nv);
        for v in 0..nv {
            let idx = bld.build_int_add(kb, c_i64(v * w), "bi").map_err(llvm)?;
            let p = b_gep(b, idx, "bp")?;
            let vec = match elem {
                // W byte pairs, sign-extended to the i16 pairs `vpmaddwd` takes
                // (one `vpmovsxbw` from memory).
                ElemType::I16S8 => {
                    let load = bld.build_load(ctx.i8_type().vec_type(2 * w as u32), p, "b8").map_err(llvm)?;
                    set_align(&load, 2);
                    bld.build_int_s_extend(load.into_vector_value(), wt, "b").map_err(llvm)?
                }
                _ => {
                    let load = bld.build_load(wt, p, "b").map_err(llvm)?;
                    set_align(&load, 4);
                    load.into_vector_value()
                }
            };
            bvecs.push(vec);
        }
        let ka = bld.build_int_mul(k, c_i64(mr), "ka").map_err(llvm)?;
        let mut next = Vec::with_capacity(mr * nv);
        for i in 0..mr {
            let idx = bld.build_int_add(ka, c_i64(i), "ai").map_err(llvm)?;
            let p = gep(a, idx, "ap")?;
            let s: FloatValue = bld.build_load(f32t, p, "a").map_err(llvm)?.into_float_value();
            let one = bld
                .build_insert_element(vt.get_poison(), s, ctx.i32_type().const_zero(), "a1")
                .map_err(llvm)?;
            let splat = bld.build_shuffle_vector(one, vt.get_poison(), zero_mask, "abc").map_err(llvm)?;
            // The broadcast word as the multiply's operand type (a bit cast, no work).
            let splat = bld.build_bit_cast(splat, wt, "aw").map_err(llvm)?.into_vector_value();
            for (v, bv) in bvecs.iter().enumerate() {
                let acc = accs[i * nv + v];
                let args: &[_] = match elem {
                    ElemType::F32 => &[splat.into(), (*bv).into(), acc.into()],
                    ElemType::Bf16 | ElemType::U8S8 => &[acc.into(), splat.into(), (*bv).into()],
                    ElemType::I16 | ElemType::I16S8 => &[splat.into(), (*bv).into()],
                    ElemType::F16 => return Err(f16_on_cpu()),
                };
                let r = bld.build_call(mul, args, "mul").map_err(llvm)?;
                let r = match r.try_as_basic_value() {
                    inkwell::values::ValueKind::Basic(v) => v,
                    inkwell::values::ValueKind::Instruction(_) => return Err(llvm("fma returned nothing")),
                };
                next.push(match elem {
                    ElemType::I16 | ElemType::I16S8 => {
                        add_in_order(ctx, &bld, acc.into_vector_value(), r.into_vector_value())?
                    }
                    _ => r,
                });
            }
        }
        Ok(next)
    };
    let kb = bld.build_int_mul(k, c_i64(nr), "kb").map_err(llvm)?;
    // A spread share: the lines of step `k` (NR·word bytes/64 a step, as many as the step
    // reads of B); a step past the share prefetches its own B row again (in L1).
    bld.build_conditional_branch(spread, body_pf, body_main).map_err(llvm)?;
    bld.position_at_end(body_pf);
    let per_k = (nr / b_words_per_line).max(1);
    let first_line = bld
        .build_int_add(pf_lo, bld.build_int_mul(k, c_i64(per_k), "pf.k").map_err(llvm)?, "pf.l")
        .map_err(llvm)?;
    let here = b_gep(b, kb, "pf.here")?;
    for u in 0..per_k {
        let l = bld.build_int_add(first_line, c_i64(u), "pf.lu").map_err(llvm)?;
        let inside = bld.build_int_compare(IntPredicate::ULT, l, pf_hi, "pf.in").map_err(llvm)?;
        let off = bld.build_int_mul(l, c_i64(16), "pf.off").map_err(llvm)?;
        // SAFETY (of the IR): a prefetch never faults; the address is only a hint.
        let at = unsafe { bld.build_gep(f32t, next_b, &[off], "pf.at") }.map_err(llvm)?;
        let at = bld.build_select(inside, at, here, "pf.addr").map_err(llvm)?;
        prefetch_to_l2(ctx, module, &bld, at)?;
    }
    bld.build_unconditional_branch(body_main).map_err(llvm)?;
    bld.position_at_end(body_main);
    let accs: Vec<BasicValueEnum<'static>> = acc_phis.iter().map(|p| p.as_basic_value()).collect();
    let next = step_at(k, &accs)?;
    let k_next = bld.build_int_add(k, c_i64(1), "k.next").map_err(llvm)?;
    bld.build_unconditional_branch(header).map_err(llvm)?;

    // k.unrolled: `K_UNROLL` steps a trip while that many are left; then the
    // loop above takes the rest (its prefetch branch not taken).
    bld.position_at_end(u_header);
    let uk_phi = bld.build_phi(i64t, "k.u").map_err(llvm)?;
    let mut uacc_phis = Vec::with_capacity(mr * nv);
    for i in 0..mr * nv {
        uacc_phis.push(bld.build_phi(acc_t, &format!("acc.u{i}")).map_err(llvm)?);
    }
    let uk = uk_phi.as_basic_value().into_int_value();
    let uk_end = bld.build_int_add(uk, c_i64(K_UNROLL), "k.u.end").map_err(llvm)?;
    let u_more = bld.build_int_compare(IntPredicate::SLE, uk_end, kc, "more.u").map_err(llvm)?;
    bld.build_conditional_branch(u_more, u_body, header).map_err(llvm)?;
    bld.position_at_end(u_body);
    let mut uaccs: Vec<BasicValueEnum<'static>> = uacc_phis.iter().map(|p| p.as_basic_value()).collect();
    for s in 0..K_UNROLL {
        let ks = bld.build_int_add(uk, c_i64(s), "k.s").map_err(llvm)?;
        uaccs = step_at(ks, &uaccs)?;
    }
    bld.build_unconditional_branch(u_header).map_err(llvm)?;

    let zero = acc_t.const_zero();
    uk_phi.add_incoming(&[(&c_i64(0), kpre), (&uk_end, u_body)]);
    for (phi, nx) in uacc_phis.iter().zip(&uaccs) {
        phi.add_incoming(&[(&zero, kpre), (nx, u_body)]);
    }
    k_phi.add_incoming(&[(&c_i64(0), kpre), (&uk, u_header), (&k_next, body_main)]);
    for ((phi, nx), u) in acc_phis.iter().zip(&next).zip(&uacc_phis) {
        phi.add_incoming(&[(&zero, kpre), (&u.as_basic_value(), u_header), (nx, body_main)]);
    }

    // k.done: the tile's values (C added when accumulating), then the epilogue
    // (when compiled in and asked for), then the store.
    bld.position_at_end(done);
    // The tile's sums as f32 (the integer types' i32 sums converted: exact below 2^24).
    let mut sums = Vec::with_capacity(mr * nv);
    for p in &acc_phis[..mr * nv] {
        let acc = p.as_basic_value().into_vector_value();
        sums.push(match elem.is_integer() {
            true => bld.build_signed_int_to_float(acc, vt, "acc.f32").map_err(llvm)?,
            false => acc,
        });
    }
    let bit = |b: u64, n: &str| -> Result<_, CodegenError> {
        let masked = bld.build_and(flags, c_i64(b as usize), n).map_err(llvm)?;
        bld.build_int_compare(IntPredicate::NE, masked, c_i64(0), n).map_err(llvm)
    };
    // A tile of codes is never added to (its product is one K block) and always
    // ends in the epilogue, whose values it stores a byte each.
    let codes = epilogue.codes;
    if codes {
        bld.build_unconditional_branch(set_c).map_err(llvm)?;
    } else {
        let add = bit(kernels::ACCUMULATE as u64, "add")?;
        bld.build_conditional_branch(add, add_c, set_c).map_err(llvm)?;
    }
    let i8t = ctx.i8_type();
    let c_ptr = |i: usize, v: usize| -> Result<_, CodegenError> {
        let row = bld.build_int_mul(c_i64(i), ldc, "row").map_err(llvm)?;
        let idx = bld.build_int_add(row, c_i64(v * w), "ci").map_err(llvm)?;
        match codes {
            // SAFETY (of the IR): as `gep`, in the tile of bytes the ABI promises.
            true => unsafe { bld.build_in_bounds_gep(i8t, c, &[idx], "cp") }.map_err(llvm),
            false => gep(c, idx, "cp"),
        }
    };
    bld.position_at_end(add_c);
    let mut summed = Vec::with_capacity(mr * nv);
    for i in 0..mr {
        for v in 0..nv {
            let old = bld.build_load(vt, c_ptr(i, v)?, "c").map_err(llvm)?;
            set_align(&old, 4);
            summed.push(bld.build_float_add(old.into_vector_value(), sums[i * nv + v], "sum").map_err(llvm)?);
        }
    }
    let vals = join_tile(&bld, vt, (add_c, &summed), (set_c, &sums), merge)?;
    let store = |vals: &[VectorValue<'static>]| -> Result<(), CodegenError> {
        for i in 0..mr {
            for v in 0..nv {
                let st = bld.build_store(c_ptr(i, v)?, vals[i * nv + v]).map_err(llvm)?;
                st.set_alignment(4).map_err(llvm)?;
            }
        }
        Ok(())
    };
    if epilogue.is_identity() {
        bld.build_unconditional_branch(plain).map_err(llvm)?;
    } else if codes {
        bld.build_unconditional_branch(epi).map_err(llvm)?;
    } else {
        let apply = bit(kernels::APPLY_EPILOGUE as u64, "apply")?;
        bld.build_conditional_branch(apply, epi, plain).map_err(llvm)?;
    }
    bld.position_at_end(plain);
    store(&vals)?;
    bld.build_unconditional_branch(exit).map_err(llvm)?;
    // y = act(scale · acc + bias[col] + residual[row, col])
    bld.position_at_end(epi);
    let vm = vmath::VMath::new(ctx, module, &bld, vt, w, features);
    let mut out = vals.clone();
    let load = |base, idx, bytes: bool| -> Result<VectorValue<'static>, CodegenError> {
        let x = match bytes {
            // SAFETY (of the IR): as `gep`, in the residual's tile of bytes.
            true => {
                let at = unsafe { bld.build_in_bounds_gep(i8t, base, &[idx], "ep") }.map_err(llvm)?;
                let x = bld.build_load(i8t.vec_type(w as u32), at, "ep").map_err(llvm)?;
                set_align(&x, 1);
                x
            }
            false => {
                let x = bld.build_load(vt, gep(base, idx, "ep")?, "ep").map_err(llvm)?;
                set_align(&x, 4);
                x
            }
        };
        Ok(x.into_vector_value())
    };
    let ptrs = (cscale, bias, res, ldr, params);
    for i in 0..mr {
        for v in 0..nv {
            let y = out[i * nv + v];
            match codes {
                true => {
                    let b = vm.epilogue_codes(epilogue, y, ptrs, (i, v * w), &load)?;
                    let st = bld.build_store(c_ptr(i, v)?, b).map_err(llvm)?;
                    st.set_alignment(1).map_err(llvm)?;
                }
                false => out[i * nv + v] = vm.epilogue(epilogue, y, ptrs, (i, v * w), &load)?,
            }
        }
    }
    if !codes {
        store(&out)?;
    }
    bld.build_unconditional_branch(exit).map_err(llvm)?;
    bld.position_at_end(exit);
    bld.build_unconditional_branch(tile_latch).map_err(llvm)?;
    // tile.latch: the next MR rows (A's next panel, C's and the residual's rows).
    bld.position_at_end(tile_latch);
    let a_words = bld.build_int_mul(kc, c_i64(mr), "a.step").map_err(llvm)?;
    let phis = TilePhis { t: t_phi, a: a_phi, c: c_phi, res: r_phi, first: (a0, c0, r0) };
    let strides =
        TileStrides { a_words, ldc, ldr, mr, codes, residual_codes: epilogue.residual_codes, tiles };
    close_tile_loop(ctx, &bld, &phis, &strides, (entry, tile_latch, tile_head, ret))
}

/// The phis of a micro-kernel's loop over its tiles: the tile's index, its A
/// panel, its C rows and residual rows, and their values on entry.
pub(crate) struct TilePhis {
    pub t: inkwell::values::PhiValue<'static>,
    pub a: inkwell::values::PhiValue<'static>,
    pub c: inkwell::values::PhiValue<'static>,
    pub res: inkwell::values::PhiValue<'static>,
    pub first: (PointerValue<'static>, PointerValue<'static>, PointerValue<'static>),
}

/// How far the next tile is: A's panel (`a_words` words), `mr` rows of C
/// (`ldc` apart; bytes for codes) and of the residual (`ldr` apart; bytes for
/// codes); and the number of tiles.
pub(crate) struct TileStrides {
    pub a_words: IntValue<'static>,
    pub ldc: IntValue<'static>,
    pub ldr: IntValue<'static>,
    pub mr: usize,
    pub codes: bool,
    pub residual_codes: bool,
    pub tiles: IntValue<'static>,
}

/// The latch of a micro-kernel's loop over its tiles (block `latch`): the
/// next tile's A panel, C rows and residual rows, back to `head` while tiles
/// are left, else to `ret`, which returns.
pub(crate) fn close_tile_loop(
    ctx: &'static Context,
    bld: &inkwell::builder::Builder<'static>,
    phis: &TilePhis,
    s: &TileStrides,
    (entry, latch, head, ret): (
        BasicBlock<'static>,
        BasicBlock<'static>,
        BasicBlock<'static>,
        BasicBlock<'static>,
    ),
) -> Result<(), CodegenError> {
    let (f32t, i8t, i64t) = (ctx.f32_type(), ctx.i8_type(), ctx.i64_type());
    let c_i64 = |v: usize| i64t.const_int(v as u64, false);
    let (t, a) = (phis.t.as_basic_value().into_int_value(), phis.a.as_basic_value().into_pointer_value());
    let (c, res) =
        (phis.c.as_basic_value().into_pointer_value(), phis.res.as_basic_value().into_pointer_value());
    bld.position_at_end(latch);
    let t_next = bld.build_int_add(t, c_i64(1), "t.next").map_err(llvm)?;
    let step = |ty: inkwell::types::BasicTypeEnum<'static>, base, by: IntValue<'static>, n: &str| {
        // SAFETY (of the IR): a plain (not in-bounds) step: past the last tile
        // the pointer is not used, and the residual's may be null.
        unsafe { bld.build_gep(ty, base, &[by], n) }.map_err(llvm)
    };
    let a_next = step(f32t.into(), a, s.a_words, "a.next")?;
    let c_step = bld.build_int_mul(s.ldc, c_i64(s.mr), "c.step").map_err(llvm)?;
    let c_next = step(if s.codes { i8t.into() } else { f32t.into() }, c, c_step, "c.next")?;
    let r_step = bld.build_int_mul(s.ldr, c_i64(s.mr), "r.step").map_err(llvm)?;
    let r_next = step(if s.residual_codes { i8t.into() } else { f32t.into() }, res, r_step, "res.next")?;
    let again = bld.build_int_compare(IntPredicate::SLT, t_next, s.tiles, "again").map_err(llvm)?;
    bld.build_conditional_branch(again, head, ret).map_err(llvm)?;
    let (a0, c0, r0) = phis.first;
    phis.t.add_incoming(&[(&c_i64(0), entry), (&t_next, latch)]);
    phis.a.add_incoming(&[(&a0, entry), (&a_next, latch)]);
    phis.c.add_incoming(&[(&c0, entry), (&c_next, latch)]);
    phis.res.add_incoming(&[(&r0, entry), (&r_next, latch)]);
    bld.position_at_end(ret);
    bld.build_return(None).map_err(llvm)?;
    Ok(())
}

/// The bytes a tile of codes stores for `x`: integers in 0..=255 by the
/// compiler's bounds. Unless the epilogue's own last operation made them so
/// (`in_range`: [`plan::Epilogue::makes_codes`]), clamped to that range (NaN
/// to 0: a defined byte whatever the value) by compares and selects, which
/// become `vmaxps`/`vminps` (`llvm.fptoui.sat` to bytes scalarizes); then
/// truncated (exact) and narrowed (`vpmovdb`).
pub(crate) fn code_bytes(
    ctx: &'static Context,
    bld: &inkwell::builder::Builder<'static>,
    x: VectorValue<'static>,
    in_range: bool,
) -> Result<VectorValue<'static>, CodegenError> {
    let w = x.get_type().get_size();
    let (it, bt) = (ctx.i32_type().vec_type(w), ctx.i8_type().vec_type(w));
    let splat = |v: f64| {
        let c = ctx.f32_type().const_float(v);
        inkwell::types::VectorType::const_vector(&vec![c; w as usize])
    };
    let x = match in_range {
        true => x,
        false => {
            let (lo, hi) = (splat(0.0), splat(255.0));
            let pos = bld.build_float_compare(FloatPredicate::OGT, x, lo, "pos").map_err(llvm)?;
            let x = bld.build_select(pos, x, lo, "lo").map_err(llvm)?.into_vector_value();
            let below = bld.build_float_compare(FloatPredicate::OLT, x, hi, "below").map_err(llvm)?;
            bld.build_select(below, x, hi, "hi").map_err(llvm)?.into_vector_value()
        }
    };
    let n = bld.build_float_to_signed_int(x, it, "code").map_err(llvm)?;
    bld.build_int_truncate(n, bt, "byte").map_err(llvm)
}

/// Declare micro-kernel `name` with the `kernels::MicroKernelFn` signature
/// (`kc, a, b, c, ldc, flags, bias, residual, ldr, tiles, next_b,
/// column_scale, params`), for `cpu` and `features`, its panels and C not
/// aliasing one another.
pub(crate) fn declare_microkernel(
    ctx: &'static Context,
    module: &Module<'static>,
    name: &str,
    cpu: &str,
    features: &str,
    w: usize,
) -> inkwell::values::FunctionValue<'static> {
    let (i64t, ptr) = (ctx.i64_type(), ctx.ptr_type(AddressSpace::default()));
    let (i, p): (inkwell::types::BasicMetadataTypeEnum, inkwell::types::BasicMetadataTypeEnum) =
        (i64t.into(), ptr.into());
    let fn_type = ctx.void_type().fn_type(&[i, p, p, p, i, i, p, p, i, i, p, p, p], false);
    let f = module.add_function(name, fn_type, None);
    target_attributes(ctx, f, cpu, features, w);
    let noalias =
        ctx.create_enum_attribute(inkwell::attributes::Attribute::get_named_enum_kind_id("noalias"), 0);
    for i in 1..=3 {
        f.add_attribute(AttributeLoc::Param(i), noalias);
    }
    f
}

/// The vector a kernel of `elem` accumulates in (`w` lanes): f32, or i32 for
/// the integer types (their sums converted to f32 at the store).
pub(crate) fn accumulator_type(
    ctx: &'static Context,
    elem: ElemType,
    w: usize,
) -> inkwell::types::VectorType<'static> {
    match elem.is_integer() {
        true => ctx.i32_type().vec_type(w as u32),
        false => ctx.f32_type().vec_type(w as u32),
    }
}

/// `vpmaddwd` on `w` i32 lanes: each lane the sum of the products of its two
/// signed 16-bit pairs (`llvm.x86.avx2.pmadd.wd`, or AVX-512BW's 512-bit form).
pub(crate) fn pmaddwd(
    ctx: &'static Context,
    module: &Module<'static>,
    w: usize,
) -> inkwell::values::FunctionValue<'static> {
    let name = match w {
        16 => "llvm.x86.avx512.pmaddw.d.512",
        _ => "llvm.x86.avx2.pmadd.wd",
    };
    module.get_function(name).unwrap_or_else(|| {
        let ht = ctx.i16_type().vec_type(2 * w as u32);
        let it = ctx.i32_type().vec_type(w as u32);
        module.add_function(name, it.fn_type(&[ht.into(), ht.into()], false), None)
    })
}

/// `llvm.x86.avx512.vpdpbusd.{128·w/4}`: each i32 lane plus the four products of
/// its unsigned bytes of the second operand with the signed bytes of the third
/// (AVX512-VNNI on 512-bit vectors; on 256-bit ones, AVX-VNNI's VEX form where
/// the target has no AVX-512).
pub(crate) fn vpdpbusd(
    ctx: &'static Context,
    module: &Module<'static>,
    w: usize,
) -> inkwell::values::FunctionValue<'static> {
    let name = format!("llvm.x86.avx512.vpdpbusd.{}", w * 32);
    module.get_function(&name).unwrap_or_else(|| {
        let it = ctx.i32_type().vec_type(w as u32);
        module.add_function(&name, it.fn_type(&[it.into(), it.into(), it.into()], false), None)
    })
}

/// `llvm.x86.avx512bf16.dpbf16ps.{32·w}`: each f32 lane plus the two products
/// of its bf16 pairs of the second and third operands (AVX-512 BF16).
pub(crate) fn dpbf16ps(
    ctx: &'static Context,
    module: &Module<'static>,
    w: usize,
) -> inkwell::values::FunctionValue<'static> {
    let name = format!("llvm.x86.avx512bf16.dpbf16ps.{}", w * 32);
    module.get_function(&name).unwrap_or_else(|| {
        let (vt, bt) = (ctx.f32_type().vec_type(w as u32), ctx.bf16_type().vec_type(2 * w as u32));
        module.add_function(&name, vt.fn_type(&[vt.into(), bt.into(), bt.into()], false), None)
    })
}

/// `acc + x` on i32 lanes as one `vpaddd` that LLVM leaves where it is. As a
/// plain `add` in an unrolled K loop, reassociation sums two steps' products
/// before adding them to the accumulator, which keeps more vectors live than
/// the register file holds: the tile spills.
pub(crate) fn add_in_order(
    ctx: &'static Context,
    bld: &inkwell::builder::Builder<'static>,
    acc: VectorValue<'static>,
    x: VectorValue<'static>,
) -> Result<BasicValueEnum<'static>, CodegenError> {
    let it = acc.get_type();
    let fty = it.fn_type(&[it.into(), it.into()], false);
    // `v` reaches the 32 registers of AVX-512, `x` the 16 of AVX2.
    let regs = if it.get_size() * 32 > 256 { "=v,v,v" } else { "=x,x,x" };
    let asm = ctx.create_inline_asm(fty, "vpaddd $2, $1, $0".into(), regs.into(), false, false, None, false);
    let sum = bld.build_indirect_call(fty, asm, &[acc.into(), x.into()], "acc").map_err(llvm)?;
    match sum.try_as_basic_value() {
        inkwell::values::ValueKind::Basic(v) => Ok(v),
        inkwell::values::ValueKind::Instruction(_) => Err(llvm("vpaddd returned nothing")),
    }
}

/// A call asking the line at `at` into L2 (read access, locality 2, data cache).
pub(crate) fn prefetch_to_l2(
    ctx: &'static Context,
    module: &Module<'static>,
    bld: &inkwell::builder::Builder<'static>,
    at: BasicValueEnum<'static>,
) -> Result<(), CodegenError> {
    let i32t = ctx.i32_type();
    let args = [
        at.into(),
        i32t.const_zero().into(),
        i32t.const_int(2, false).into(),
        i32t.const_int(1, false).into(),
    ];
    bld.build_call(prefetch_intrinsic(ctx, module), &args, "").map_err(llvm)?;
    Ok(())
}

/// `llvm.prefetch.p0(ptr, rw, locality, cache type)`.
fn prefetch_intrinsic(
    ctx: &'static Context,
    module: &Module<'static>,
) -> inkwell::values::FunctionValue<'static> {
    module.get_function("llvm.prefetch.p0").unwrap_or_else(|| {
        let (ptr, i32t) = (ctx.ptr_type(AddressSpace::default()), ctx.i32_type());
        let ft = ctx.void_type().fn_type(&[ptr.into(), i32t.into(), i32t.into(), i32t.into()], false);
        module.add_function("llvm.prefetch.p0", ft, None)
    })
}

/// The end of a tile's optional add of C: block `add` (the sums with C added,
/// `summed`) and block `set` (the sums alone) both go to `merge`, where one phi per
/// vector picks the tile's values.
pub(crate) fn join_tile(
    bld: &inkwell::builder::Builder<'static>,
    vt: inkwell::types::VectorType<'static>,
    (add, summed): (inkwell::basic_block::BasicBlock<'static>, &[VectorValue<'static>]),
    (set, sums): (inkwell::basic_block::BasicBlock<'static>, &[VectorValue<'static>]),
    merge: inkwell::basic_block::BasicBlock<'static>,
) -> Result<Vec<VectorValue<'static>>, CodegenError> {
    bld.build_unconditional_branch(merge).map_err(llvm)?;
    bld.position_at_end(set);
    bld.build_unconditional_branch(merge).map_err(llvm)?;
    bld.position_at_end(merge);
    let mut vals = Vec::with_capacity(summed.len());
    for (s, t) in summed.iter().zip(sums) {
        let phi = bld.build_phi(vt, "val").map_err(llvm)?;
        phi.add_incoming(&[(s, add), (t, set)]);
        vals.push(phi.as_basic_value().into_vector_value());
    }
    Ok(vals)
}

pub(crate) fn set_align(v: &BasicValueEnum, align: u32) {
    if let Some(i) = v.as_instruction_value() {
        let _ = i.set_alignment(align);
    }
}

/// One register tile's measured L0 throughput.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TileMeasurement {
    pub mr: usize,
    pub nr: usize,
    /// Single-thread GFLOP/s of the micro-kernel on L1-resident panels.
    pub gflops: f64,
    /// An AMX u8s8 tile's single-thread GFLOP/s storing 8-bit codes, swept over
    /// a C as the driver sweeps one, at [`CODES_DEPTH`] ([`time_codes_sweep`]); 0
    /// where not measured. A family storing codes ranks and prices its tiles by
    /// it (`family::rates_for`).
    #[serde(default)]
    pub codes_gflops: f64,
}

/// Vortex's measured lowest level: compile every register tile that fits the
/// register file (rows ≥ `min_mr`), time each on packed panels that stay in L1,
/// and return the fastest with all the measurements. Tiles within 3% of the
/// fastest count as tied (that is the noise of the measurement), and the tie goes
/// to the smallest tile: it pads less at the edges of every shape (DietCode's
/// f_pad) and splits small M into more bands.
pub fn select_microkernel(
    t: &Target,
    min_mr: usize,
) -> Result<(JitMicroKernel, Vec<TileMeasurement>), CodegenError> {
    let mut all = Vec::new();
    for (mr, nr) in register_tiles(t).into_iter().filter(|(mr, _)| *mr >= min_mr) {
        let jit = compile_microkernel(t, mr, nr)?;
        let gflops = time_microkernel(&jit.kernel(), t);
        all.push(TileMeasurement { mr, nr, gflops, codes_gflops: 0.0 });
    }
    let (mr, nr) = pick_tile(&all, min_mr)?;
    Ok((compile_microkernel(t, mr, nr)?, all))
}

/// The tile to use from measurements: the fastest, ties within 3% going to the
/// smallest tile (see [`select_microkernel`]).
pub fn pick_tile(all: &[TileMeasurement], min_mr: usize) -> Result<(usize, usize), CodegenError> {
    let ok = || all.iter().filter(|m| m.mr >= min_mr);
    let top = ok().map(|m| m.gflops).fold(0.0, f64::max);
    ok().filter(|m| m.gflops >= 0.97 * top)
        .min_by_key(|m| (m.mr * m.nr, m.mr))
        .map(|m| (m.mr, m.nr))
        .ok_or_else(|| CodegenError::Unsupported("no register tile fits this target".into()))
}

/// GFLOP/s of `call(n)`, which runs a kernel `n` times at `flops` per run: 64 runs
/// to warm up, then 2000 timed.
pub(crate) fn gflops_of_calls(flops: usize, mut call: impl FnMut(usize)) -> f64 {
    call(64);
    let reps = 2000;
    let start = std::time::Instant::now();
    call(reps);
    let secs = start.elapsed().as_secs_f64();
    (flops * reps) as f64 / secs.max(1e-12) / 1e9
}

/// The depth [`time_codes_sweep`] measures a tile storing codes at for the
/// tuning record: a bottleneck block's 1×1 products are 64-1024 deep, and
/// deeper the wide tiles' rates storing codes come close (BENCHMARKS.md,
/// session 58).
pub const CODES_DEPTH: usize = 256;

/// GFLOP/s of `uk`, a kernel whose epilogue stores 8-bit codes with a scale per
/// column, at depth `k`, swept as the driver runs a block of a product's rows:
/// per column panel one call over all the row tiles. The rows are as many as
/// make A 1 MiB (a block of rows the driver keeps in L2 across the panels), the
/// columns as many as make C 4 MiB (larger than L2, as a block of a 1×1
/// convolution's codes is: 16,384 rows by 256 columns at 8×224). Each row of a
/// tile stores `NR` bytes: half a cache line for a 32-wide tile, whose other
/// half the next panel writes after the line has left L2; a 64-wide tile
/// writes whole lines. Neither that nor the vector units' epilogue working
/// beside the next tile's products shows in [`time_microkernel`] (one tile a
/// call, its C of floats in L1). The best of a few sweeps; 0 for a kernel that
/// does not store codes or a tile that does not divide the sweep.
pub fn time_codes_sweep(uk: &MicroKernel, k: usize) -> f64 {
    let m = ((1 << 20) / k.max(1)).clamp(64, 16384) / 32 * 32;
    let n = ((4 << 20) / m).clamp(256, 4096) / 64 * 64;
    let (mr, nr) = (uk.mr, uk.nr);
    if !m.is_multiple_of(mr) || !n.is_multiple_of(nr) || !uk.epilogue.codes || uk.elem != ElemType::U8S8 {
        return 0.0;
    }
    let kw = k.div_ceil(4);
    let words = |len: usize| {
        let mut l = kernels::Lines::<u32>::with_len(len);
        // Codes of 1 in every byte: sums far from i32's bounds.
        l.fill(0x0101_0101);
        l
    };
    // A's panels of every row tile one after another, B's of every column panel.
    let (a, b) = (words(m * kw), words(n * kw));
    let mut c = kernels::Lines::<u8>::with_len(m * n);
    let scales = vec![1.0f32 / 64.0; n];
    let mut sweep = || {
        for j in 0..n / nr {
            // SAFETY: A holds `m / mr` row tiles of `kw` words (`k` codes and
            // up to 3 more) a row, B's panel `j` `kw` words of `nr` columns, C
            // `m` rows of `n` codes (row stride `n`) of which the panel writes
            // columns `j·nr..(j+1)·nr`, and `scales` a float per column from
            // the panel's first: what the ABI lets the kernel touch for
            // `m / mr` tiles with no bias or residual.
            unsafe {
                (uk.func)(
                    k as i64,
                    a.as_ptr(),
                    b.as_ptr().add(j * nr * kw),
                    c.as_mut_ptr().add(j * nr).cast(),
                    n as i64,
                    kernels::APPLY_EPILOGUE,
                    std::ptr::null(),
                    std::ptr::null(),
                    0,
                    (m / mr) as i64,
                    std::ptr::null(),
                    scales.as_ptr().add(j * nr),
                    std::ptr::null(),
                )
            };
        }
    };
    sweep();
    let mut best = f64::MAX;
    for _ in 0..8 {
        let start = std::time::Instant::now();
        sweep();
        best = best.min(start.elapsed().as_secs_f64());
    }
    2.0 * (m * n * k) as f64 / best.max(1e-12) / 1e9
}

/// GFLOP/s of one micro-kernel called repeatedly on the same packed panels,
/// sized to a quarter of L1 so that only the register level is measured.
pub fn time_microkernel(uk: &MicroKernel, t: &Target) -> f64 {
    let kw = (t.l1d / 4 / ((uk.mr + uk.nr) * 4)).clamp(16, 512);
    // AMX kernels in whole steps of 16 words (their remainder is the vector loop's).
    let kw = if uk.amx { kw / kernels::AMX_ROWS * kernels::AMX_ROWS } else { kw };
    let kc = kw * uk.elem.k_group();
    // Words of ordinary values in any element type (0.5 and 0.25 in f32; in bf16,
    // the same values and a zero): no overflow, no special values.
    // Panels start a cache line, as the driver's do (`Lines`): from a `Vec`'s
    // 16-byte alignment every row of an AMX tile load spans two lines, and its
    // rate depended on where the allocator put the panels (0.6x to 1x).
    let filled = |len: usize, v: f32| {
        let mut l = kernels::Lines::with_len(len);
        l.fill(v.to_bits());
        l
    };
    let (a, b) = (filled(kw * uk.mr, 0.5), filled(kw * uk.nr, 0.25));
    let mut c = kernels::Lines::<f32>::with_len(uk.mr * uk.nr);
    let call = |n: usize| {
        for _ in 0..n {
            // SAFETY: the panels hold `kc·MR` and `kc·NR` floats and `c` a full MR × NR tile
            // with row stride NR: exactly what the ABI lets the kernel touch.
            unsafe {
                (uk.func)(
                    kc as i64,
                    a.as_ptr(),
                    b.as_ptr(),
                    c.as_mut_ptr(),
                    uk.nr as i64,
                    1,
                    std::ptr::null(),
                    std::ptr::null(),
                    0,
                    1,
                    std::ptr::null(),
                    std::ptr::null(),
                    std::ptr::null(),
                )
            };
        }
    };
    gflops_of_calls(2 * uk.mr * uk.nr * kc, call)
}
