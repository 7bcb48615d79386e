//! Loop programs as GPU kernels (`codegen::nvptx::program_ir`), run on the
//! host emulator (`host`) step after step as a model's plan orders them,
//! against the reference interpreter, at shapes of 1, primes and one past a
//! warp: element-wise math in f32, f16, integers and bools; data movement
//! (transposes, slices, concats, every pad mode, gathers, scans); reductions
//! over leading, middle and trailing axes; softmax and layer norm (a warp per
//! row where the row is a warp long, a thread per point where it is short);
//! sums that remove the last axis (a warp per point); multi-versioned
//! broadcasts; NaNs in max and min. Every kernel also goes through ptxas
//! where the wheel's ptxas is at hand.

use anyshape_codegen::emulator as host;

use anyshape_codegen::nvptx::{program_ir, program_ptx};
use gpu::manifest::PtxasReport;
use inkwell::context::Context;
use inkwell::execution_engine::ExecutionEngine;
use ir::{DType, Elems, Tensor};
use plan::gpu::{loop_blocks, GpuLoopSchedule, LOOP_THREADS};
use plan::{BufferKind, LoopProgram, ModelPlan, Node, StepKind, E};

/// A loop kernel's entry on the host: `plan::gpu`'s ABI, then `tid.x`,
/// `ctaid.x`, `ctaid.y`, `ctaid.z`.
type LoopKernel = unsafe extern "C" fn(*const *mut u8, *const i64, *mut i64, i32, i32, i32, i32);

/// A linear congruential generator: a case's inputs from its seed.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }
    /// A float in [-2, 2).
    fn unit(&mut self) -> f32 {
        self.next() as f32 / u32::MAX as f32 * 4.0 - 2.0
    }
}

const ELEMENTWISE: &str = r#"graph {
  sym n param 1..
  sym m param 1..
  input %x: f32[n, m]
  input %y: f32[m]
  input %h: f16[n, m]
  input %k: i32[n, m]
  %y2: f32[1, m] = reshape %y
  %yb: f32[n, m] = broadcast %y2
  %a: f32[n, m] = add %x, %yb
  %e: f32[n, m] = exp %a
  %t: f32[n, m] = tanh %x
  %er: f32[n, m] = erf %x
  %sg: f32[n, m] = sigmoid %a
  %s: f32[n, m] = sqrt %e
  %l: f32[n, m] = log %e
  %mx: f32[n, m] = max %er, %t
  %mn: f32[n, m] = min %sg, %mx
  %d: f32[n, m] = div %mn, %s
  %c: bool[n, m] = less %x, %yb
  %sel: f32[n, m] = select %c, %d, %l
  %fl: f32[n, m] = floor %a
  %ab: f32[n, m] = abs %fl
  %ng: f32[n, m] = neg %ab
  %r: f32[n, m] = relu %x
  %three: i64[] = constant 3
  %three2: i64[1, 1] = reshape %three
  %threeb: i64[n, m] = broadcast %three2
  %i: i64[n, m] = cast %fl
  %im: i64[n, m] = mod %i, %threeb
  %idv: i64[n, m] = div %i, %threeb
  %nt: bool[n, m] = not %c
  %he: f16[n, m] = exp %h
  %ht: f16[n, m] = tanh %h
  %hs: f16[n, m] = add %he, %ht
  %ka: i32[n, m] = abs %k
  %kf: f32[n, m] = cast %ka
  %kx: f32[n, m] = mul %kf, %r
  output %sel, %ng, %r, %im, %idv, %nt, %hs, %kx
}
"#;

const MOVEMENT: &str = r#"graph {
  sym n param 3..
  sym m param 1..
  input %x: f32[n, m, 4]
  input %ids: i64[m]
  %t: f32[4, n, m] = transpose[perm=[2, 0, 1]] %x
  %r: f32[4, n*m] = reshape %t
  %st: f32[2, n*m] = slice[0: 1 step 2] %r
  %cat: f32[6, n*m] = concat[axis=0] %st, %r
  %p: f32[n+3, m, 4] = pad[pads=[(1, 2), (0, 0), (0, 0)], mode=constant(0.5)] %x
  %pr: f32[n+4, m, 4] = pad[pads=[(2, 2), (0, 0), (0, 0)], mode=reflect] %x
  %pe: f32[n, m+3, 4] = pad[pads=[(0, 0), (1, 2), (0, 0)], mode=edge] %x
  %w: f32[5, 3] = constant [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0]
  %g: f32[m, 3] = gather[axis=0] %w, %ids
  %pos: f32[m, 3] = iota[axis=0]
  %gp: f32[m, 3] = add %g, %pos
  %cs: f32[m, 3] = cumsum[axis=0, exclusive=false, reverse=false] %gp
  %gt: f32[3, m] = transpose[perm=[1, 0]] %gp
  %csl: f32[3, m] = cumsum[axis=1, exclusive=false, reverse=true] %gt
  output %cat, %p, %pr, %pe, %cs, %csl
}
"#;

