//! Contraction operands written in the kernels' element type by their
//! producer (GPU plans). The GPU's tensor-core kernels read A as bf16; an A
//! that a loop program writes as f32 would be copied to bf16 before each
//! product (a launch that reads and writes A again). Instead the program
//! stores `cast<bf16>` of the same value into a second buffer, beside the
//! f32 one that other readers (a residual, a GEMV) keep reading; a
//! contraction's A that another contraction writes in f32 (a residual sum)
//! is stored so by that contraction's epilogue.

use std::collections::{HashMap, HashSet};

use ir::DType;
use plan::{BufId, Buffer, BufferKind, ModelPlan, Param, StepKind, Store};

/// For every contraction step whose A is a temporary that one loop program
/// or one contraction (its epilogue: [`plan::MatMulStep::c_bf16`]) writes
/// (once, with nothing else writing it) and whose rows are contiguous,
/// or a convolution's taps whose channels and strides are multiples of 8
/// ([`taps_aligned`]): a bf16 buffer beside A that the writer also
/// stores, named in the step as [`plan::MatMulStep::a_bf16`]. Steps reading
/// the same A share the buffer; a program shared by other steps that do not
/// need the store is copied. Returns the buffers added.
pub fn bf16_operands(plan: &mut ModelPlan) -> usize {
    // A's buffer → its writer (step, parameter), for each A that qualifies;
    // or the product that writes it.
    let mut mirrored: HashMap<BufId, (usize, usize)> = HashMap::new();
    let mut stored: HashMap<BufId, usize> = HashMap::new();
    for st in &plan.steps {
        let StepKind::MatMul(m) = &st.kind else { continue };
        let unit_columns = slot_const(&plan.dims, m.a.cs) == Some(1);
        let readable = match &m.taps {
            None => unit_columns,
            Some(t) => taps_aligned(plan, t),
        };
        if !readable || mirrored.contains_key(&m.a.buf) || stored.contains_key(&m.a.buf) {
            continue;
        }
        if let Some(w) = loop_writer(plan, m.a.buf) {
            mirrored.insert(m.a.buf, w);
        } else if let Some(w) = product_writer(plan, m.a.buf) {
            stored.insert(m.a.buf, w);
        }
    }
    if mirrored.is_empty() && stored.is_empty() {
        return 0;
    }
    // The loop steps that get a store, by program: a program all of whose
    // steps store the same parameter's copy is changed in place.
    let mut wanted: HashMap<usize, HashSet<(usize, usize)>> = HashMap::new();
    for &(step, param) in mirrored.values() {
        let StepKind::Loop { program, .. } = &plan.steps[step].kind else { continue };
        wanted.entry(*program).or_default().insert((step, param));
    }
    // The steps that run `program` (`None`: a fused attention's, whose
    // arguments must stay as they are).
    let users = |plan: &ModelPlan, program: usize| -> Vec<Option<usize>> {
        (0..plan.steps.len())
            .filter_map(|j| match &plan.steps[j].kind {
                StepKind::Loop { program: p, .. } if *p == program => Some(Some(j)),
                StepKind::Attention(a)
                    if a.softmax == program || a.online.as_ref().is_some_and(|o| o.program == program) =>
                {
                    Some(None)
                }
                _ => None,
            })
            .collect()
    };
    // (program, parameter) → the program that also stores the copy.
    let mut with_copy: HashMap<(usize, usize), usize> = HashMap::new();
    let mut order: Vec<BufId> = mirrored.keys().copied().collect();
    order.sort_unstable();
    let mut copies: HashMap<BufId, BufId> = HashMap::new();
    // A product's copy: stored by its epilogue (`MatMulStep::c_bf16`).
    let mut products: Vec<(BufId, usize)> = stored.into_iter().collect();
    products.sort_unstable();
    for (a, step) in products {
        let b = push_bf16_twin(plan, a);
        copies.insert(a, b);
        if let StepKind::MatMul(m) = &mut plan.steps[step].kind {
            m.c_bf16 = Some(b);
        }
    }
    for a in order {
        let (step, param) = mirrored[&a];
        let StepKind::Loop { program, .. } = &plan.steps[step].kind else { continue };
        let program = *program;
        let target = match with_copy.get(&(program, param)) {
            Some(&t) => t,
            None => {
                let all_alike = users(plan, program)
                    .iter()
                    .all(|j| j.is_some_and(|j| wanted[&program].contains(&(j, param))))
                    && wanted[&program].iter().all(|(_, p)| *p == param);
                let p = with_store(&plan.programs[program], param);
                let t = if all_alike {
                    plan.programs[program] = p;
                    program
                } else {
                    plan.programs.push(p);
                    plan.programs.len() - 1
                };
                with_copy.insert((program, param), t);
                t
            }
        };
        let b = push_bf16_twin(plan, a);
        copies.insert(a, b);
        if let StepKind::Loop { program, args } = &mut plan.steps[step].kind {
            *program = target;
            args.push(b);
        }
    }
    for st in &mut plan.steps {
        if let StepKind::MatMul(m) = &mut st.kind {
            let readable = match &m.taps {
                None => true,
                Some(t) => taps_aligned_in(&plan.dims, t),
            };
            if readable {
                m.a_bf16 = copies.get(&m.a.buf).copied().or(m.a_bf16);
            }
        }
    }
    plan.compute_lifetimes();
    copies.len()
}

