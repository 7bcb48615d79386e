//! A GPU emulated on the host: the GPU kernels' LLVM IR run on this machine, so
//! that CI (which has no GPU) runs them against the oracle. A module is
//! rewritten for this machine: the address spaces dropped; a thread's and block's indices (`tid.x`, `ctaid.x/y/z`) passed as four
//! more arguments; the grid's size, the block's shared memory, barriers, `cp.async`
//! copies, warp shuffles, `ldmatrix`, `mma.sync`, and the inline PTX the wgmma and
//! TMA kernels issue (`wgmma.mma_async`, tensor copies, mbarriers, named barriers)
//! made calls of this harness. A kernel that uses none of the warp-wide operations
//! (the SIMT GEMMs, the split-K reduction) runs its threads one after another; one
//! that does ([`run_blocks`]) runs a block's threads as coroutines of the calling
//! host thread (`corosensei`: a wait is a switch of stacks, where threads of the
//! host paid the system's scheduler at every warp-wide operation; each round of
//! the block's threads in another order, so that what a kernel leaves unordered
//! runs more than one way), which
//! meet at each barrier (the block's) and each warp-wide operation (the warp's): a
//! shuffle, `ldmatrix` and `mma` exchange their lanes' operands there and compute
//! what each lane gets as the PTX ISA lays the fragments out; `wgmma` reads its
//! operands from shared memory through its descriptors. Copies and products complete
//! when issued, a warpgroup's for all its lanes once they meet at a group's wait.
//! `tanh.approx`, `ex2.approx` and `lg2.approx` (the epilogues'
//! transcendental functions) are computed exactly; f16 is converted by F16C instructions (a kernel function's target
//! feature), where x86 would otherwise call a library the JIT cannot resolve.

use corosensei::stack::DefaultStack;
use corosensei::{Coroutine, CoroutineResult, Yielder};
use gpu::reference;
use gpu::ElemType;
use inkwell::context::Context;
use inkwell::execution_engine::ExecutionEngine;
use inkwell::memory_buffer::MemoryBuffer;
use inkwell::targets::{InitializationConfig, Target};
use inkwell::OptimizationLevel;
use std::cell::{Cell, RefCell};
use std::sync::{Arc, Mutex};

/// The indices every kernel gets as arguments on the host.
const SREGS: [&str; 4] = ["tid.x", "ctaid.x", "ctaid.y", "ctaid.z"];

/// A GEMM kernel's entry on the host: `gpu::kernel::ABI`, then `tid.x`, `ctaid.x`,
/// `ctaid.y`, `ctaid.z`.
pub type Gemm = unsafe extern "C" fn(
    *const u16,
    *const u16,
    *mut u16,
    *const u16,
    *const u16,
    i32,
    i32,
    i32,
    i32,
    i32,
    i32,
    i64,
    i64,
    i64,
    i32,
    i32,
    i32,
    i32,
);

/// A TMA kernel's entry on the host: the ABI, the batch (a persistent kernel's
/// argument; the others get an unused one on the host, so that both share this
/// entry), A's and B's maps, the four indices.
pub type TmaGemm = unsafe extern "C" fn(
    *const u16,
    *const u16,
    *mut u16,
    *const u16,
    *const u16,
    i32,
    i32,
    i32,
    i32,
    i32,
    i32,
    i64,
    i64,
    i64,
    i32,
    *const HostTensorMap,
    *const HostTensorMap,
    i32,
    i32,
    i32,
    i32,
);

/// `(%lhs, x)` of a line `%lhs = fptrunc float x to bfloat`.
fn fptrunc_to_bf16(line: &str) -> Option<(&str, &str)> {
    let (lhs, rhs) = line.trim().split_once(" = fptrunc float ")?;
    Some((lhs, rhs.strip_suffix(" to bfloat")?))
}

/// The arguments of a call line: what lies between its last `(` and `)`.
fn call_args(line: &str) -> Vec<&str> {
    let open = line.rfind('(').unwrap_or(0);
    let close = line.rfind(')').unwrap_or(line.len());
    line[open + 1..close].split(", ").collect()
}

/// `lhs = {ty x n}` rebuilt from `n` values the harness wrote at `%host.scratch`.
fn from_scratch(lhs: &str, ty: &str, n: usize) -> String {
    let mut s = String::new();
    let agg = format!("{{{}}}", vec![ty; n].join(", "));
    let mut last = "poison".to_string();
    for i in 0..n {
        s.push_str(&format!("  {lhs}.p{i} = getelementptr {ty}, ptr %host.scratch, i64 {i}\n"));
        s.push_str(&format!("  {lhs}.x{i} = load {ty}, ptr {lhs}.p{i}\n"));
        let next = if i + 1 == n { lhs.to_string() } else { format!("{lhs}.s{i}") };
        s.push_str(&format!("  {next} = insertvalue {agg} {last}, {ty} {lhs}.x{i}, {i}\n"));
        last = next;
    }
    s
}