const REDUCTIONS: &str = r#"graph {
  sym n param 1..
  sym m param 1..
  input %x: f32[3, n, m]
  %s0: f32[n, m] = reduce_sum[axes=[0], keep_dims=false] %x
  %s1: f32[3, 1, m] = reduce_max[axes=[1], keep_dims=true] %x
  %s2: f32[3, n] = reduce_mean[axes=[2], keep_dims=false] %x
  %s12: f32[3] = reduce_min[axes=[1, 2], keep_dims=false] %x
  %mx: f32[3, n, 1] = reduce_max[axes=[2], keep_dims=true] %x
  %mxb: f32[3, n, m] = broadcast %mx
  %sh: f32[3, n, m] = sub %x, %mxb
  %ex: f32[3, n, m] = exp %sh
  %sm: f32[3, n, 1] = reduce_sum[axes=[2], keep_dims=true] %ex
  %smb: f32[3, n, m] = broadcast %sm
  %softmax: f32[3, n, m] = div %ex, %smb
  %mean: f32[3, n, 1] = reduce_mean[axes=[2], keep_dims=true] %x
  %meanb: f32[3, n, m] = broadcast %mean
  %dev: f32[3, n, m] = sub %x, %meanb
  %sq: f32[3, n, m] = mul %dev, %dev
  %var: f32[3, n, 1] = reduce_mean[axes=[2], keep_dims=true] %sq
  %eps: f32[] = constant 0.00001
  %eps3: f32[1, 1, 1] = reshape %eps
  %epsb: f32[3, n, 1] = broadcast %eps3
  %ve: f32[3, n, 1] = add %var, %epsb
  %rs: f32[3, n, 1] = sqrt %ve
  %inv: f32[3, n, 1] = reciprocal %rs
  %invb: f32[3, n, m] = broadcast %inv
  %ln: f32[3, n, m] = mul %dev, %invb
  output %s0, %s1, %s2, %s12, %softmax, %ln
}
"#;

/// What the GPU computes without the C library: sin and cos (also of
/// rotary positions in the thousands of radians), pow (negative bases,
/// integer and fractional exponents, f16), fmod.
const LIBRARY_MATH: &str = r#"graph {
  sym n param 1..
  input %x: f32[n]
  input %y: f32[n]
  input %h: f16[n]
  %s: f32[n] = sin %x
  %c: f32[n] = cos %x
  %k: f32[] = constant 1234.5
  %k1: f32[1] = reshape %k
  %kb: f32[n] = broadcast %k1
  %big: f32[n] = mul %x, %kb
  %bs: f32[n] = sin %big
  %bc: f32[n] = cos %big
  %p: f32[n] = pow %x, %y
  %three: f32[] = constant 3.0
  %t1: f32[1] = reshape %three
  %tb: f32[n] = broadcast %t1
  %cube: f32[n] = pow %x, %tb
  %hp: f16[n] = pow %h, %h
  %m: f32[n] = mod %big, %y
  output %s, %c, %bs, %bc, %p, %cube, %hp, %m
}
"#;

/// Integer, f16 and boolean reductions along rows (shuffled in 32-bit
/// words: two for 64-bit values, one widened for narrower ones).
const TYPED_REDUCTIONS: &str = r#"graph {
  sym n param 1..
  sym m param 1..
  input %k: i64[n, m]
  input %h: f16[n, m]
  input %x: f32[n, m]
  %ks: i64[n] = reduce_sum[axes=[1], keep_dims=false] %k
  %km: i64[n] = reduce_max[axes=[1], keep_dims=false] %k
  %hm: f16[n] = reduce_max[axes=[1], keep_dims=false] %h
  %z: f32[] = constant 0.0
  %z2: f32[1, 1] = reshape %z
  %zb: f32[n, m] = broadcast %z2
  %pos: bool[n, m] = greater %x, %zb
  %pf: f32[n, m] = cast %pos
  %np: f32[n] = reduce_sum[axes=[1], keep_dims=false] %pf
  output %ks, %km, %hm, %np
}
"#;