/// A new bf16 temporary of buffer `a`'s shape; its index.
fn push_bf16_twin(plan: &mut ModelPlan, a: BufId) -> BufId {
    let src = &plan.buffers[a];
    let copy = Buffer {
        name: format!("{}.bf16", src.name),
        dtype: DType::BF16,
        shape: src.shape.clone(),
        numel: src.numel,
        kind: BufferKind::Temp,
        first: 0,
        last: 0,
    };
    plan.buffers.push(copy);
    plan.buffers.len() - 1
}

/// The contraction step that writes `buf`, when `buf` is an f32 temporary
/// that step alone writes (as its C, in f32: not codes), so that its
/// epilogue can store a bf16 copy beside it.
fn product_writer(plan: &ModelPlan, buf: BufId) -> Option<usize> {
    if !matches!(plan.buffers[buf].kind, BufferKind::Temp) || plan.buffers[buf].dtype != DType::F32 {
        return None;
    }
    let mut writer = None;
    for (j, st) in plan.steps.iter().enumerate() {
        match &st.kind {
            StepKind::MatMul(m) if m.c.buf == buf => {
                if writer.is_some() || m.epilogue.codes || m.c_bf16.is_some() {
                    return None;
                }
                writer = Some(j);
            }
            StepKind::Loop { program, args } => {
                let p = &plan.programs[*program];
                if args.iter().enumerate().any(|(k, &b)| b == buf && p.params[k].written) {
                    return None;
                }
            }
            StepKind::Attention(a) if a.output.c.buf == buf => return None,
            _ => {}
        }
    }
    writer
}

/// The loop step and its parameter that write `buf`, when `buf` is a
/// temporary written by that step alone, in one store, of f32 values.
pub(crate) fn loop_writer(plan: &ModelPlan, buf: BufId) -> Option<(usize, usize)> {
    if !matches!(plan.buffers[buf].kind, BufferKind::Temp) || plan.buffers[buf].dtype != DType::F32 {
        return None;
    }
    let mut writers = Vec::new();
    for (j, st) in plan.steps.iter().enumerate() {
        match &st.kind {
            StepKind::Loop { program, args } => {
                let p = &plan.programs[*program];
                let bound: Vec<usize> = (0..args.len()).filter(|&k| args[k] == buf).collect();
                match bound[..] {
                    [] => {}
                    [k] if p.params[k].written => {
                        if p.stores.iter().filter(|s| s.param as usize == k).count() != 1 {
                            return None;
                        }
                        writers.push((j, k));
                    }
                    [_] => {}
                    // Read and written by one step, or bound twice.
                    _ => return None,
                }
            }
            StepKind::MatMul(m) if m.c.buf == buf => return None,
            StepKind::Attention(a) if a.output.c.buf == buf => return None,
            _ => {}
        }
    }
    match writers[..] {
        [w] => Some(w),
        _ => None,
    }
}

/// `p` with one more parameter, a bf16 buffer of parameter `param`'s shape,
/// and a store of `cast<bf16>` of the value `param` stores (its schedules
/// found again).
fn with_store(p: &plan::LoopProgram, param: usize) -> plan::LoopProgram {
    let mut q = p.clone();
    let src = &p.params[param];
    q.params.push(Param {
        name: format!("{}_bf16", src.name),
        dtype: DType::BF16,
        shape: src.shape.clone(),
        written: true,
    });
    let value = p.stores.iter().find(|s| s.param as usize == param).map(|s| s.value);
    if let Some(value) = value {
        let narrow = q.exprs.cast(value, DType::BF16);
        q.stores.push(Store { param: (q.params.len() - 1) as u32, value: narrow });
    }
    q.name = format!("{}_bf16", p.name);
    crate::schedules::analyze(&mut q);
    q
}