/// One line of a kernel's IR made for the host.
fn line_for_host(line: &str) -> String {
    // LLVM's printer spaces an aggregate's braces (a module it linked, the fused
    // attention's); the patterns below are written without.
    let line = line.replace("{ i32, i32, i32, i32 }", "{i32, i32, i32, i32}");
    let line = line.replace("{ float, float, float, float }", "{float, float, float, float}");
    let mut line =
        line.replace(" addrspace(1)", "").replace(" addrspace(3)", "").replace("@smem", "%host.smem");
    for r in SREGS {
        line = line
            .replace(&format!("call i32 @llvm.nvvm.read.ptx.sreg.{r}()"), &format!("add i32 %host.{r}, 0"));
    }
    for (r, f) in [("nctaid.x", "nctaid_x"), ("nctaid.y", "nctaid_y")] {
        line = line.replace(
            &format!("call i32 @llvm.nvvm.read.ptx.sreg.{r}()"),
            &format!("call i32 @anyshape_host_{f}()"),
        );
    }
    line = line
        .replace("call float asm \"tanh.approx.f32 $0, $1;\", \"=f,f\"(", "call float @anyshape_host_tanh(")
        .replace("call float asm \"ex2.approx.f32 $0, $1;\", \"=f,f\"(", "call float @anyshape_host_ex2(")
        .replace("call float asm \"lg2.approx.f32 $0, $1;\", \"=f,f\"(", "call float @anyshape_host_lg2(")
        .replace(
            "call float @llvm.nvvm.shfl.sync.bfly.f32(i32 -1, float ",
            "call float @anyshape_host_shfl(float ",
        )
        .replace(
            "call i32 @llvm.nvvm.shfl.sync.bfly.i32(i32 -1, i32 ",
            "call i32 @anyshape_host_shfl_i32(i32 ",
        )
        .replace("call void @llvm.nvvm.barrier0()", "call void @anyshape_host_bar()")
        .replace("call void @llvm.nvvm.membar.gl()", "fence seq_cst")
        .replace("call void @llvm.nvvm.cp.async.cg.shared.global.16.s(", "call void @anyshape_host_cpasync(");
    if line.contains("@anyshape_host_shfl(") || line.contains("@anyshape_host_shfl_i32(") {
        line = line.replace(", i32 31)", ")");
    }
    // Copies complete as they are issued: their groups need no waiting.
    if line.contains("@llvm.nvvm.cp.async.commit.group") || line.contains("@llvm.nvvm.cp.async.wait.group") {
        return String::new();
    }
    let t = line.trim();
    if let Some(host) = tma_for_host(t) {
        return host;
    }
    if t.starts_with("call void asm sideeffect \"fence.proxy.async.shared::cta;\"") {
        return String::new();
    }
    if t.contains("asm sideeffect") && t.contains("wgmma.mma_async.sync.aligned.m64n") {
        return wgmma_for_host(t);
    }
    // A group's wait alone passes the accumulators through (a lane's are complete
    // on the host when issued) once every lane of the warpgroup has computed its
    // own: on the GPU the group is the warpgroup's, so that past its wait no
    // product reads the stage that a release then hands back.
    if let Some((lhs, rest)) = t.split_once(" = call ") {
        if rest.contains("asm sideeffect \"wgmma.wait_group.sync.aligned") {
            let args = call_args(rest);
            let agg = format!("{{{}}}", vec!["float"; args.len()].join(", "));
            let mut s = String::from("  call void @anyshape_host_wgmma_wait()\n");
            let mut last = "poison".to_string();
            for (i, a) in args.iter().enumerate() {
                let next = if i + 1 == args.len() { lhs.to_string() } else { format!("{lhs}.w{i}") };
                s.push_str(&format!("  {next} = insertvalue {agg} {last}, {a}, {i}\n"));
                last = next;
            }
            return s;
        }
    }
    if let Some((lhs, rest)) =
        t.split_once(" = call {i32, i32, i32, i32} @llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.")
    {
        let trans = i32::from(rest.starts_with("trans."));
        let p = call_args(rest)[0];
        return format!(
            "  call void @anyshape_host_ldmatrix({p}, ptr %host.scratch, i32 {trans})\n{}",
            from_scratch(lhs, "i32", 4)
        );
    }
    if let Some((lhs, rest)) =
        t.split_once(" = call {float, float, float, float} @llvm.nvvm.mma.m16n8k16.row.col.")
    {
        let kind = if rest.starts_with("bf16") { 0 } else { 1 };
        let mut pre = String::new();
        let mut args = Vec::new();
        for (i, a) in call_args(rest).into_iter().enumerate() {
            match a.strip_prefix("<2 x half> ") {
                Some(v) => {
                    pre.push_str(&format!("  {lhs}.h{i} = bitcast <2 x half> {v} to i32\n"));
                    args.push(format!("i32 {lhs}.h{i}"));
                }
                None => args.push(a.to_string()),
            }
        }
        return format!(
            "{pre}  call void @anyshape_host_mma(ptr %host.scratch, i32 {kind}, {})\n{}",
            args.join(", "),
            from_scratch(lhs, "float", 4)
        );
    }
    // A pair of bf16 values stored at once: x86 widens a `<2 x bfloat>` to f32 and
    // rounds it back through a runtime call the JIT cannot resolve; the pair is
    // built from the rounded 16-bit values (`%x.t` below) instead.
    if line.contains("<2 x bfloat>") {
        line = line.replace("<2 x bfloat>", "<2 x i16>");
        if let Some(at) = line.find(", bfloat %") {
            let rest = &line[at + ", bfloat ".len()..];
            let end = rest.find(',').unwrap_or(rest.len());
            let v = rest[..end].to_string();
            line = line.replacen(&format!(", bfloat {v}"), &format!(", i16 {v}.t"), 1);
        }
    }
    // Likewise a bf16 value stored in another block than the one that rounded it.
    if let Some(rest) = line.trim().strip_prefix("store bfloat %") {
        if let Some((v, ptr)) = rest.split_once(", ") {
            line = format!("  store i16 %{v}.t, {ptr}");
        }
    }
    if let Some((lhs, x)) = fptrunc_to_bf16(&line) {
        // x86 rounds to bf16 through a runtime library call the JIT cannot resolve:
        // the same rounding (to nearest even) spelled out.
        let t = lhs.trim_start_matches('%');
        return format!(
            "  %{t}.b = bitcast float {x} to i32\n  %{t}.odd = lshr i32 %{t}.b, 16\n  \
             %{t}.lsb = and i32 %{t}.odd, 1\n  %{t}.r = add i32 %{t}.b, 32767\n  \
             %{t}.r2 = add i32 %{t}.r, %{t}.lsb\n  %{t}.h = lshr i32 %{t}.r2, 16\n  \
             %{t}.t = trunc i32 %{t}.h to i16\n  {lhs} = bitcast i16 %{t}.t to bfloat"
        );
    }
    line
}

/// A shared address (32 bits) made a host pointer: its offset into the block's
/// shared memory (which is aligned to [`SMEM_ALIGN`]) past `%host.smem`.
fn shared_ptr(lhs: &str, x: &str) -> String {
    format!(
        "  {lhs}.o = and i32 {x}, {}\n  {lhs} = getelementptr i8, ptr %host.smem, i32 {lhs}.o\n",
        SMEM_ALIGN - 1
    )
}

/// The TMA kernels' inline PTX made calls of the harness: the mbarriers (init,
/// arrive with a byte count, arrive, wait for a phase), the tensor copies, named
/// barriers; what has no effect on the host (register reallocation, prefetches,
/// fences) dropped; a shared address turned into a pointer.
fn tma_for_host(t: &str) -> Option<String> {
    if let Some((lhs, rest)) = t.split_once(" = inttoptr i32 ") {
        let x = rest.strip_suffix(" to ptr addrspace(3)").or_else(|| rest.strip_suffix(" to ptr"))?;
        return Some(shared_ptr(lhs, x));
    }
    let asm = t.strip_prefix("call void asm sideeffect \"")?;
    let args = || call_args(t).join(", ");
    let call = |f: &str, a: String| Some(format!("  call void @anyshape_host_{f}({a})\n"));
    if asm.starts_with("setmaxnreg.")
        || asm.starts_with("prefetch.tensormap")
        || asm.starts_with("fence.mbarrier_init")
    {
        return Some(String::new());
    }
    if asm.starts_with("mbarrier.init.shared::cta.b64") {
        return call("mbar_init", args());
    }
    if asm.starts_with("mbarrier.arrive.expect_tx.shared::cta.b64") {
        return call("mbar_expect", args());
    }
    if asm.starts_with("{\\0A.reg .pred p;\\0Asetp.ne.b32 p, $0, 0;\\0A@p mbarrier.arrive.shared::cta.b64") {
        return call("mbar_arrive_if", args());
    }
    if asm.starts_with("{\\0A.reg .pred done;\\0Await${:uid}:\\0Ambarrier.try_wait.parity") {
        return call("mbar_wait", args());
    }
    if asm.starts_with("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes") {
        return call("tma", args());
    }
    if let Some(rest) = asm.strip_prefix("bar.sync ") {
        let (id, count) = rest.split_once(", ")?;
        let count = count.split(';').next()?;
        let id = if id == "$0" { call_args(t)[0].to_string() } else { format!("i32 {id}") };
        return call("named_bar", format!("{id}, i32 {count}"));
    }
    None
}

/// A step's `wgmma` products in one asm statement (`codegen::nvptx`'s
/// `wgmma_products`: `%r = call {float × n} asm "… wgmma.mma_async … m64n{bn}k16 …",
/// …"(i64 descriptors…, i32 scale, float accumulators…)`) made a call of the harness:
/// the descriptors and accumulators through `%host.wgmma` (descriptors from i64 0,
/// accumulators from float 128), the accumulators read back into `%r`.
fn wgmma_for_host(t: &str) -> String {
    let (lhs, rest) = t.split_once(" = call ").expect("a wgmma statement's result");
    let nacc = rest[..rest.find('}').unwrap_or(0)].matches("float").count();
    let shape = &rest[rest.find("m64n").unwrap_or(0) + 4..];
    let bn: usize = shape[..shape.find('k').unwrap_or(0)].parse().unwrap_or(0);
    // A in registers (`{d…}, {a0, a1, a2, a3}, b-desc`): four words and B's
    // descriptor a step; else A's and B's descriptors.
    let a_regs = rest.contains("}, {$");
    let kind = i32::from(!rest.contains(".f32.bf16.bf16"))
        | if a_regs { WGMMA_A_REGS } else { 0 }
        | if rest.contains(", p, 1, 1, 0, 1;") { WGMMA_B_TRANS } else { 0 };
    let steps = rest.matches("wgmma.mma_async").count();
    let operands = if a_regs { 5 * steps } else { 2 * steps };
    let args = call_args(rest);
    let mut s = String::new();
    for (j, a) in args.iter().take(operands).enumerate() {
        s.push_str(&format!(
            "  {lhs}.d{j} = getelementptr i64, ptr %host.wgmma, i64 {j}\n  store {a}, ptr {lhs}.d{j}\n"
        ));
    }
    let scale = args[operands];
    for (i, a) in args.iter().skip(operands + 1).enumerate() {
        s.push_str(&format!(
            "  {lhs}.a{i} = getelementptr float, ptr %host.wgmma, i64 {}\n  store {a}, ptr {lhs}.a{i}\n",
            128 + i
        ));
    }
    s.push_str(&format!(
        "  call void @anyshape_host_wgmma(ptr %host.wgmma, i32 {kind}, i32 {bn}, i32 {steps}, {scale})\n"
    ));
    let agg = format!("{{{}}}", vec!["float"; nacc].join(", "));
    let mut last = "poison".to_string();
    for i in 0..nacc {
        s.push_str(&format!("  {lhs}.r{i} = load float, ptr {lhs}.a{i}\n"));
        let next = if i + 1 == nacc { lhs.to_string() } else { format!("{lhs}.s{i}") };
        s.push_str(&format!("  {next} = insertvalue {agg} {last}, float {lhs}.r{i}, {i}\n"));
        last = next;
    }
    s
}