const MAYBE_BROADCAST: &str = r#"graph {
  sym n param 1..
  sym m param 1..
  sym k param 1..
  sym j param 1..
  assert k broadcasts to n
  assert j broadcasts to m
  input %x: f32[n, m]
  input %y: f32[k, m]
  input %z: f32[n, j]
  %yb: f32[n, m] = broadcast %y
  %zb: f32[n, m] = broadcast %z
  %a: f32[n, m] = add %x, %yb
  %b: f32[n, m] = mul %a, %zb
  output %b
}
"#;

const MAX_MIN_NAN: &str = r#"graph {
  sym n param 1..
  sym m param 1..
  input %x: f32[n, m]
  input %y: f32[n, m]
  %rmax: f32[n] = reduce_max[axes=[1], keep_dims=false] %x
  %rmin: f32[n] = reduce_min[axes=[1], keep_dims=false] %x
  %cmax: f32[m] = reduce_max[axes=[0], keep_dims=false] %x
  %cmin: f32[m] = reduce_min[axes=[0], keep_dims=false] %x
  %emax: f32[n, m] = max %x, %y
  %emin: f32[n, m] = min %x, %y
  output %rmax, %rmin, %cmax, %cmin, %emax, %emin
}
"#;

/// A softmax over pooled means: a reduction inside another's body, which
/// each lane computes whole while the warp shares the outer one.
const POOLED_SOFTMAX: &str = r#"graph {
  sym c param 1..
  sym h param 1..
  input %x: f32[c, h, h]
  %mean: f32[c, 1, 1] = reduce_mean[axes=[1, 2], keep_dims=true] %x
  %mx: f32[1, 1, 1] = reduce_max[axes=[0], keep_dims=true] %mean
  %mxb: f32[c, 1, 1] = broadcast %mx
  %sh: f32[c, 1, 1] = sub %mean, %mxb
  %ex: f32[c, 1, 1] = exp %sh
  %sm: f32[1, 1, 1] = reduce_sum[axes=[0], keep_dims=true] %ex
  %smb: f32[c, 1, 1] = broadcast %sm
  %p: f32[c, 1, 1] = div %ex, %smb
  output %p
}
"#;

/// The graph and its plan; every step a loop program.
fn planned(text: &str) -> (ir::Graph, ModelPlan) {
    let g = ir::parse_graph(text, &|_| None).unwrap_or_else(|e| panic!("{e}"));
    let plan = lower::lower(&g, &passes::fuse(&g)).expect("lowers");
    for st in &plan.steps {
        assert!(matches!(st.kind, StepKind::Loop { .. }), "a {} step: not a loop program", st.kind.name());
    }
    assert!(!plan.programs.is_empty());
    (g, plan)
}

/// A loop extent's value (a dim slot or a constant).
fn extent(p: &LoopProgram, e: E, dims: &[i64]) -> usize {
    match p.exprs.node(e) {
        Node::Dim(s) => dims[*s as usize] as usize,
        Node::Const(c) => *c as usize,
        n => panic!("an extent {n:?}"),
    }
}

/// The schedule the kernel takes at `dims`, and the blocks the runtime would
/// launch (at most `cap`: the kernel takes its units grid-stride).
fn geometry(p: &LoopProgram, dims: &[i64], cap: usize) -> (GpuLoopSchedule, usize) {
    let inner_at = p.inner();
    let inner = inner_at.map_or(1, |i| extent(p, p.space[i], dims));
    let rows: usize =
        p.space[..inner_at.unwrap_or(p.space.len())].iter().map(|e| extent(p, *e, dims)).product();
    let row_len = p.gpu_warp_schedule().map_or(1, |(_, e)| extent(p, e, dims) as i64);
    let s = p.gpu_schedule(row_len);
    (s, loop_blocks(s, rows, inner, p.gpu_quads(s).is_some()).min(cap))
}

/// Bytes of a buffer aligned to 16 (as a device allocation is).
fn zeroed(bytes: usize) -> Vec<u128> {
    vec![0u128; bytes.div_ceil(16).max(1)]
}

