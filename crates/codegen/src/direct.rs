//! Direct micro-kernels (the ABI of `kernels::direct`): an `MR × NR` tile of C
//! from A and B where they lie. Per K step: `NR / W` vector loads of one row of B
//! (masked past `ncols` in the partial panel's version of the loop, plain in the
//! full panel's), one broadcast per row of A (row stride `lda`), and
//! `MR · NR / W` fused multiply-adds; C's loads and stores, the bias and the
//! residual are masked the same way, so no edge needs padding or a scratch tile.
//!
//! A u8s8 kernel steps over 32-bit words instead: A's word is four depths'
//! 8-bit codes as they lie in memory (an activation of codes read in place),
//! B's a packed weight's four signed bytes of a column, one `vpdpbusd` per
//! row and vector into i32 sums, converted to f32 for the epilogue, which may
//! store codes (a byte per element, masked as the floats are).

use inkwell::attributes::AttributeLoc;
use inkwell::context::Context;
use inkwell::intrinsics::Intrinsic;
use inkwell::module::Module;
use inkwell::types::VectorType;
use inkwell::values::{
    BasicMetadataValueEnum, BasicValueEnum, FunctionValue, IntValue, PointerValue, VectorValue,
};
use inkwell::{AddressSpace, IntPredicate};
use kernels::{DirectKernel, DirectKernelFn, ElemType, Target};
use plan::Epilogue;

use crate::{
    jit_function, llvm, target_attributes, vmath, vpdpbusd, CodegenError, JitDirectKernel, JitKernel,
    ObjectCache,
};

/// Compile an `mr × nr` direct f32 micro-kernel for `t` (`nr` a multiple of its
/// lanes) with `epilogue` applied when the driver asks for it.
pub fn compile_direct_kernel(
    t: &Target,
    mr: usize,
    nr: usize,
    epilogue: Epilogue,
) -> Result<JitDirectKernel, CodegenError> {
    compile_direct_kernel_cached(t, ElemType::F32, mr, nr, epilogue, &ObjectCache::none())
}

/// [`compile_direct_kernel`] multiplying `elem` (f32, or u8s8 words), through
/// `cache`. A u8s8 kernel whose epilogue stores codes always applies it.
pub fn compile_direct_kernel_cached(
    t: &Target,
    elem: ElemType,
    mr: usize,
    nr: usize,
    epilogue: Epilogue,
    cache: &ObjectCache,
) -> Result<JitDirectKernel, CodegenError> {
    let w = crate::check_tile(t, mr, nr)?;
    if !matches!(elem, ElemType::F32 | ElemType::U8S8) {
        return Err(CodegenError::Unsupported(format!("direct kernels multiply f32 or u8s8, not {elem}")));
    }
    t.check_elem(elem).map_err(|e| CodegenError::Unsupported(e.to_string()))?;
    if epilogue.codes && elem != ElemType::U8S8 {
        return Err(CodegenError::Unsupported("direct f32 kernels store floats, not codes".into()));
    }
    let name = format!(
        "direct_{}_{mr}x{nr}{}",
        if elem == ElemType::U8S8 { "u8s8" } else { "f32" },
        match (epilogue.is_identity(), epilogue.codes) {
            (true, _) => "",
            (false, false) => "_epilogue",
            (false, true) => "_codes",
        }
    );
    let jit = jit_function(t, &name, cache, |ctx, module, cpu, features| {
        build_direct(ctx, module, &name, (elem, mr, nr, w), &epilogue, cpu, features)
    })?;
    // SAFETY: `name` was just generated with exactly the `DirectKernelFn` signature
    // and the C calling convention; its image lives in the returned value.
    let func: DirectKernelFn = unsafe { jit.image.entry(&name) }.map_err(|e| llvm(e.to_string()))?;
    Ok(JitKernel {
        kernel: DirectKernel { mr, nr, elem, func, epilogue, packers: Default::default() },
        ir: jit.ir,
        _image: jit.image,
    })
}