/// The harness's functions, declared in every module made for the host.
const HOST_DECLS: &str = "declare void @anyshape_host_bar()
declare void @anyshape_host_cpasync(ptr, ptr, i32)
declare void @anyshape_host_ldmatrix(ptr, ptr, i32)
declare void @anyshape_host_mma(ptr, i32, i32, i32, i32, i32, i32, i32, float, float, float, float)
declare void @anyshape_host_wgmma(ptr, i32, i32, i32, i32)
declare void @anyshape_host_wgmma_wait()
declare void @anyshape_host_mbar_init(i32, i32)
declare void @anyshape_host_mbar_expect(i32, i32)
declare void @anyshape_host_mbar_arrive_if(i32, i32)
declare void @anyshape_host_mbar_wait(i32, i32)
declare void @anyshape_host_tma(i32, ptr, i32, i32, i32, i32)
declare void @anyshape_host_named_bar(i32, i32)
declare float @anyshape_host_tanh(float)
declare float @anyshape_host_ex2(float)
declare float @anyshape_host_lg2(float)
declare float @anyshape_host_shfl(float, i32)
declare i32 @anyshape_host_shfl_i32(i32, i32)
declare ptr @anyshape_host_smem()
declare i32 @anyshape_host_nctaid_x()
declare i32 @anyshape_host_nctaid_y()
";

/// The attribute group of a kernel made for the host (a number no module
/// printed by LLVM uses for its own groups).
const HOST_ATTRS: u32 = 4242;

/// Kernel `name`'s module `ir` made for the host (see the module's text).
pub fn for_host(ir: &str, name: &str) -> String {
    let extra: Vec<String> = SREGS.iter().map(|r| format!("i32 %host.{r}")).collect();
    let mut out = String::new();
    let mut params: Vec<String> = Vec::new();
    for line in ir.lines() {
        if line.starts_with("target ") || line.starts_with("@smem = ") {
            continue;
        }
        if line.starts_with(&format!("define void @{name}(")) {
            let mut line =
                line.replace(" addrspace(1)", "").replace("ptr byval([16 x i64]) align 64 ", "ptr ");
            if line.contains(", ptr %tmA") && !line.contains("i32 %batch") {
                line = line.replace(", ptr %tmA", ", i32 %host.batch, ptr %tmA");
            }
            let open = line.find('(').map_or(0, |i| i + 1);
            let close = line.rfind(')').unwrap_or(line.len());
            params = line[open..close].split(", ").filter(|p| !p.is_empty()).map(str::to_string).collect();
            // f16 converted by F16C instructions, not by library calls the JIT cannot
            // resolve (the tests that run f16 kernels ask the CPU for F16C first).
            out.push_str(&line.replace(") {", &format!(", {}) #{HOST_ATTRS} {{", extra.join(", "))));
            out.push('\n');
            continue;
        }
        if line == "entry:" {
            out.push_str("entry:\n  %host.scratch = alloca [8 x i32], align 16\n");
            if ir.contains("@smem") {
                out.push_str("  %host.smem = call ptr @anyshape_host_smem()\n");
            }
            if ir.contains("wgmma.mma_async") {
                out.push_str("  %host.wgmma = alloca [192 x i64], align 16\n");
            }
            continue;
        }
        let line = line_for_host(line);
        if !line.is_empty() {
            out.push_str(&line);
            out.push('\n');
        }
    }
    out.push_str(&args_entry(name, &params));
    out.push_str(HOST_DECLS);
    out.push_str(&format!("attributes #{HOST_ATTRS} = {{ \"target-features\"=\"+f16c\" }}\n"));
    out
}

/// `<name>.args`: kernel `name` (its host parameters `params`, the four
/// indices not among them) called with its arguments read from an array of
/// 64-bit words ([`ArgsKernel`]): a pointer's address, an integer's value
/// (an i32 its word's low half).
fn args_entry(name: &str, params: &[String]) -> String {
    let mut body = String::new();
    let mut args = Vec::new();
    for (i, p) in params.iter().enumerate() {
        let ty = p.split_whitespace().next().unwrap_or("ptr");
        body.push_str(&format!("  %w{i} = getelementptr i64, ptr %host.words, i64 {i}\n"));
        match ty {
            "ptr" => body.push_str(&format!("  %a{i} = load ptr, ptr %w{i}, align 8\n")),
            "i64" => body.push_str(&format!("  %a{i} = load i64, ptr %w{i}, align 8\n")),
            _ => {
                body.push_str(&format!("  %v{i} = load i64, ptr %w{i}, align 8\n"));
                body.push_str(&format!("  %a{i} = trunc i64 %v{i} to {ty}\n"));
            }
        }
        args.push(format!("{ty} %a{i}"));
    }
    let idx: Vec<String> = SREGS.iter().map(|r| format!("i32 %host.{r}")).collect();
    let call: Vec<String> = args.into_iter().chain(idx.iter().cloned()).collect();
    format!(
        "define void @\"{name}.args\"(ptr %host.words, {}) {{\nentry:\n{body}  call void @{name}({})\n  ret void\n}}\n",
        idx.join(", "),
        call.join(", "),
    )
}

/// Kernel `name` of `ir`, made for the host and compiled; the harness's functions
/// bound to its declarations.
pub fn engine<'c>(ctx: &'c Context, ir: &str, name: &str) -> Result<ExecutionEngine<'c>, String> {
    let ir = for_host(ir, name);
    Target::initialize_native(&InitializationConfig::default()).map_err(|e| e.to_string())?;
    let module = ctx
        .create_module_from_ir(MemoryBuffer::create_from_memory_range_copy(ir.as_bytes(), name))
        .map_err(|e| format!("{e}\n{ir}"))?;
    module.verify().map_err(|e| format!("{e}\n{ir}"))?;
    let ee = module.create_jit_execution_engine(OptimizationLevel::Default).map_err(|e| e.to_string())?;
    let fns: [(&str, usize); 20] = [
        ("anyshape_host_shfl_i32", host_shfl_i32 as *const () as usize),
        ("anyshape_host_tanh", host_tanh as *const () as usize),
        ("anyshape_host_ex2", host_ex2 as *const () as usize),
        ("anyshape_host_lg2", host_lg2 as *const () as usize),
        ("anyshape_host_mbar_init", host_mbar_init as *const () as usize),
        ("anyshape_host_mbar_expect", host_mbar_expect as *const () as usize),
        ("anyshape_host_mbar_arrive_if", host_mbar_arrive_if as *const () as usize),
        ("anyshape_host_mbar_wait", host_mbar_wait as *const () as usize),
        ("anyshape_host_tma", host_tma as *const () as usize),
        ("anyshape_host_named_bar", host_named_bar as *const () as usize),
        ("anyshape_host_wgmma", host_wgmma as *const () as usize),
        ("anyshape_host_wgmma_wait", host_wgmma_wait as *const () as usize),
        ("anyshape_host_bar", host_bar as *const () as usize),
        ("anyshape_host_cpasync", host_cpasync as *const () as usize),
        ("anyshape_host_ldmatrix", host_ldmatrix as *const () as usize),
        ("anyshape_host_mma", host_mma as *const () as usize),
        ("anyshape_host_shfl", host_shfl as *const () as usize),
        ("anyshape_host_smem", host_smem as *const () as usize),
        ("anyshape_host_nctaid_x", host_nctaid_x as *const () as usize),
        ("anyshape_host_nctaid_y", host_nctaid_y as *const () as usize),
    ];
    for (f, addr) in fns {
        let value = module.get_function(f).ok_or_else(|| format!("{f} is not declared"))?;
        ee.add_global_mapping(&value, addr);
    }
    Ok(ee)
}