fn decode(dt: DType, b: &[u8]) -> Vec<f64> {
    let n = b.len() / dt.size().max(1);
    (0..n)
        .map(|i| {
            let at = &b[i * dt.size()..(i + 1) * dt.size()];
            match dt {
                DType::F32 => f32::from_le_bytes(at.try_into().unwrap()) as f64,
                DType::F64 => f64::from_le_bytes(at.try_into().unwrap()),
                DType::F16 => ir::f16_to_f32(u16::from_le_bytes(at.try_into().unwrap())) as f64,
                DType::BF16 => ir::bf16_to_f32(u16::from_le_bytes(at.try_into().unwrap())) as f64,
                DType::I32 => i32::from_le_bytes(at.try_into().unwrap()) as f64,
                DType::I64 => i64::from_le_bytes(at.try_into().unwrap()) as f64,
                DType::I8 => at[0] as i8 as f64,
                DType::U8 | DType::Bool => at[0] as f64,
            }
        })
        .collect()
}

/// Seeded inputs of `g` at `syms`: floats in [-2, 2) (with NaNs, infinities
/// and signed zeros where `specials`), integers in -5..5.
fn inputs(g: &ir::Graph, syms: &sym::Bindings, seed: u64, specials: bool) -> Vec<(String, Tensor)> {
    let mut rng = Lcg(seed.wrapping_mul(0x9e3779b97f4a7c15) + 1);
    let odd = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0];
    g.inputs
        .iter()
        .map(|&v| {
            let ty = g.ty(v);
            let shape: Vec<usize> = ty.shape.iter().map(|d| syms.eval(d).expect("dim") as usize).collect();
            let n: usize = shape.iter().product();
            let mut float = || {
                let x = rng.unit();
                if specials && rng.next().is_multiple_of(7) {
                    odd[rng.next() as usize % odd.len()]
                } else {
                    x
                }
            };
            let elems = match ty.dtype {
                DType::F32 => Elems::F32((0..n).map(|_| float()).collect()),
                DType::F16 => Elems::F16((0..n).map(|_| ir::f64_to_f16(float() as f64)).collect()),
                DType::I64 => Elems::I64((0..n).map(|_| (rng.next() % 10) as i64 - 5).collect()),
                DType::I32 => Elems::I32((0..n).map(|_| (rng.next() % 10) as i32 - 5).collect()),
                d => panic!("no inputs of {d:?} here"),
            };
            (g.name(v).to_string(), Tensor::new(shape, elems).expect("tensor"))
        })
        .collect()
}

/// The plan's kernels, compiled for the host.
struct Kernels<'c> {
    engines: Vec<ExecutionEngine<'c>>,
    entries: Vec<LoopKernel>,
}

fn kernels<'c>(ctx: &'c Context, plan: &ModelPlan, what: &str) -> Kernels<'c> {
    let mut engines = Vec::new();
    let mut entries = Vec::new();
    for (i, p) in plan.programs.iter().enumerate() {
        let name = format!("{what}_p{i}");
        let ir = program_ir(p, &name).unwrap_or_else(|e| panic!("{name}: {e}"));
        let ee = host::engine(ctx, &ir, &name).unwrap_or_else(|e| panic!("{name}: {e}"));
        let addr = ee.get_function_address(&name).expect("the kernel");
        // SAFETY: `for_host` compiled `name` with the loop kernel ABI plus the
        // four indices, which is `LoopKernel`; the engine is kept with it.
        entries.push(unsafe { std::mem::transmute::<usize, LoopKernel>(addr) });
        engines.push(ee);
    }
    Kernels { engines, entries }
}