/// The intrinsics the kernel calls: the multiply-add (`fma` on f32 lanes,
/// `vpdpbusd` on i32 ones), masked loads of f32 and of the accumulator's
/// lanes (B's words), masked stores of f32 and of bytes (codes).
struct Intrinsics {
    mul: FunctionValue<'static>,
    load: FunctionValue<'static>,
    load_b: FunctionValue<'static>,
    store: FunctionValue<'static>,
    store_bytes: FunctionValue<'static>,
    load_bytes: FunctionValue<'static>,
}

#[allow(clippy::too_many_arguments)]
fn build_direct(
    ctx: &'static Context,
    module: &Module<'static>,
    name: &str,
    (elem, mr, nr, w): (ElemType, usize, usize, usize),
    epilogue: &Epilogue,
    cpu: &str,
    features: &str,
) -> Result<(), CodegenError> {
    let (f32t, i64t, i32t) = (ctx.f32_type(), ctx.i64_type(), ctx.i32_type());
    let ptr = ctx.ptr_type(AddressSpace::default());
    let vt = f32t.vec_type(w as u32);
    // The accumulators' and B's vectors: f32, or u8s8's i32 lanes.
    let integer = elem == ElemType::U8S8;
    let acc_t = crate::accumulator_type(ctx, elem, w);
    let codes = epilogue.codes;
    let nv = nr / w;
    let params = [
        i64t.into(), // kc
        ptr.into(),  // a
        i64t.into(), // lda
        ptr.into(),  // b
        i64t.into(), // ldb
        ptr.into(),  // c
        i64t.into(), // ldc
        i64t.into(), // ncols
        i64t.into(), // flags
        ptr.into(),  // bias
        ptr.into(),  // res
        i64t.into(), // ldr
        i64t.into(), // runs
        i64t.into(), // a_run
        i64t.into(), // b_run
        ptr.into(),  // next
        i64t.into(), // lines
        ptr.into(),  // column scales
        ptr.into(),  // the epilogue program's parameters
    ];
    let f = module.add_function(name, ctx.void_type().fn_type(&params, false), None);
    target_attributes(ctx, f, cpu, features, w);
    let noalias =
        ctx.create_enum_attribute(inkwell::attributes::Attribute::get_named_enum_kind_id("noalias"), 0);
    for i in [1, 3, 5] {
        f.add_attribute(AttributeLoc::Param(i), noalias);
    }
    let p = |i: u32| f.get_nth_param(i).ok_or_else(|| llvm("param"));
    let (kc, a, lda) = (p(0)?.into_int_value(), p(1)?.into_pointer_value(), p(2)?.into_int_value());
    let (b, ldb, c) = (p(3)?.into_pointer_value(), p(4)?.into_int_value(), p(5)?.into_pointer_value());
    let (ldc, ncols, flags) = (p(6)?.into_int_value(), p(7)?.into_int_value(), p(8)?.into_int_value());
    let (bias, res, ldr) = (p(9)?.into_pointer_value(), p(10)?.into_pointer_value(), p(11)?.into_int_value());
    let (runs, a_run, b_run) = (p(12)?.into_int_value(), p(13)?.into_int_value(), p(14)?.into_int_value());
    let (next_b, pf_lines) = (p(15)?.into_pointer_value(), p(16)?.into_int_value());
    let (cscale, params) = (p(17)?.into_pointer_value(), p(18)?.into_pointer_value());

    let intr = |n: &str, tys: &[inkwell::types::BasicTypeEnum<'static>]| {
        Intrinsic::find(n)
            .and_then(|i| i.get_declaration(module, tys))
            .ok_or_else(|| llvm(format!("no {n} for the vector type")))
    };
    let bytes_t = ctx.i8_type().vec_type(w as u32);
    let ii = Intrinsics {
        mul: match integer {
            true => vpdpbusd(ctx, module, w),
            false => intr("llvm.fma", &[vt.into()])?,
        },
        load: intr("llvm.masked.load", &[vt.into(), ptr.into()])?,
        load_b: intr("llvm.masked.load", &[acc_t.into(), ptr.into()])?,
        store: intr("llvm.masked.store", &[vt.into(), ptr.into()])?,
        store_bytes: intr("llvm.masked.store", &[bytes_t.into(), ptr.into()])?,
        load_bytes: intr("llvm.masked.load", &[bytes_t.into(), ptr.into()])?,
    };

    let bld = ctx.create_builder();
    let entry = ctx.append_basic_block(f, "entry");
    let done = ctx.append_basic_block(f, "k.done");
    let add_c = ctx.append_basic_block(f, "c.add");
    let set_c = ctx.append_basic_block(f, "c.set");
    let merge = ctx.append_basic_block(f, "c.merge");
    let epi = ctx.append_basic_block(f, "store.epilogue");
    let plain = ctx.append_basic_block(f, "store.plain");
    let exit = ctx.append_basic_block(f, "exit");
    let c_i64 = |v: usize| i64t.const_int(v as u64, false);
    let gep = |base, idx: IntValue<'static>, n: &str| {
        // SAFETY (of the IR, not of Rust): every address is inside the rows and the
        // unmasked columns the ABI promises; the builder only records it.
        unsafe { bld.build_in_bounds_gep(f32t, base, &[idx], n) }.map_err(llvm)
    };
    let call = |fv: FunctionValue<'static>, args: &[BasicMetadataValueEnum<'static>]| {
        bld.build_call(fv, args, "").map_err(llvm).map(|r| match r.try_as_basic_value() {
            inkwell::values::ValueKind::Basic(v) => Some(v),
            inkwell::values::ValueKind::Instruction(_) => None,
        })
    };
    let align = i32t.const_int(4, false);
    // A masked load by `load` (f32 lanes, or the accumulator's), zero where masked off.
    let masked = |load: FunctionValue<'static>,
                  ty: VectorType<'static>,
                  p: PointerValue<'static>,
                  mask: VectorValue<'static>|
     -> Result<VectorValue<'static>, CodegenError> {
        call(load, &[p.into(), align.into(), mask.into(), ty.const_zero().into()])?
            .map(BasicValueEnum::into_vector_value)
            .ok_or_else(|| llvm("masked.load returned nothing"))
    };
    let masked_load = |p, mask| masked(ii.load, vt, p, mask);
    // B's vector at `p`: f32 lanes, or the i32 lanes of u8s8's words.
    let load_b = |p, mask| masked(ii.load_b, acc_t, p, mask);
    let masked_store = |v: VectorValue<'static>, p: PointerValue<'static>, mask: VectorValue<'static>| {
        let store = if v.get_type() == bytes_t { ii.store_bytes } else { ii.store };
        let align = if v.get_type() == bytes_t { i32t.const_int(1, false) } else { align };
        call(store, &[v.into(), p.into(), align.into(), mask.into()]).map(|_| ())
    };

    // entry: the column masks (lane j of vector v is live when v·W + j < ncols) and
    // the rows' offsets into A.
    bld.position_at_end(entry);
    let lanes_t = i32t.vec_type(w as u32);
    let n32 = bld.build_int_truncate(ncols, i32t, "n32").map_err(llvm)?;
    let one = bld.build_insert_element(lanes_t.get_poison(), n32, i32t.const_zero(), "n1").map_err(llvm)?;
    let nsplat =
        bld.build_shuffle_vector(one, lanes_t.get_poison(), lanes_t.const_zero(), "ns").map_err(llvm)?;
    let mut masks = Vec::with_capacity(nv);
    for v in 0..nv {
        let iota: Vec<_> = (0..w).map(|j| i32t.const_int((v * w + j) as u64, false)).collect();
        let iota = VectorType::const_vector(&iota);
        masks.push(bld.build_int_compare(IntPredicate::SLT, iota, nsplat, "mask").map_err(llvm)?);
    }
    // The lines to ask for (see `DirectKernelFn`): whether any, and the last one.
    let has_pf = bld.build_int_compare(IntPredicate::SGT, pf_lines, c_i64(0), "has.pf").map_err(llvm)?;
    let pf_last = bld.build_int_sub(pf_lines, c_i64(1), "pf.last").map_err(llvm)?;
    let regs = regs_of(w);
    let mut rows = Vec::with_capacity(mr);
    for i in 0..mr {
        rows.push(bld.build_int_mul(c_i64(i), lda, "arow").map_err(llvm)?);
    }
    // Two versions of the K loop (multi-versioning, BladeDISC §5.2.1): a full
    // panel loads B without masks (a masked load is never folded into the FMAs'
    // operands and costs about 3% at 8x32), a partial one with the column masks.
    let all = VectorType::const_vector(&vec![ctx.bool_type().const_int(1, false); w]);
    let full_masks = vec![all; nv];
    let full = bld.build_int_compare(IntPredicate::SGE, ncols, c_i64(nr), "full").map_err(llvm)?;
    let full_loop = ctx.append_basic_block(f, "k.full");
    let part_loop = ctx.append_basic_block(f, "k.part");
    bld.build_conditional_branch(full, full_loop, part_loop).map_err(llvm)?;

    // The K loop, in two parts: a main loop of `sets` steps per iteration, step `s`
    // into accumulator set `s` (independent FMA chains, so that a low tile still
    // fills both FMA pipes through their latency), and a tail of single steps into
    // set 0; the sets are summed at the end.
    let step = |(a, b): (PointerValue<'static>, PointerValue<'static>),
                k: IntValue<'static>,
                accs: &[BasicValueEnum<'static>],
                masks: &[VectorValue<'static>]|
     -> Result<Vec<BasicValueEnum<'static>>, CodegenError> {
        let kb = bld.build_int_mul(k, ldb, "kb").map_err(llvm)?;
        let mut bvecs = Vec::with_capacity(nv);
        for (v, mask) in masks.iter().enumerate() {
            let idx = bld.build_int_add(kb, c_i64(v * w), "bi").map_err(llvm)?;
            bvecs.push(load_b(gep(b, idx, "bp")?, *mask)?);
        }
        let mut next = Vec::with_capacity(mr * nv);
        // A's element (a word of four codes for u8s8), broadcast.
        let a_elem: inkwell::types::BasicTypeEnum = if integer { i32t.into() } else { f32t.into() };
        for (i, row) in rows.iter().enumerate() {
            let idx = bld.build_int_add(*row, k, "ai").map_err(llvm)?;
            let s = bld.build_load(a_elem, gep(a, idx, "ap")?, "a").map_err(llvm)?;
            let one =
                bld.build_insert_element(acc_t.get_poison(), s, i32t.const_zero(), "a1").map_err(llvm)?;
            let splat = bld
                .build_shuffle_vector(one, acc_t.get_poison(), lanes_t.const_zero(), "abc")
                .map_err(llvm)?;
            for (v, bv) in bvecs.iter().enumerate() {
                let acc = accs[i * nv + v];
                let args: [BasicMetadataValueEnum<'static>; 3] = match integer {
                    true => [acc.into(), splat.into(), (*bv).into()],
                    false => [splat.into(), (*bv).into(), acc.into()],
                };
                let r = call(ii.mul, &args)?;
                next.push(r.ok_or_else(|| llvm("the multiply-add returned nothing"))?);
            }
        }
        Ok(next)
    };
    let sets = accumulator_sets(mr * nv, nv, regs);
    // One version of the loop from `start`: its blocks, and the tile's sums at its exit.
    let k_loop = |start: inkwell::basic_block::BasicBlock<'static>,
                  masks: &[VectorValue<'static>],
                  tag: &str|
     -> Result<
        (inkwell::basic_block::BasicBlock<'static>, Vec<VectorValue<'static>>),
        CodegenError,
    > {
        let run_header = ctx.append_basic_block(f, &format!("run.header.{tag}"));
        let header = ctx.append_basic_block(f, &format!("k.header.{tag}"));
        let body = ctx.append_basic_block(f, &format!("k.body.{tag}"));
        let tail_header = ctx.append_basic_block(f, &format!("k.tail.header.{tag}"));
        let tail_body = ctx.append_basic_block(f, &format!("k.tail.body.{tag}"));
        let out = ctx.append_basic_block(f, &format!("k.out.{tag}"));
        bld.position_at_end(start);
        bld.build_unconditional_branch(run_header).map_err(llvm)?;
        // run.header: the run, where its A and B start, and the tile's sums so far.
        bld.position_at_end(run_header);
        let r_phi = bld.build_phi(i64t, "run").map_err(llvm)?;
        let ap_phi = bld.build_phi(ptr, "a.run").map_err(llvm)?;
        let bp_phi = bld.build_phi(ptr, "b.run").map_err(llvm)?;
        let mut carry = Vec::with_capacity(mr * nv);
        for i in 0..mr * nv {
            carry.push(bld.build_phi(acc_t, &format!("carry{i}")).map_err(llvm)?);
        }
        let bases =
            (ap_phi.as_basic_value().into_pointer_value(), bp_phi.as_basic_value().into_pointer_value());
        bld.build_unconditional_branch(header).map_err(llvm)?;
        // k.header: k and every set's accumulators (set 0 starts from the run's carry).
        bld.position_at_end(header);
        let k_phi = bld.build_phi(i64t, "k").map_err(llvm)?;
        let mut acc_phis = Vec::with_capacity(sets * mr * nv);
        for i in 0..sets * mr * nv {
            acc_phis.push(bld.build_phi(acc_t, &format!("acc{i}")).map_err(llvm)?);
        }
        let k = k_phi.as_basic_value().into_int_value();
        let k_end = bld.build_int_add(k, c_i64(sets), "k.end").map_err(llvm)?;
        let more = bld.build_int_compare(IntPredicate::SLE, k_end, kc, "more").map_err(llvm)?;
        bld.build_conditional_branch(more, body, tail_header).map_err(llvm)?;
        // k.body: the lines asked for while these steps read B (NR/16 a step, the
        // last line again past the count), then `sets` steps.
        bld.position_at_end(body);
        let body_pf = ctx.append_basic_block(f, &format!("k.prefetch.{tag}"));
        let body_main = ctx.append_basic_block(f, &format!("k.main.{tag}"));
        bld.build_conditional_branch(has_pf, body_pf, body_main).map_err(llvm)?;
        bld.position_at_end(body_pf);
        let per_k = (nr / 16).max(1);
        let first_line = bld.build_int_mul(k, c_i64(per_k), "pf.first").map_err(llvm)?;
        for u in 0..sets * per_k {
            let l = bld.build_int_add(first_line, c_i64(u), "pf.l").map_err(llvm)?;
            let inside = bld.build_int_compare(IntPredicate::SLT, l, pf_lines, "pf.in").map_err(llvm)?;
            let l = bld.build_select(inside, l, pf_last, "pf.line").map_err(llvm)?.into_int_value();
            let off = bld.build_int_mul(l, c_i64(16), "pf.off").map_err(llvm)?;
            // SAFETY (of the IR): a prefetch never faults; the address is only a hint.
            let at = unsafe { bld.build_gep(f32t, next_b, &[off], "pf.at") }.map_err(llvm)?;
            crate::prefetch_to_l2(ctx, module, &bld, at.into())?;
        }
        bld.build_unconditional_branch(body_main).map_err(llvm)?;
        bld.position_at_end(body_main);
        let mut next = Vec::with_capacity(sets * mr * nv);
        for set in 0..sets {
            let ks = bld.build_int_add(k, c_i64(set), "ks").map_err(llvm)?;
            let accs: Vec<_> =
                acc_phis[set * mr * nv..(set + 1) * mr * nv].iter().map(|p| p.as_basic_value()).collect();
            next.extend(step(bases, ks, &accs, masks)?);
        }
        bld.build_unconditional_branch(header).map_err(llvm)?;
        k_phi.add_incoming(&[(&c_i64(0), run_header), (&k_end, body_main)]);
        for (x, (phi, nx)) in acc_phis.iter().zip(&next).enumerate() {
            let init = if x < mr * nv { carry[x].as_basic_value() } else { acc_t.const_zero().into() };
            phi.add_incoming(&[(&init, run_header), (nx, body_main)]);
        }
        // k.tail: the last steps, one at a time, into set 0.
        bld.position_at_end(tail_header);
        let kt_phi = bld.build_phi(i64t, "kt").map_err(llvm)?;
        let mut tail_phis = Vec::with_capacity(mr * nv);
        for i in 0..mr * nv {
            tail_phis.push(bld.build_phi(acc_t, &format!("tacc{i}")).map_err(llvm)?);
        }
        let kt = kt_phi.as_basic_value().into_int_value();
        let more = bld.build_int_compare(IntPredicate::SLT, kt, kc, "tmore").map_err(llvm)?;
        bld.build_conditional_branch(more, tail_body, out).map_err(llvm)?;
        bld.position_at_end(tail_body);
        let accs: Vec<_> = tail_phis.iter().map(|p| p.as_basic_value()).collect();
        let tail_next = step(bases, kt, &accs, masks)?;
        let kt_next = bld.build_int_add(kt, c_i64(1), "kt.next").map_err(llvm)?;
        bld.build_unconditional_branch(tail_header).map_err(llvm)?;
        kt_phi.add_incoming(&[(&k, header), (&kt_next, tail_body)]);
        for (x, phi) in tail_phis.iter().enumerate() {
            phi.add_incoming(&[(&acc_phis[x].as_basic_value(), header), (&tail_next[x], tail_body)]);
        }
        // k.out: the sets summed; the next run, or the tile is done.
        bld.position_at_end(out);
        let mut sums = Vec::with_capacity(mr * nv);
        for x in 0..mr * nv {
            let mut acc = tail_phis[x].as_basic_value().into_vector_value();
            for set in 1..sets {
                let other = acc_phis[set * mr * nv + x].as_basic_value().into_vector_value();
                acc = match integer {
                    true => bld.build_int_add(acc, other, "sets").map_err(llvm)?,
                    false => bld.build_float_add(acc, other, "sets").map_err(llvm)?,
                };
            }
            sums.push(acc);
        }
        let r_next =
            bld.build_int_add(r_phi.as_basic_value().into_int_value(), c_i64(1), "run.next").map_err(llvm)?;
        // Plain (not in-bounds) steps: past the last run the pointers are not used.
        // SAFETY (of the IR): as above; the builder only records the address.
        let a_next = unsafe { bld.build_gep(f32t, bases.0, &[a_run], "a.next") }.map_err(llvm)?;
        let b_next = unsafe { bld.build_gep(f32t, bases.1, &[b_run], "b.next") }.map_err(llvm)?;
        let again = bld.build_int_compare(IntPredicate::SLT, r_next, runs, "run.again").map_err(llvm)?;
        bld.build_conditional_branch(again, run_header, done).map_err(llvm)?;
        r_phi.add_incoming(&[(&c_i64(0), start), (&r_next, out)]);
        ap_phi.add_incoming(&[(&a, start), (&a_next, out)]);
        bp_phi.add_incoming(&[(&b, start), (&b_next, out)]);
        for (x, phi) in carry.iter().enumerate() {
            phi.add_incoming(&[(&acc_t.const_zero(), start), (&sums[x], out)]);
        }
        Ok((out, sums))
    };
    let (full_out, full_sums) = k_loop(full_loop, &full_masks, "full")?;
    let (part_out, part_sums) = k_loop(part_loop, &masks, "part")?;

    // k.done: add C when accumulating (a branch, not an empty mask: a load of C
    // with no live lane still fetches C's lines, and a tile whose C is not in cache
    // then waits on memory before its store; on Zen 5 that doubled the time of
    // ResNet-50's K = 64 layers), then the epilogue when compiled in and asked
    // for, then the masked store.
    bld.position_at_end(done);
    // The tile's sums from whichever version ran (phis first in the block).
    let mut tile = Vec::with_capacity(mr * nv);
    for x in 0..mr * nv {
        let phi = bld.build_phi(acc_t, &format!("tile{x}")).map_err(llvm)?;
        phi.add_incoming(&[(&full_sums[x], full_out), (&part_sums[x], part_out)]);
        tile.push(phi.as_basic_value().into_vector_value());
    }
    // u8s8's i32 sums as f32 (exact below 2^24).
    if integer {
        for x in tile.iter_mut() {
            *x = bld.build_signed_int_to_float(*x, vt, "acc.f32").map_err(llvm)?;
        }
    }
    let bit = |b: i64, n: &str| -> Result<_, CodegenError> {
        let masked = bld.build_and(flags, c_i64(b as usize), n).map_err(llvm)?;
        bld.build_int_compare(IntPredicate::NE, masked, c_i64(0), n).map_err(llvm)
    };
    // A tile of codes is never added to (its product is one K block) and
    // always ends in the epilogue, whose values it stores a byte each.
    if codes {
        bld.build_unconditional_branch(set_c).map_err(llvm)?;
    } else {
        let add = bit(kernels::ACCUMULATE, "add")?;
        bld.build_conditional_branch(add, add_c, set_c).map_err(llvm)?;
    }
    let c_ptr = |i: usize, v: usize| -> Result<_, CodegenError> {
        let row = bld.build_int_mul(c_i64(i), ldc, "row").map_err(llvm)?;
        let idx = bld.build_int_add(row, c_i64(v * w), "ci").map_err(llvm)?;
        match codes {
            // SAFETY (of the IR): as `gep`, in the tile of bytes the ABI promises.
            true => unsafe { bld.build_in_bounds_gep(ctx.i8_type(), c, &[idx], "cp") }.map_err(llvm),
            false => gep(c, idx, "cp"),
        }
    };
    bld.position_at_end(add_c);
    let mut summed = Vec::with_capacity(mr * nv);
    for i in 0..mr {
        for (v, mask) in masks.iter().enumerate() {
            let old = masked_load(c_ptr(i, v)?, *mask)?;
            summed.push(bld.build_float_add(tile[i * nv + v], old, "sum").map_err(llvm)?);
        }
    }
    let vals = crate::join_tile(&bld, vt, (add_c, &summed), (set_c, &tile), merge)?;
    if epilogue.is_identity() {
        bld.build_unconditional_branch(plain).map_err(llvm)?;
    } else if codes {
        bld.build_unconditional_branch(epi).map_err(llvm)?;
    } else {
        let apply = bit(kernels::APPLY_EPILOGUE, "apply")?;
        bld.build_conditional_branch(apply, epi, plain).map_err(llvm)?;
    }
    let store = |vals: &[VectorValue<'static>]| -> Result<(), CodegenError> {
        for i in 0..mr {
            for (v, mask) in masks.iter().enumerate() {
                masked_store(vals[i * nv + v], c_ptr(i, v)?, *mask)?;
            }
        }
        Ok(())
    };
    bld.position_at_end(plain);
    store(&vals)?;
    bld.build_unconditional_branch(exit).map_err(llvm)?;
    // y = act(scale · acc + bias[col] + residual[row, col])
    bld.position_at_end(epi);
    let vm = vmath::VMath::new(ctx, module, &bld, vt, w, features);
    let mut out = vals.clone();
    for i in 0..mr {
        for (v, mask) in masks.iter().enumerate() {
            let load = |base, idx, bytes: bool| match bytes {
                // SAFETY (of the IR): as `gep`, in the residual's rows of bytes.
                true => masked(
                    ii.load_bytes,
                    bytes_t,
                    unsafe { bld.build_in_bounds_gep(ctx.i8_type(), base, &[idx], "ep") }.map_err(llvm)?,
                    *mask,
                ),
                false => masked_load(gep(base, idx, "ep")?, *mask),
            };
            let ptrs = (cscale, bias, res, ldr, params);
            match codes {
                true => {
                    let b = vm.epilogue_codes(epilogue, out[i * nv + v], ptrs, (i, v * w), &load)?;
                    masked_store(b, c_ptr(i, v)?, *mask)?;
                }
                false => out[i * nv + v] = vm.epilogue(epilogue, out[i * nv + v], ptrs, (i, v * w), &load)?,
            }
        }
    }
    if !codes {
        store(&out)?;
    }
    bld.build_unconditional_branch(exit).map_err(llvm)?;
    bld.position_at_end(exit);
    bld.build_return(None).map_err(llvm)?;
    Ok(())
}

/// Vector registers of the ISA with `w` f32 lanes (AVX-512: 32, AVX2: 16).
fn regs_of(w: usize) -> usize {
    if w >= 16 {
        32
    } else {
        16
    }
}

/// How many accumulator sets a tile of `accs` vector accumulators needs so that at
/// least 8 FMA chains are in flight (two FMA pipes × a latency of 4), within the
/// register file (`nv` B vectors and a broadcast stay live too).
pub(crate) fn accumulator_sets(accs: usize, nv: usize, regs: usize) -> usize {
    let mut sets = 8usize.div_ceil(accs.max(1));
    while sets > 1 && sets * accs + nv + 1 > regs {
        sets -= 1;
    }
    sets
}

/// GFLOP/s of one direct kernel called repeatedly on operands that stay in L1: A
/// with rows `kc` apart, B row-major `NR` wide (full tiles, so no lane is masked).
/// A u8s8 kernel's steps are words of four depths each (operations counted as
/// an f32 kernel's: two a multiply-add). Kernels with no epilogue only.
pub fn time_direct_kernel(uk: &DirectKernel, t: &Target) -> f64 {
    let kc = (t.l1d / 4 / ((uk.mr + uk.nr) * 4)).clamp(16, 512);
    let depths = if uk.elem == ElemType::U8S8 { 4 } else { 1 };
    let a = vec![0.5f32; kc * uk.mr];
    let b = vec![0.25f32; kc * uk.nr];
    let mut c = vec![0.0f32; uk.mr * uk.nr];
    let call = |n: usize| {
        for _ in 0..n {
            // SAFETY: A holds MR rows of `kc` (lda = kc), B `kc` rows of NR (ldb = NR), C a
            // full MR × NR tile (ldc = NR), and ncols = NR: what the ABI lets the kernel touch.
            unsafe {
                (uk.func)(
                    kc as i64,
                    a.as_ptr(),
                    kc as i64,
                    b.as_ptr(),
                    uk.nr as i64,
                    c.as_mut_ptr(),
                    uk.nr as i64,
                    uk.nr as i64,
                    kernels::ACCUMULATE,
                    std::ptr::null(),
                    std::ptr::null(),
                    0,
                    1,
                    0,
                    0,
                    std::ptr::null(),
                    0,
                    std::ptr::null(),
                    std::ptr::null(),
                )
            };
        }
    };
    crate::gflops_of_calls(2 * uk.mr * uk.nr * kc * depths, call)
}