/// A barrier of a block's threads (all of them, a warp, a warpgroup, a named
/// barrier's count): each arrival counts; the last starts the next generation,
/// and the others wait (their coroutines suspended) until it has begun.
struct Barrier {
    n: usize,
    /// Arrivals of the current generation, and the generation.
    state: Mutex<(usize, u64)>,
}

impl Barrier {
    fn new(n: usize) -> Barrier {
        Barrier { n, state: Mutex::new((0, 0)) }
    }

    fn wait(&self) {
        let generation = {
            let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
            progress();
            s.0 += 1;
            if s.0 == self.n {
                *s = (0, s.1 + 1);
                return;
            }
            s.1
        };
        block_until(|| self.state.lock().unwrap_or_else(|e| e.into_inner()).1 != generation);
    }
}

/// What the threads of a block share: its barrier and shared memory, each warp's
/// meeting point, the grid's size.
struct Block {
    bar: Barrier,
    smem: *mut u8,
    warps: Vec<Warp>,
    /// Each warpgroup's meeting point: `wgmma` is `.sync.aligned`, so none of a
    /// warpgroup's threads is past it before all have reached it (which orders
    /// their earlier mbarrier waits before any of them releases a stage).
    warpgroups: Vec<Barrier>,
    grid: (i32, i32),
    /// The mbarriers by shared offset.
    mbars: Mutex<std::collections::HashMap<u32, MBar>>,
    /// Named barriers (`bar.sync id, count`), made at their first use.
    named: Mutex<std::collections::HashMap<(i32, i32), Arc<Barrier>>>,
}

/// An mbarrier: the arrivals a phase expects and has yet to see, the bytes of
/// copies yet to land, and the phases completed.
struct MBar {
    count: u32,
    pending: u32,
    tx: i64,
    phase: u32,
}

impl MBar {
    /// A phase completes when every arrival and every byte has come.
    fn settle(&mut self) {
        if self.pending == 0 && self.tx == 0 {
            self.phase += 1;
            self.pending = self.count;
        }
    }
}

// SAFETY: `smem` points at the block's shared memory, which outlives the block's
// threads (their coroutines all return in `run_blocks` before it goes); the
// threads run on one host thread, taking turns at their waits.
unsafe impl Send for Block {}
unsafe impl Sync for Block {}

/// Up to 12 values a lane brings to a warp-wide operation.
type Operands = [u64; 12];

/// A warp's meeting point: each lane leaves its operands in a slot and, once all 32
/// have, reads everyone's. Operations alternate between two sets of slots, so that
/// one meeting an operation suffices: a set is written again only two operations
/// later, past a meeting that every lane reaches after reading it.
struct Warp {
    meet: Barrier,
    slots: Mutex<[[Operands; 32]; 2]>,
}

/// A thread of the block: its block, warp, lane, count of warp-wide operations
/// so far, and its coroutine's yielder (set as the coroutine starts).
struct Lane {
    block: Arc<Block>,
    warp: usize,
    lane: usize,
    ops: usize,
    yielder: *const Yielder<(), ()>,
}

thread_local! {
    /// The lane `run_blocks` is running on this host thread (null between them).
    static CURRENT: Cell<*mut Lane> = const { Cell::new(std::ptr::null_mut()) };
    /// Arrivals at barriers and changes of mbarriers so far: a round of every
    /// waiting thread without one is a deadlock.
    static PROGRESS: Cell<u64> = const { Cell::new(0) };
    /// Coroutine stacks kept for the next block and launch.
    static STACKS: RefCell<Vec<DefaultStack>> = const { RefCell::new(Vec::new()) };
}

fn with_lane<T>(f: impl FnOnce(&mut Lane) -> T) -> T {
    let lane = CURRENT.with(Cell::get);
    assert!(!lane.is_null(), "a thread of a block run by run_blocks");
    // SAFETY: `run_blocks` points CURRENT at the lane whose coroutine it is
    // resuming (in its vector of lanes, which outlives the coroutines) and
    // clears it when the coroutine suspends; only that coroutine runs on this
    // thread meanwhile, and `f` does not suspend.
    f(unsafe { &mut *lane })
}

/// Counts a step towards some wait's end (see `PROGRESS`).
fn progress() {
    PROGRESS.with(|p| p.set(p.get() + 1));
}

/// Suspends the calling thread's coroutine until `ready` holds: the other
/// threads of the block take their turns meanwhile.
fn block_until(mut ready: impl FnMut() -> bool) {
    while !ready() {
        let yielder = with_lane(|l| l.yielder);
        // SAFETY: the yielder of the coroutine running now, which it set at its
        // start; a coroutine's yielder lives as long as the coroutine.
        unsafe { (*yielder).suspend(()) };
    }
}

/// The calling lane's operands exchanged with its warp's: every lane's, and its own
/// lane index.
fn exchange(mine: Operands) -> ([Operands; 32], usize) {
    let (block, warp, lane, set) = with_lane(|l| {
        l.ops += 1;
        (l.block.clone(), l.warp, l.lane, l.ops % 2)
    });
    let w = &block.warps[warp];
    w.slots.lock().unwrap()[set][lane] = mine;
    w.meet.wait();
    let all = w.slots.lock().unwrap()[set];
    (all, lane)
}

/// `tanh.approx.f32` (the GELU epilogue's tanh form), exact on the host.
extern "C" fn host_tanh(x: f32) -> f32 {
    x.tanh()
}

/// `ex2.approx.f32` (the GELU epilogue's erf form), exact on the host.
extern "C" fn host_ex2(x: f32) -> f32 {
    x.exp2()
}

/// `lg2.approx.f32` (an element-wise program's `log`), exact on the host.
extern "C" fn host_lg2(x: f32) -> f32 {
    x.log2()
}

extern "C" fn host_bar() {
    let block = with_lane(|l| l.block.clone());
    block.bar.wait();
}

extern "C" fn host_smem() -> *mut u8 {
    with_lane(|l| l.block.smem)
}

extern "C" fn host_nctaid_x() -> i32 {
    with_lane(|l| l.block.grid.0)
}

extern "C" fn host_nctaid_y() -> i32 {
    with_lane(|l| l.block.grid.1)
}

/// `cp.async.cg.shared.global` of 16 bytes: `n` copied, the rest zero-filled.
extern "C" fn host_cpasync(dst: *mut u8, src: *const u8, n: i32) {
    let n = n.clamp(0, 16) as usize;
    // SAFETY: the kernel copies 16 bytes into its shared memory and reads `n` bytes
    // at `src` inside an operand (a copy outside one asks for 0 bytes).
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, n);
        std::ptr::write_bytes(dst.add(n), 0, 16 - n);
    }
}

/// `shfl.sync.bfly` with every lane taking part: lane `l` gets lane `l ^ mask`'s value.
extern "C" fn host_shfl(v: f32, mask: i32) -> f32 {
    let mut mine = [0u64; 12];
    mine[0] = u64::from(v.to_bits());
    let (all, lane) = exchange(mine);
    f32::from_bits(all[lane ^ mask as usize][0] as u32)
}

/// `shfl.sync.bfly.b32` of an integer word, as [`host_shfl`].
extern "C" fn host_shfl_i32(v: i32, mask: i32) -> i32 {
    let mut mine = [0u64; 12];
    mine[0] = u64::from(v as u32);
    let (all, lane) = exchange(mine);
    all[lane ^ mask as usize][0] as u32 as i32
}