/// Run `plan`'s steps on the host emulator at `syms`, blocks at most `cap`;
/// the outputs' values, or the first check's message.
fn run(
    g: &ir::Graph,
    plan: &ModelPlan,
    k: &Kernels,
    syms: &sym::Bindings,
    ins: &[(String, Tensor)],
    cap: usize,
) -> Result<Vec<Vec<f64>>, String> {
    assert_eq!(k.engines.len(), plan.programs.len());
    let dims: Vec<i64> = plan.dims.exprs().iter().map(|e| g.env.eval(e, syms).expect("a dim")).collect();
    let mut bufs: Vec<Vec<u128>> = Vec::new();
    for b in &plan.buffers {
        let bytes = dims[b.numel as usize] as usize * b.dtype.size();
        let mut v = zeroed(bytes);
        let src: Option<Vec<u8>> = match &b.kind {
            BufferKind::Input(i) => Some(ir::ConstData::from_tensor(&ins[*i].1).bytes().to_vec()),
            BufferKind::Constant(c) => Some(c.bytes().to_vec()),
            BufferKind::Packed => panic!("a packed weight in a loop-only plan"),
            _ => None,
        };
        if let Some(src) = src {
            // SAFETY: `v` holds at least `bytes` bytes, the source's length.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), v.as_mut_ptr() as *mut u8, src.len()) };
        }
        bufs.push(v);
    }
    for st in &plan.steps {
        let StepKind::Loop { program, args } = &st.kind else { unreachable!() };
        let p = &plan.programs[*program];
        let table: Vec<*mut u8> = args.iter().map(|b| bufs[*b].as_mut_ptr() as *mut u8).collect();
        let (_, blocks) = geometry(p, &dims, cap);
        let status = std::sync::atomic::AtomicI64::new(0);
        let entry = k.entries[*program];
        let (tp, dp, sp) = (table.as_ptr() as usize, dims.as_ptr() as usize, status.as_ptr() as usize);
        host::run_blocks((blocks, 1, 1), LOOP_THREADS as usize, 0, |tid, x, y, z| {
            // SAFETY: the table holds a pointer to each of the program's buffers,
            // each sized for this shape; the dim table is the plan's; the status
            // word is an i64 the kernel swaps atomically.
            unsafe {
                entry(
                    tp as *const *mut u8,
                    dp as *const i64,
                    sp as *mut i64,
                    tid as i32,
                    x as i32,
                    y as i32,
                    z as i32,
                )
            }
        });
        let code = status.load(std::sync::atomic::Ordering::SeqCst);
        if code != 0 {
            return Err(p.checks.get(code as usize - 1).cloned().unwrap_or_else(|| format!("code {code}")));
        }
    }
    Ok(plan
        .outputs
        .iter()
        .map(|&b| {
            let buf = &plan.buffers[b];
            let bytes = dims[buf.numel as usize] as usize * buf.dtype.size();
            // SAFETY: the buffer holds at least `bytes` bytes.
            let raw = unsafe { std::slice::from_raw_parts(bufs[b].as_ptr() as *const u8, bytes) };
            decode(buf.dtype, raw)
        })
        .collect())
}