/// For every contraction or fused attention step whose output C is a
/// temporary that only contractions read, each as its A at a view whose rows and start are
/// 16-byte aligned in bf16 (strides and offset multiples of 8 at every shape;
/// a depth of a multiple of 8), or as a convolution's taps whose channels
/// and strides are multiples of 8 ([`taps_aligned`]: the GPU's taps kernels
/// read them in place): C's buffer made bf16, so that the product
/// stores bf16 (its f32 accumulators rounded once, in its epilogue) and its
/// readers' tensor-core kernels read it in place, where an f32 C would be
/// copied to bf16 before each of them. The step's bias, a constant, is
/// given as a bf16 constant (the kernels read a bf16 C's bias in C's type);
/// a step adding a residual keeps f32. Returns the buffers made bf16.
pub fn bf16_products(plan: &mut ModelPlan) -> usize {
    let konst = |plan: &ModelPlan, slot: u32| slot_const(&plan.dims, slot);
    let aligned = |plan: &ModelPlan, slot: u32| multiple_of_8(&plan.dims, slot);
    let mut narrowed = Vec::new();
    for p in 0..plan.steps.len() {
        // The output, and whether the step can store it in bf16.
        let (x, ok) = match &plan.steps[p].kind {
            StepKind::MatMul(m) => {
                let e = &m.epilogue;
                let bias_const = e.bias.is_none_or(|b| {
                    matches!(plan.buffers[b].kind, BufferKind::Constant(_))
                        && plan.buffers[b].dtype == DType::F32
                });
                (m.c.buf, e.residual.is_none() && e.column_scale.is_none() && !e.codes && bias_const)
            }
            // The fused attention's output (its kernel stores either type).
            StepKind::Attention(a) => (a.output.c.buf, true),
            StepKind::Loop { .. } => continue,
        };
        if !ok || !matches!(plan.buffers[x].kind, BufferKind::Temp) || plan.buffers[x].dtype != DType::F32 {
            continue;
        }
        let mut readers = 0;
        let only_products = plan.steps.iter().enumerate().all(|(j, st)| {
            if j == p || !st.kind.touched().contains(&x) {
                return true;
            }
            let StepKind::MatMul(r) = &st.kind else { return false };
            readers += 1;
            let view = match &r.taps {
                None => konst(plan, r.a.cs) == Some(1) && aligned(plan, r.a.rs),
                Some(t) => taps_aligned(plan, t),
            };
            r.a.buf == x
                && r.b.buf != x
                && r.c.buf != x
                && r.a_bf16.is_none()
                && !r.epilogue.buffers().any(|b| b == x)
                && view
                && aligned(plan, r.a.offset)
                && aligned(plan, r.k)
                && r.a.batch.iter().all(|s| aligned(plan, *s))
        });
        if only_products && readers > 0 {
            narrowed.push(p);
        }
    }
    let mut bf16_of: HashMap<BufId, BufId> = HashMap::new();
    let mut count = 0;
    for &p in &narrowed {
        let (x, bias) = match &plan.steps[p].kind {
            StepKind::MatMul(m) => (m.c.buf, m.epilogue.bias),
            StepKind::Attention(a) => (a.output.c.buf, None),
            StepKind::Loop { .. } => continue,
        };
        // The bias in bf16 first: a step whose bias cannot be made so keeps f32.
        let nb = match bias {
            None => None,
            Some(b) => match bf16_of.get(&b) {
                Some(&nb) => Some(nb),
                None => {
                    let Some(copy) = bf16_constant(&plan.buffers[b]) else { continue };
                    plan.buffers.push(copy);
                    bf16_of.insert(b, plan.buffers.len() - 1);
                    Some(plan.buffers.len() - 1)
                }
            },
        };
        plan.buffers[x].dtype = DType::BF16;
        if let StepKind::MatMul(m) = &mut plan.steps[p].kind {
            m.epilogue.bias = nb;
        }
        count += 1;
    }
    if count > 0 {
        plan.compute_lifetimes();
    }
    count
}

/// Whether a convolution's taps can be read from a bf16 image 16 bytes at a
/// time (the GPU's taps kernels, `GemmKernel::a_taps`): its channels and
/// the image's strides are multiples of 8 (each 16-byte chunk 8 channels of
/// one tap, every pixel's start aligned).
fn taps_aligned(plan: &ModelPlan, t: &plan::Taps) -> bool {
    taps_aligned_in(&plan.dims, t)
}

fn taps_aligned_in(dims: &plan::DimTable, t: &plan::Taps) -> bool {
    multiple_of_8(dims, t.image[3]) && t.strides.iter().all(|&s| multiple_of_8(dims, s))
}

/// Dim slot `slot`'s value where it is a constant.
pub(crate) fn slot_const(dims: &plan::DimTable, slot: u32) -> Option<i64> {
    dims.exprs().get(slot as usize).and_then(|e| e.as_const())
}

/// Whether dim slot `slot` is a multiple of 8 at every shape (a constant,
/// or an expression such as `64·w`).
fn multiple_of_8(dims: &plan::DimTable, slot: u32) -> bool {
    dims.exprs().get(slot as usize).is_some_and(|e| e.try_rem(8).ok().and_then(|r| r.as_const()) == Some(0))
}

/// A constant's values rounded to bf16, as a constant buffer of its shape.
fn bf16_constant(src: &Buffer) -> Option<Buffer> {
    let BufferKind::Constant(c) = &src.kind else { return None };
    let t = c.to_tensor();
    let bits: Vec<u16> = t.to_f64_vec().iter().map(|v| ir::f32_to_bf16(*v as f32)).collect();
    let t = ir::Tensor::new(t.shape().to_vec(), ir::Elems::BF16(bits)).ok()?;
    Some(Buffer {
        name: format!("{}.bf16", src.name),
        dtype: DType::BF16,
        shape: src.shape.clone(),
        numel: src.numel,
        kind: BufferKind::Constant(std::sync::Arc::new(ir::ConstData::from_tensor(&t))),
        first: 0,
        last: 0,
    })
}