/// The 16-bit value `i` (0-7) of the 16-byte row at `at`.
fn row_elem(at: u64, i: usize) -> u32 {
    // SAFETY: `at` is a lane's row address into the block's shared memory (16 bytes).
    u32::from(unsafe { *(at as *const u16).add(i) })
}

/// `ldmatrix.sync.aligned.m8n8.x4(.trans).b16`: lanes `8i..8i+8` give the rows of
/// matrix `i`; lane `l` gets, of each matrix, row `l/4`'s elements `2(l%4)` and
/// `2(l%4)+1` (transposed: column `l/4`'s elements of rows `2(l%4)` and `2(l%4)+1`),
/// the lower index in the lower half.
extern "C" fn host_ldmatrix(p: *const u8, out: *mut i32, trans: i32) {
    let mut mine = [0u64; 12];
    mine[0] = p as u64;
    let (all, l) = exchange(mine);
    for i in 0..4 {
        let (lo, hi) = if trans == 0 {
            let row = all[8 * i + l / 4][0];
            (row_elem(row, 2 * (l % 4)), row_elem(row, 2 * (l % 4) + 1))
        } else {
            (row_elem(all[8 * i + 2 * (l % 4)][0], l / 4), row_elem(all[8 * i + 2 * (l % 4) + 1][0], l / 4))
        };
        // SAFETY: `out` is the kernel's scratch of 8 values.
        unsafe { *out.add(i) = (lo | (hi << 16)) as i32 };
    }
}

/// `mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}`: `D = A·B + C` over the
/// warp, A (16×16) in 4 registers a lane, B (16×8) in 2, C and D (16×8) in 4, laid
/// out as the PTX ISA's fragments for this shape: with `g = lane/4`, `t = lane%4`,
/// A's registers hold rows `g`, `g+8`, `g`, `g+8` at columns `2t..2t+2` (the last two
/// 8 columns on), B's rows `2t..2t+2` and `2t+8..2t+10` of column `g`, C's and D's
/// rows `g`, `g`, `g+8`, `g+8` at columns `2t`, `2t+1`.
#[allow(clippy::too_many_arguments)]
extern "C" fn host_mma(
    out: *mut f32,
    kind: i32,
    a0: i32,
    a1: i32,
    a2: i32,
    a3: i32,
    b0: i32,
    b1: i32,
    c0: f32,
    c1: f32,
    c2: f32,
    c3: f32,
) {
    let mut mine = [0u64; 12];
    for (i, x) in [a0, a1, a2, a3, b0, b1].into_iter().enumerate() {
        mine[i] = u64::from(x as u32);
    }
    let (all, l) = exchange(mine);
    let elem = if kind == 0 { ElemType::Bf16 } else { ElemType::F16 };
    let half = |reg: u64, h: usize| reference::from_bits(elem, (reg >> (16 * h)) as u16);
    let a = |r: usize, c: usize| {
        let lane = (r % 8) * 4 + (c % 8) / 2;
        half(all[lane][r / 8 + 2 * (c / 8)], c % 2)
    };
    let b = |k: usize, n: usize| {
        let lane = n * 4 + (k % 8) / 2;
        half(all[lane][4 + k / 8], k % 2)
    };
    let (g, t) = (l / 4, l % 4);
    let c = [c0, c1, c2, c3];
    for (i, acc) in c.into_iter().enumerate() {
        let (row, col) = (g + 8 * (i / 2), 2 * t + i % 2);
        let mut d = acc;
        for k in 0..16 {
            d += a(row, k) * b(k, col);
        }
        // SAFETY: `out` is the kernel's scratch of 8 values.
        unsafe { *out.add(i) = d };
    }
}

/// The alignment of a block's shared memory on the host.
const SMEM_ALIGN: usize = 1 << 18;

/// The offset of 32-bit shared address `a` into the block's shared memory.
fn shared_off(a: i32) -> u32 {
    a as u32 & (SMEM_ALIGN as u32 - 1)
}

/// Updates mbarrier `a` by `f` and wakes the waiters when a phase completes.
fn with_mbar(a: i32, f: impl FnOnce(&mut MBar)) {
    let block = with_lane(|l| l.block.clone());
    let mut bars = block.mbars.lock().unwrap();
    let bar = bars.get_mut(&shared_off(a)).expect("an initialized mbarrier");
    f(bar);
    bar.settle();
    progress();
}

extern "C" fn host_mbar_init(a: i32, count: i32) {
    let block = with_lane(|l| l.block.clone());
    let count = count as u32;
    block.mbars.lock().unwrap().insert(shared_off(a), MBar { count, pending: count, tx: 0, phase: 0 });
    progress();
}

/// `mbarrier.arrive.expect_tx`: `bytes` more to land, and an arrival.
extern "C" fn host_mbar_expect(a: i32, bytes: i32) {
    with_mbar(a, |b| {
        b.tx += i64::from(bytes);
        b.pending -= 1;
    });
}

/// `@p mbarrier.arrive`: an arrival where `p`.
extern "C" fn host_mbar_arrive_if(p: i32, a: i32) {
    if p != 0 {
        with_mbar(a, |b| b.pending -= 1);
    }
}

/// `mbarrier.try_wait.parity` until it succeeds: until the phase of parity `parity`
/// has completed (the phase in progress has the other parity).
extern "C" fn host_mbar_wait(a: i32, parity: i32) {
    let block = with_lane(|l| l.block.clone());
    block_until(|| {
        block.mbars.lock().unwrap().get(&shared_off(a)).expect("an initialized mbarrier").phase % 2
            != parity as u32
    });
}

/// `bar.sync id, count`: the first `count` threads to arrive at barrier `id`.
extern "C" fn host_named_bar(id: i32, count: i32) {
    let block = with_lane(|l| l.block.clone());
    let bar = block
        .named
        .lock()
        .unwrap()
        .entry((id, count))
        .or_insert_with(|| Arc::new(Barrier::new(count as usize)))
        .clone();
    bar.wait();
}

/// What the harness passes a TMA kernel for a tensor map (the driver's is opaque):
/// a `[batch, rows, cols]` operand of 16-bit elements, its row and batch strides in
/// bytes, and the box a copy moves (`box_rows` × 64 columns, one 128-byte swizzled
/// row each).
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
pub struct HostTensorMap {
    pub base: u64,
    pub dims: [u64; 3],
    pub strides: [u64; 2],
    pub box_rows: u64,
    pub pad: [u64; 9],
}

/// `cp.async.bulk.tensor.3d … [dst], [map, {col, row, batch}], [bar]`: the box at
/// those coordinates (zeros past the operand) into shared memory at `dst`, rows
/// 128 bytes apart with the 128-byte swizzle, then its bytes complete on `bar`.
extern "C" fn host_tma(dst: i32, map: *const HostTensorMap, col: i32, row: i32, batch: i32, bar: i32) {
    let smem = with_lane(|l| l.block.smem);
    // SAFETY: the kernel passes the map the harness gave it.
    let m = unsafe { *map };
    for r in 0..m.box_rows as usize {
        for c in 0..64usize {
            let (gc, gr, gb) = (col as u64 + c as u64, row as u64 + r as u64, batch as u64);
            let x = if gc < m.dims[0] && gr < m.dims[1] && gb < m.dims[2] {
                // SAFETY: inside the operand's extents, which the harness gave.
                unsafe { *((m.base + gb * m.strides[1] + gr * m.strides[0] + 2 * gc) as *const u16) }
            } else {
                0
            };
            let off = shared_off(dst) as usize + 128 * r + 2 * c;
            let off = off ^ (((off >> 7) & 7) << 4);
            // SAFETY: the box lies in the block's shared memory (a stage's tile).
            unsafe { *(smem.add(off) as *mut u16) = x };
        }
    }
    with_mbar(bar, |b| b.tx -= 128 * m.box_rows as i64);
}