/// `text` on the emulator against the interpreter at each of `shapes`
/// (symbol values in the graph's symbol order `names`); a few blocks (or one,
/// every other case, so that the grid-stride loops take several units).
fn check(what: &str, text: &str, names: &[&str], shapes: &[&[i64]], specials: bool) {
    let (g, plan) = planned(text);
    let ctx = Context::create();
    let k = kernels(&ctx, &plan, what);
    for (case, vals) in shapes.iter().enumerate() {
        let mut syms = sym::Bindings::default();
        for (n, v) in names.iter().zip(vals.iter()) {
            syms.insert(n, *v);
        }
        let ins = inputs(&g, &syms, case as u64, specials);
        let named: Vec<(&str, Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        let want = reference::run(&g, &named).unwrap_or_else(|e| panic!("{what} {vals:?}: interpreter: {e}"));
        let cap = if case % 2 == 0 { 3 } else { 1 };
        let got = run(&g, &plan, &k, &syms, &ins, cap).unwrap_or_else(|e| panic!("{what} {vals:?}: {e}"));
        assert_eq!(got.len(), want.len());
        for ((out, (name, w)), b) in got.iter().zip(&want).zip(&plan.outputs) {
            let w = w.to_f64_vec();
            assert_eq!(out.len(), w.len(), "{what} {vals:?}: {name}");
            // f16 results may differ from the interpreter's by a rounding (an ulp
            // is 2^-10 relative); f32 ones by a sum's order.
            let tol = match plan.buffers[*b].dtype {
                DType::F16 => 2e-3,
                DType::BF16 => 0.0,
                _ => 1e-4,
            };
            for (i, (a, b)) in out.iter().zip(&w).enumerate() {
                let ok = a == b || (a - b).abs() <= tol * (1.0 + b.abs()) || (a.is_nan() && b.is_nan());
                assert!(ok, "{what} {vals:?}: {name}[{i}] = {a}, the interpreter says {b}");
            }
        }
    }
}

#[test]
fn element_wise_programs_match_the_interpreter() {
    let shapes: &[&[i64]] = &[&[1, 1], &[3, 7], &[2, 33], &[5, 32], &[1, 257], &[17, 13]];
    check("ew", ELEMENTWISE, &["n", "m"], shapes, false);
}

/// A bf16 store (a contraction operand's copy, `lower::bf16_operands`)
/// rounds to nearest even and keeps NaNs, as the interpreter does: bit for
/// bit (a rounding apart would be 2⁻⁸, past the tolerance), infinities,
/// NaNs and signed zeros among the inputs, rows of quads and not.
#[test]
fn bf16_stores_round_as_the_interpreter_does() {
    let text = "graph {\n  sym n param 1..\n  sym m param 1..\n  input %x: f32[n, m]\n  \
                %y: bf16[n, m] = cast %x\n  output %y\n}\n";
    let shapes: &[&[i64]] = &[&[1, 1], &[3, 7], &[2, 64], &[5, 33], &[1, 257]];
    check("bf", text, &["n", "m"], shapes, true);
    // Ties (to the even side, down and up), a NaN whose payload is in its
    // low half only (not infinity), the largest finite value (rounds up to
    // infinity), a subnormal, signed zeros.
    let bits: [u32; 12] = [
        0x3f80_8000,
        0x3f81_8000,
        0xbf80_8000,
        0x3f80_8001,
        0x7f80_0001,
        0xff80_0001,
        0x7fc0_0000,
        0x7f7f_ffff,
        0x0000_8001,
        0x8000_0000,
        0x0000_0000,
        0x7f80_0000,
    ];
    let (g, plan) = planned(text);
    let ctx = Context::create();
    let k = kernels(&ctx, &plan, "bf_special");
    let mut syms = sym::Bindings::default();
    syms.insert("n", 3);
    syms.insert("m", 4);
    let x: Vec<f32> = bits.iter().map(|b| f32::from_bits(*b)).collect();
    let ins = vec![("x".to_string(), Tensor::new(vec![3, 4], ir::Elems::F32(x.clone())).expect("a tensor"))];
    let got = run(&g, &plan, &k, &syms, &ins, 1).expect("runs");
    for (i, (v, x)) in got[0].iter().zip(&x).enumerate() {
        let want = ir::bf16_to_f32(ir::f32_to_bf16(*x));
        let same = (want.is_nan() && v.is_nan()) || (*v as f32).to_bits() == want.to_bits();
        assert!(same, "{:#010x} → {v}, want {want} ({i})", x.to_bits());
    }
}

#[test]
fn data_movement_matches_the_interpreter() {
    let shapes: &[&[i64]] = &[&[3, 1], &[4, 7], &[5, 33], &[7, 13]];
    check("mv", MOVEMENT, &["n", "m"], shapes, false);
}

#[test]
fn reductions_short_and_long_rows_match_the_interpreter() {
    // Rows shorter than a warp (a thread per point), a warp long, one past,
    // and long (a warp per row, many terms per lane).
    let shapes: &[&[i64]] = &[&[1, 1], &[2, 31], &[3, 32], &[2, 33], &[5, 7], &[4, 300], &[1, 1025]];
    check("rd", REDUCTIONS, &["n", "m"], shapes, false);
    check("ty", TYPED_REDUCTIONS, &["n", "m"], shapes, false);
}

#[test]
fn multi_versioned_broadcasts_match_the_interpreter() {
    let shapes: &[&[i64]] = &[&[3, 5, 1, 1], &[3, 5, 3, 5], &[4, 33, 1, 33], &[4, 33, 4, 1], &[1, 1, 1, 1]];
    check("mb", MAYBE_BROADCAST, &["n", "m", "k", "j"], shapes, false);
}

#[test]
fn max_and_min_take_nans_as_the_interpreter_does() {
    let shapes: &[&[i64]] = &[&[1, 1], &[3, 7], &[4, 33], &[6, 64], &[2, 130]];
    check("nan", MAX_MIN_NAN, &["n", "m"], shapes, true);
}

#[test]
fn nested_reductions_match_the_interpreter() {
    let shapes: &[&[i64]] = &[&[1, 1], &[7, 3], &[33, 2], &[40, 9]];
    check("ps", POOLED_SOFTMAX, &["c", "h"], shapes, false);
}

/// The schedules the kernels take: a softmax's rows a warp each when long,
/// a thread a point when short; a sum removing the last axis a warp a point.
#[test]
fn row_reductions_take_warp_schedules_where_rows_are_long() {
    let (_, plan) = planned(REDUCTIONS);
    let warp: Vec<_> = plan.programs.iter().filter_map(|p| p.gpu_warp_schedule().map(|w| w.0)).collect();
    assert!(warp.contains(&GpuLoopSchedule::WarpRows), "{warp:?}");
    assert!(warp.contains(&GpuLoopSchedule::WarpPoints), "{warp:?}");
    for p in &plan.programs {
        assert_eq!(p.gpu_schedule(5), GpuLoopSchedule::Points);
    }
    let (_, plan) = planned(ELEMENTWISE);
    assert!(plan.programs.iter().all(|p| p.gpu_warp_schedule().is_none()));
    // A matmul as a loop program: adjacent threads read B's adjacent columns,
    // a thread per output element (no warp per point).
    let g = ir::parse_graph(
        r#"graph {
  sym n param 1..
  input %a: f32[n, 64]
  input %b: f32[64, 48]
  %c: f32[n, 48] = matmul %a, %b
  output %c
}
"#,
        &|_| None,
    )
    .expect("parses");
    let lo = lower::LowerOptions {
        fuse_attention: false,
        matmul_steps: false,
        column_scales: false,
        epilogue_params: false,
        residual_programs: false,
        u8_codes: false,
        codes_depth: 0,
        interleave: false,
    };
    let plan = lower::lower_with(&g, &passes::fuse(&g), &lo).expect("lowers");
    assert_eq!(plan.programs.len(), 1);
    assert!(plan.programs[0].schedules.row_reduction.is_some());
    assert_eq!(plan.programs[0].gpu_warp_schedule(), None);
}