/// `wgmma.mma_async.sync.aligned.m64n{bn}k16.f32.{bf16,f16}` × `steps` (a K step's
/// products, issued and waited for at once): the warpgroup's A (64 × 16) and B (`bn`
/// × 16) read from shared memory through the descriptors at `scratch` (A's and B's
/// per step: the start address's bits 4-17, the stride of 8-row groups, the
/// 128-byte swizzle: 16-byte chunk bits 4-6 XOR row bits 7-9), the lane's
/// accumulators (from float 128 on) updated in place, laid out as the PTX ISA's
/// fragment: with warp `w` of the warpgroup and `g = lane/4`, `t = lane%4`,
/// accumulator `4j + h` is row `16w + g + 8(h/2)`, column `8j + 2t + h%2`. `scale` 0
/// drops the old accumulators. Each lane reads the shared operands itself: no
/// exchange.
extern "C" fn host_wgmma(scratch: *mut u8, kind: i32, bn: i32, steps: i32, scale: i32) {
    let (block, w, l) = with_lane(|l| (l.block.clone(), l.warp, l.lane));
    block.warpgroups[w / 4].wait();
    let (smem, w) = (block.smem, w % 4);
    let elem = if kind & 1 == 0 { ElemType::Bf16 } else { ElemType::F16 };
    let (bn, steps) = (bn as usize, steps as usize);
    let a_regs = kind & WGMMA_A_REGS != 0;
    let operands = if a_regs { 5 * steps } else { 2 * steps };
    // SAFETY: the rewritten statement stored `operands` words and bn/2 floats there.
    let words = unsafe { std::slice::from_raw_parts(scratch as *const u64, operands) };
    // A in registers: the warp's lanes exchange their four words a step (two
    // to an operand slot), laid out as `mma.sync`'s m16k16 A fragment over the
    // warp's 16 rows.
    let lanes_a = if a_regs {
        assert!(steps <= 6, "{steps} steps of A in registers");
        let mut mine = [0u64; 12];
        for s in 0..steps {
            for r in 0..4 {
                mine[(4 * s + r) / 2] |= (words[5 * s + r] & 0xffff_ffff) << (32 * (r % 2));
            }
        }
        Some(exchange(mine).0)
    } else {
        None
    };
    let a_reg = |s: usize, row: usize, k: usize| -> f32 {
        let all = lanes_a.as_ref().expect("A in registers");
        let (lane, reg) = ((row % 8) * 4 + (k % 8) / 2, 4 * s + row / 8 + 2 * (k / 8));
        let word = all[lane][reg / 2] >> (32 * (reg % 2));
        reference::from_bits(elem, (word >> (16 * (k % 2))) as u16)
    };
    // SAFETY: as above; the floats start at float 128 (byte 512) of the 1536 bytes.
    let acc = unsafe { std::slice::from_raw_parts_mut((scratch as *mut f32).add(128), bn / 2) };
    if scale == 0 {
        acc.fill(0.0);
    }
    // A K-major operand: 8-row groups `sbo` apart, a row's 64 elements of K
    // its 128 bytes. An N-major B (`trans`): blocks of 64 columns `lbo` apart,
    // each 8-row groups of K `sbo` apart, a K row's 64 columns its 128 bytes.
    // Either swizzled: 16-byte chunk bits 4-6 XOR the address's bits 7-9.
    let b_trans = kind & WGMMA_B_TRANS != 0;
    let at_of = |trans: bool| {
        move |desc: u64, row: usize, k: usize| -> f32 {
            assert_eq!(desc >> 62, 1, "a 128-byte swizzle");
            let start = ((desc & 0x3fff) << 4) as usize;
            let lbo = (((desc >> 16) & 0x3fff) << 4) as usize;
            let sbo = (((desc >> 32) & 0x3fff) << 4) as usize;
            let off = if trans {
                start + (row / 64) * lbo + (k / 8) * sbo + (k % 8) * 128 + 2 * (row % 64)
            } else {
                start + (row / 8) * sbo + (row % 8) * 128 + 2 * k
            };
            let off = off ^ (((off >> 7) & 7) << 4);
            // SAFETY: the offset lies in the block's shared memory (the kernel's tiles).
            reference::from_bits(elem, unsafe { *(smem.add(off) as *const u16) })
        }
    };
    let (at, at_b) = (at_of(false), at_of(b_trans));
    let (g, t) = (l / 4, l % 4);
    for s in 0..steps {
        for (i, d) in acc.iter_mut().enumerate() {
            let (j, h) = (i / 4, i % 4);
            let (row, col) = (16 * w + g + 8 * (h / 2), 8 * j + 2 * t + h % 2);
            for k in 0..16 {
                let (a, b) = if a_regs {
                    (a_reg(s, row % 16, k), at_b(words[5 * s + 4], col, k))
                } else {
                    (at(words[2 * s], row, k), at_b(words[2 * s + 1], col, k))
                };
                *d += a * b;
            }
        }
    }
}

/// `wgmma.wait_group` alone (a group's products waited for before the
/// accumulators are read): the warpgroup's lanes meet, each having computed
/// its products, as the warpgroup's group is complete on the GPU.
extern "C" fn host_wgmma_wait() {
    let (block, w) = with_lane(|l| (l.block.clone(), l.warp));
    block.warpgroups[w / 4].wait();
}

/// `host_wgmma`'s kind bit for A in registers (bit 0: f16, else bf16).
const WGMMA_A_REGS: i32 = 2;

/// `host_wgmma`'s `kind` bit: B is N-major (`imm-trans-b` 1).
const WGMMA_B_TRANS: i32 = 4;

/// Bytes of a GPU thread's coroutine stack on the host (the kernel's frames and
/// the harness's calls from them; reserved, not touched, past what they use).
const STACK_BYTES: usize = 1 << 20;

/// Runs a grid of `grid` blocks of `threads` threads with `smem` bytes of shared
/// memory each, one block at a time: `thread(tid, x, y, z)` calls the kernel for
/// one thread. A block's threads are coroutines on the calling thread, each
/// run in turn until it waits (at a barrier, a warp-wide operation, an
/// mbarrier) for what others have yet to do: a wait is a switch of stacks, not
/// a system call. A round in which every waiting thread still waits and none
/// arrived anywhere is a deadlock of the kernel, and fails.
pub fn run_blocks(
    grid: (usize, usize, usize),
    threads: usize,
    smem: usize,
    thread: impl Fn(usize, usize, usize, usize) + Sync,
) {
    let warps = threads.div_ceil(32);
    let thread: &(dyn Fn(usize, usize, usize, usize) + Sync) = &thread;
    // SAFETY: the coroutines below call `thread` only while this function
    // runs: each returns before the next block, and on a failure the others
    // are never resumed again (forgotten, see `fail`).
    let thread: &'static (dyn Fn(usize, usize, usize, usize) + Sync) = unsafe { std::mem::transmute(thread) };
    for z in 0..grid.2 {
        for y in 0..grid.1 {
            for x in 0..grid.0 {
                run_block(threads, warps, smem, (x, y, z), (grid.0 as i32, grid.1 as i32), thread);
            }
        }
    }
}

/// One block of [`run_blocks`].
fn run_block(
    threads: usize,
    warps: usize,
    smem: usize,
    (x, y, z): (usize, usize, usize),
    grid: (i32, i32),
    thread: &'static (dyn Fn(usize, usize, usize, usize) + Sync),
) {
    // Aligned to 256 KB: a wgmma descriptor holds bits 4-17 of a shared
    // address, which are then the offset into the block's memory.
    let mut shared = vec![0u8; smem.max(1) + SMEM_ALIGN];
    let skip = (SMEM_ALIGN - shared.as_ptr() as usize % SMEM_ALIGN) % SMEM_ALIGN;
    let block = Arc::new(Block {
        bar: Barrier::new(threads),
        // SAFETY: `skip < SMEM_ALIGN`, inside the allocation.
        smem: unsafe { shared.as_mut_ptr().add(skip) },
        warps: (0..warps)
            .map(|_| Warp { meet: Barrier::new(32), slots: Mutex::new([[[0; 12]; 32]; 2]) })
            .collect(),
        warpgroups: (0..threads.div_ceil(128)).map(|g| Barrier::new((threads - 128 * g).min(128))).collect(),
        grid,
        mbars: Mutex::new(Default::default()),
        named: Mutex::new(Default::default()),
    });
    let mut lanes: Vec<Lane> = (0..threads)
        .map(|tid| Lane {
            block: block.clone(),
            warp: tid / 32,
            lane: tid % 32,
            ops: 0,
            yielder: std::ptr::null(),
        })
        .collect();
    let mut coroutines: Vec<Option<Coroutine<(), (), (), DefaultStack>>> = (0..threads)
        .map(|tid| {
            let stack = STACKS.with(|s| s.borrow_mut().pop()).unwrap_or_else(|| {
                DefaultStack::new(STACK_BYTES).expect("a coroutine stack for a GPU thread on the host")
            });
            Some(Coroutine::with_stack(stack, move |yielder: &Yielder<(), ()>, ()| {
                with_lane(|l| l.yielder = yielder);
                thread(tid, x, y, z);
            }))
        })
        .collect();
    // A failure: the suspended coroutines hold the kernel's frames, which have
    // nothing to unwind them by; they are never resumed again.
    let fail = |coroutines: &mut Vec<Option<Coroutine<(), (), (), DefaultStack>>>| {
        for c in coroutines.drain(..).flatten() {
            std::mem::forget(c);
        }
    };
    let mut left = threads;
    // Each round runs the threads in another order (a shuffle by a generator
    // seeded with the block's index), so that the order in which threads leave
    // a wait, and run until their next, varies: what a kernel orders by no
    // barrier is seen more than one way, the same way on every run.
    let mut order: Vec<usize> = (0..threads).collect();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ ((x as u64) << 40 | (y as u64) << 20 | z as u64);
    while left > 0 {
        let before = PROGRESS.with(Cell::get);
        let mut returned = false;
        for i in (1..threads).rev() {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            order.swap(i, (rng % (i as u64 + 1)) as usize);
        }
        for &tid in &order {
            let slot = &mut coroutines[tid];
            let Some(co) = slot.as_mut() else { continue };
            CURRENT.with(|c| c.set(&mut lanes[tid]));
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| co.resume(())));
            CURRENT.with(|c| c.set(std::ptr::null_mut()));
            match r {
                Ok(CoroutineResult::Yield(())) => {}
                Ok(CoroutineResult::Return(())) => {
                    let done = slot.take().expect("a running coroutine");
                    STACKS.with(|s| s.borrow_mut().push(done.into_stack()));
                    left -= 1;
                    returned = true;
                }
                Err(panic) => {
                    fail(&mut coroutines);
                    std::panic::resume_unwind(panic);
                }
            }
        }
        if left > 0 && !returned && PROGRESS.with(Cell::get) == before {
            fail(&mut coroutines);
            panic!(
                "block ({x}, {y}, {z}): every waiting thread waits for another (a deadlock of the kernel)"
            );
        }
    }
    // Every thread returned (and dropped its handle) before the shared memory goes.
    drop(lanes);
    drop(block);
    drop(shared);
}

/// 16-bit values in a buffer aligned to 16 bytes (the kernels' vector loads and
/// stores assume it of A, B and C, as the device's allocations give it).
pub fn aligned(v: &[u16]) -> Vec<u128> {
    let mut out = vec![0u128; v.len().div_ceil(8)];
    // SAFETY: `out` holds at least `v.len()` u16 (8 a u128); u128 is aligned for u16.
    let dst = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut u16, v.len()) };
    dst.copy_from_slice(v);
    out
}

/// The 16-bit values of an [`aligned`] buffer.
pub fn as_u16(v: &[u128], len: usize) -> &[u16] {
    assert!(len <= 8 * v.len());
    // SAFETY: `v` holds `8 · v.len() ≥ len` u16; u128 is aligned for u16.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u16, len) }
}

/// A compiled kernel's entry, by name.
pub fn gemm_entry(ee: &ExecutionEngine<'_>, name: &str) -> Result<Gemm, String> {
    let addr = ee.get_function_address(name).map_err(|e| e.to_string())?;
    // SAFETY: the JIT compiled `name` with `gpu::kernel::ABI`'s parameters plus the
    // four indices (`for_host`), which is `Gemm`; the caller keeps `ee` alive while
    // it calls it.
    Ok(unsafe { std::mem::transmute::<usize, Gemm>(addr) })
}

/// A loop kernel's entry on the host: `plan::gpu`'s ABI (buffer table, dim
/// table, status word), then `tid.x`, `ctaid.x`, `ctaid.y`, `ctaid.z`.
pub type LoopKernel = unsafe extern "C" fn(*const u64, *const i64, *mut i64, i32, i32, i32, i32);

/// What a kernel given to [`HostKernels`] is, which says how it is called.
#[derive(Clone, Copy, Debug)]
pub enum HostKernelKind {
    /// Three pointer parameters (a loop program's buffer table, dims and
    /// status word; the operand copy's source, destination and descriptor),
    /// its units taken grid-stride.
    Pointers,
    /// Any parameters, given as words ([`HostKernels::launch_args`]: a GEMM
    /// of the family, whatever its ABI's last arguments); `threads_apart`: it
    /// uses no warp-wide operation (a SIMT kernel), so its threads run one
    /// after another.
    Args { threads_apart: bool },
}

/// A kernel's entry through its words ([`for_host`]'s `<name>.args`): the
/// kernel's arguments, a 64-bit word each (a pointer's address, an
/// integer's value), then the four indices.
pub type ArgsKernel = unsafe extern "C" fn(*const u64, i32, i32, i32, i32);

/// A split-K GEMM's entry on the host: the ABI with C the f32 workspace,
/// `kper`, the four indices.
pub type SplitGemm = unsafe extern "C" fn(
    *const u16,
    *const u16,
    *mut f32,
    *const u16,
    *const u16,
    i32,
    i32,
    i32,
    i32,
    i32,
    i32,
    i64,
    i64,
    i64,
    i32,
    i32,
    i32,
    i32,
    i32,
);

/// A split-K reduction's entry on the host: W, C, bias, residual, M, N,
/// ldc, the shares, their stride, the four indices.
pub type Reduce = unsafe extern "C" fn(
    *const f32,
    *mut u8,
    *const u8,
    *const u8,
    i32,
    i32,
    i32,
    i32,
    i64,
    i32,
    i32,
    i32,
    i32,
);

/// A folding split-K GEMM's entry on the host: the ABI, `kper`, the
/// workspace, the tiles' counters, the four indices.
pub type FoldGemm = unsafe extern "C" fn(
    *const u16,
    *const u16,
    *mut u8,
    *const u8,
    *const u8,
    i32,
    i32,
    i32,
    i32,
    i32,
    i32,
    i64,
    i64,
    i64,
    i32,
    *mut f32,
    *mut i64,
    i32,
    i32,
    i32,
    i32,
);

#[derive(Clone, Copy)]
enum HostEntry {
    Pointers(LoopKernel),
    Args(ArgsKernel, bool),
}

/// Kernels compiled for the host, each an index, with what owns their
/// code (the engines, then the context they were made in).
pub struct HostKernels {
    entries: Vec<HostEntry>,
    names: Vec<String>,
    _engines: Vec<ExecutionEngine<'static>>,
    // Dropped last: the engines' code and values belong to it.
    _ctx: Box<Context>,
}

// SAFETY: after construction the engines and context are only kept alive
// (never touched again); the entries are plain functions of the JIT'd code,
// which any thread may call.
unsafe impl Send for HostKernels {}
unsafe impl Sync for HostKernels {}

impl HostKernels {
    /// Loop kernels `(name, LLVM IR of its NVPTX module)`, in order
    /// (`codegen::nvptx::program_ir`'s).
    pub fn loops(kernels: &[(String, String)]) -> Result<HostKernels, String> {
        let all: Vec<_> =
            kernels.iter().map(|(n, ir)| (n.clone(), ir.clone(), HostKernelKind::Pointers)).collect();
        HostKernels::new(&all)
    }