#[test]
fn library_math_matches_the_interpreter() {
    let shapes: &[&[i64]] = &[&[1], &[7], &[33], &[300], &[1025]];
    check("lm", LIBRARY_MATH, &["n"], shapes, false);
}

/// Math with no GPU form yet is an error naming it, not a call that cannot link.
#[test]
fn math_without_a_gpu_form_is_an_error() {
    let text = r#"graph {
  sym n param 1..
  input %x: f64[n]
  %s: f64[n] = exp %x
  output %s
}
"#;
    let (_, plan) = planned(text);
    let e = program_ir(&plan.programs[0], "exp64").expect_err("f64 exp has no GPU form yet").to_string();
    assert!(e.contains("Exp of F64"), "{e}");
}

/// With `ANYSHAPE_PTXAS` (scripts/test.sh sets it to the PyPI wheel's
/// ptxas), every kernel above assembles for sm_80 and sm_90a with no spill
/// and no warning. Without it the test says so and checks nothing else.
#[test]
fn ptxas_accepts_every_loop_kernel() {
    let ptxas = std::env::var("ANYSHAPE_PTXAS").ok();
    if !kernels::testing::require("ANYSHAPE_REQUIRE_PTXAS", ptxas.is_some(), "ptxas in ANYSHAPE_PTXAS") {
        return;
    }
    let ptxas = ptxas.unwrap_or_default();
    let dir = std::env::temp_dir().join(format!("anyshape-loop-ptx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let mut assembled = 0;
    for (what, text) in [
        ("ew", ELEMENTWISE),
        ("mv", MOVEMENT),
        ("rd", REDUCTIONS),
        ("ty", TYPED_REDUCTIONS),
        ("mb", MAYBE_BROADCAST),
        ("nan", MAX_MIN_NAN),
        ("ps", POOLED_SOFTMAX),
        ("lm", LIBRARY_MATH),
    ] {
        let (_, plan) = planned(text);
        for (i, p) in plan.programs.iter().enumerate() {
            let name = format!("{what}_p{i}");
            let ptx = program_ptx(p, &name).unwrap_or_else(|e| panic!("{name}: {e}"));
            let file = dir.join(format!("{name}.ptx"));
            std::fs::write(&file, &ptx).expect("write");
            for arch in ["sm_80", "sm_90a"] {
                let out = std::process::Command::new(&ptxas)
                    .args(["-v", "-arch", arch])
                    .arg(&file)
                    .arg("-o")
                    .arg(dir.join(format!("{name}.{arch}.cubin")))
                    .output()
                    .expect("ptxas runs");
                let log = String::from_utf8_lossy(&out.stderr).to_string();
                assert!(out.status.success(), "{name} {arch}: {log}\n{ptx}");
                let r =
                    PtxasReport::parse(&log, &name).unwrap_or_else(|e| panic!("{name} {arch}: {e}\n{log}"));
                assert!(r.problems().is_empty(), "{name} {arch}: {:?}", r.problems());
                assembled += 1;
            }
        }
    }
    assert!(assembled >= 14, "{assembled} kernels assembled");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Rows a whole number of quads long (4 adjacent points a thread, or a
/// warp's lane, in 16-byte accesses) and not: loads one element off their
/// vector's alignment (a slice from 1), rows of `m + 1` (aligned only every
/// fourth row), broadcasts, a gather, f32 math by polynomial and by the
/// GPU's scalar forms (lane by lane), integers, bools, f16, and a layer
/// norm whose rows a warp shares where they are long.
const QUADS: &str = r#"graph {
  sym n param 1..
  sym m param 1..
  input %x: f32[n, m+1]
  input %b: f32[m]
  input %table: f32[7, m]
  input %ids: i64[n]
  input %k: i64[n, m]
  input %h: f16[n, m]
  %xs: f32[n, m] = slice[1: 1 step 1] %x
  %xe: f32[n, m] = slice[1: 0 step 1] %x
  %b2: f32[1, m] = reshape %b
  %bb: f32[n, m] = broadcast %b2
  %emb: f32[n, m] = gather[axis=0] %table, %ids
  %s: f32[n, m] = add %xs, %bb
  %t: f32[n, m] = mul %s, %xe
  %u: f32[n, m] = add %t, %emb
  %e: f32[n, m] = exp %u
  %sn: f32[n, m] = sin %xs
  %k2: i64[n, m] = mul %k, %k
  %c: bool[n, m] = less %xs, %bb
  %he: f16[n, m] = tanh %h
  %mean: f32[n, 1] = reduce_mean[axes=[1], keep_dims=true] %u
  %meanb: f32[n, m] = broadcast %mean
  %dev: f32[n, m] = sub %u, %meanb
  %sq: f32[n, m] = mul %dev, %dev
  %var: f32[n, 1] = reduce_mean[axes=[1], keep_dims=true] %sq
  %eps: f32[] = constant 0.00001
  %eps2: f32[1, 1] = reshape %eps
  %epsb: f32[n, 1] = broadcast %eps2
  %ve: f32[n, 1] = add %var, %epsb
  %rs: f32[n, 1] = sqrt %ve
  %inv: f32[n, 1] = reciprocal %rs
  %invb: f32[n, m] = broadcast %inv
  %ln: f32[n, m] = mul %dev, %invb
  output %e, %sn, %k2, %c, %he, %ln
}
"#;

#[test]
fn quads_match_the_interpreter_at_any_row_length() {
    let shapes: &[&[i64]] =
        &[&[1, 1], &[3, 4], &[2, 5], &[5, 32], &[3, 33], &[2, 36], &[4, 128], &[3, 131], &[2, 772], &[1, 3]];
    check("qd", QUADS, &["n", "m"], shapes, false);
}

/// The quads' accesses are 16-byte vector instructions in the PTX (loads
/// where aligned, stores): f32 element-wise programs, the i64 product (two
/// 16-byte halves a quad), and the layer norm's warp-shared reductions.
#[test]
fn quads_take_16_byte_accesses() {
    let (_, plan) = planned(QUADS);
    let wide = |ptx: &str, op: &str, ty: &str| {
        ptx.contains(&format!("{op}.{ty}")) || ptx.contains(&format!("{op}.global.{ty}"))
    };
    let (mut f32s, mut i64s, mut warp_rows) = (0, 0, 0);
    for (i, p) in plan.programs.iter().enumerate() {
        assert!(p.gpu_quads(GpuLoopSchedule::Points).is_some(), "p{i} takes no quads");
        let ptx = program_ptx(p, &format!("qd_p{i}")).expect("PTX");
        if wide(&ptx, "ld", "v4.f32") && wide(&ptx, "st", "v4.f32") {
            f32s += 1;
            if ptx.contains("shfl.sync.bfly") {
                warp_rows += 1;
            }
        }
        if wide(&ptx, "ld", "v2.u64") && wide(&ptx, "st", "v2.u64") {
            i64s += 1;
        }
    }
    assert!(f32s >= 2 && i64s == 1 && warp_rows == 1, "{f32s} f32, {i64s} i64, {warp_rows} warp rows");
}