    /// Kernels `(name, LLVM IR of its NVPTX module, kind)`, in order.
    pub fn new(kernels: &[(String, String, HostKernelKind)]) -> Result<HostKernels, String> {
        let ctx = Box::new(Context::create());
        // SAFETY: the engines borrow the boxed context, which does not move and
        // is dropped after them (field order).
        let ctx_ref: &'static Context = unsafe { &*(ctx.as_ref() as *const Context) };
        let mut engines = Vec::with_capacity(kernels.len());
        let mut entries = Vec::with_capacity(kernels.len());
        for (name, ir, kind) in kernels {
            let ee = engine(ctx_ref, ir, name)?;
            entries.push(match kind {
                // SAFETY: `for_host` compiled `name` with three pointer parameters
                // plus the four indices, which is `LoopKernel`; its engine is kept.
                HostKernelKind::Pointers => {
                    let addr = ee.get_function_address(name).map_err(|e| format!("{name}: {e}"))?;
                    HostEntry::Pointers(unsafe { std::mem::transmute::<usize, LoopKernel>(addr) })
                }
                // SAFETY: `for_host` compiled `<name>.args`, which takes the
                // kernel's arguments as words plus the four indices: `ArgsKernel`.
                HostKernelKind::Args { threads_apart } => {
                    let entry = format!("{name}.args");
                    let addr = ee.get_function_address(&entry).map_err(|e| format!("{entry}: {e}"))?;
                    HostEntry::Args(unsafe { std::mem::transmute::<usize, ArgsKernel>(addr) }, *threads_apart)
                }
            });
            engines.push(ee);
        }
        let names = kernels.iter().map(|(n, _, _)| n.clone()).collect();
        Ok(HostKernels { entries, names, _engines: engines, _ctx: ctx })
    }

    /// Kernel `k`'s name.
    pub fn name(&self, k: usize) -> Option<&str> {
        self.names.get(k).map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// How kernel `k` is called.
    pub fn kind(&self, k: usize) -> Option<HostKernelKind> {
        Some(match self.entries.get(k)? {
            HostEntry::Pointers(_) => HostKernelKind::Pointers,
            HostEntry::Args(_, apart) => HostKernelKind::Args { threads_apart: *apart },
        })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Run kernel `k` of three pointer parameters over `blocks` blocks of
    /// `threads` threads with `smem` bytes of shared memory each.
    ///
    /// # Safety
    /// `args` are the kernel's buffer table, dim table and status word, in
    /// host memory, as its ABI asks, and nothing else touches them meanwhile.
    pub unsafe fn launch_loop(
        &self,
        k: usize,
        (blocks, threads, smem): (usize, usize, usize),
        args: [u64; 3],
    ) -> Result<(), String> {
        let Some(HostEntry::Pointers(entry)) = self.entries.get(k).copied() else {
            return Err(format!("kernel {k} is not a loop kernel"));
        };
        run_blocks((blocks, 1, 1), threads, smem, |tid, x, y, z| {
            // SAFETY: the caller's contract; each thread runs the kernel once.
            unsafe {
                entry(
                    args[0] as *const u64,
                    args[1] as *const i64,
                    args[2] as *mut i64,
                    tid as i32,
                    x as i32,
                    y as i32,
                    z as i32,
                )
            }
        });
        Ok(())
    }

    /// Run kernel `k` of [`HostKernelKind::Args`] over every block of `grid`,
    /// `threads` a block with `smem` bytes of shared memory each, its
    /// arguments `args` (a word each, in its parameters' order).
    ///
    /// # Safety
    /// `args` are what the kernel's ABI asks for (a GEMM's `gpu::kernel::ABI`
    /// at this problem, a folding split-K kernel's workspace and zeroed
    /// counters, a taps kernel's descriptor), their pointers into host memory,
    /// and nothing else touches what the kernel writes meanwhile.
    pub unsafe fn launch_args(
        &self,
        k: usize,
        grid: (usize, usize, usize),
        (threads, smem): (usize, usize),
        args: &[u64],
    ) -> Result<(), String> {
        let Some(HostEntry::Args(entry, apart)) = self.entries.get(k).copied() else {
            return Err(format!("kernel {k} does not take its arguments as words"));
        };
        let words = args.as_ptr() as usize;
        let thread = |tid: usize, x: usize, y: usize, z: usize| {
            // SAFETY: the caller's contract; `args` outlives every thread, which
            // runs the kernel once.
            unsafe { entry(words as *const u64, tid as i32, x as i32, y as i32, z as i32) }
        };
        if apart {
            for z in 0..grid.2 {
                for y in 0..grid.1 {
                    for x in 0..grid.0 {
                        for t in 0..threads {
                            thread(t, x, y, z);
                        }
                    }
                }
            }
        } else {
            run_blocks(grid, threads, smem, thread);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Threads meet at the block's barrier: every write before it is seen by
    /// every read after it, in each block of the grid, and a warp's lanes
    /// exchange their operands.
    #[test]
    fn a_blocks_threads_meet_at_its_barriers_and_warps() {
        for threads in [1usize, 32, 33, 96, 384] {
            let seen = AtomicUsize::new(0);
            run_blocks((3, 2, 1), threads, 4 * threads, |tid, x, y, _| {
                let tag = |t: usize| (t + 1000 * (x + 10 * y)) as u32;
                let smem = host_smem() as *mut u32;
                // SAFETY: word `tid` of the block's `4 · threads` bytes.
                unsafe { *smem.add(tid) = tag(tid) };
                host_bar();
                // SAFETY: the block's words, all written before the barrier.
                let mut ok = (0..threads).all(|t| unsafe { *smem.add(t) } == tag(t));
                host_bar();
                if threads.is_multiple_of(32) {
                    let (all, lane) = exchange([tid as u64; 12]);
                    ok &= lane == tid % 32 && (0..32).all(|l| all[l][0] as usize == tid - tid % 32 + l);
                }
                if ok {
                    seen.fetch_add(1, Ordering::Relaxed);
                }
            });
            assert_eq!(seen.load(Ordering::Relaxed), threads * 6, "{threads} threads");
        }
    }

    /// The order in which threads leave a wait varies from round to round and
    /// block to block: a word the threads write unordered between two barriers
    /// is left by different threads.
    #[test]
    fn unordered_writes_are_seen_in_more_than_one_order() {
        let last = Mutex::new(std::collections::BTreeSet::new());
        run_blocks((8, 1, 1), 64, 4, |tid, _, _, _| {
            let word = host_smem() as *mut u32;
            host_bar();
            // SAFETY: the block's one word; the threads take turns on one host thread.
            unsafe { *word = tid as u32 };
            host_bar();
            if tid == 0 {
                // SAFETY: as above.
                last.lock().unwrap().insert(unsafe { *word });
            }
        });
        assert!(last.lock().unwrap().len() > 1, "{:?}", last.lock().unwrap());
    }

    /// A kernel whose threads wait for one that never comes fails, naming the
    /// block, instead of hanging; the next launch on the thread runs as usual.
    #[test]
    fn a_deadlocked_block_fails() {
        let e = std::panic::catch_unwind(|| {
            run_blocks((2, 1, 1), 64, 0, |tid, _, _, _| {
                if tid != 0 {
                    host_bar();
                }
            })
        })
        .unwrap_err();
        let text = e.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(text.contains("block (0, 0, 0)") && text.contains("deadlock"), "{text}");
        let n = AtomicUsize::new(0);
        run_blocks((2, 1, 1), 64, 0, |_, _, _, _| {
            host_bar();
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 128);
    }

    /// A thread's panic reaches the caller of `run_blocks`.
    #[test]
    fn a_threads_panic_reaches_the_caller() {
        let e = std::panic::catch_unwind(|| {
            run_blocks((1, 1, 1), 32, 0, |tid, _, _, _| {
                host_bar();
                assert!(tid != 7, "thread 7 fails");
            })
        })
        .unwrap_err();
        let text = e.downcast_ref::<&str>().copied().or(e.downcast_ref::<String>().map(String::as_str));
        assert_eq!(text, Some("thread 7 fails"));
    }
}
