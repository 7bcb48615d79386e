//! The u8s8 and bf16 micro-kernels on AMX tiles: the whole 64-byte steps of
//! K of an `MR × NR` tile multiplied in tile registers (`tdpbusd`: 16 rows of
//! A's bytes by 16 words of four depths of 16 columns of B, into 16 × 16 i32;
//! `tdpbf16ps`: words of two bf16 depths, into f32), the sums then stored to
//! a scratch tile; then row by row, the rest of K in vectors (`vpdpbusd`,
//! `vdpbf16ps`), the conversion to f32, C added when accumulating, the
//! epilogue and the store, as the vector kernels do (with only a row's
//! vectors live). The next tile's steps are issued before this tile's rows,
//! into a second scratch tile, so that the tile unit works while the vector
//! units store.
//!
//! `inkwell` has no `x86_amx` type, so the tile loop is written as LLVM IR
//! text, parsed into the kernel's context, linked into its module and inlined
//! (LLVM configures the tiles: `ldtilecfg` from the shapes, all constant).
//! A's panel is laid out row by row (`[MR][words]`): tile rows load a row's
//! 64 bytes of K. B's panel is the vector kernel's (`[words][NR]`): a tile's
//! 16 rows are 16 words of K, each 16 columns' 4 depths.

use std::fmt::Write;

use inkwell::context::Context;
use inkwell::memory_buffer::MemoryBuffer;
use inkwell::module::Module;
use inkwell::values::{BasicValueEnum, FunctionValue, IntValue, PointerValue, VectorValue};
use inkwell::{AddressSpace, IntPredicate};

use crate::{code_bytes, features_for, llvm, set_align, vmath, vpdpbusd, CodegenError};
use kernels::{ElemType, AMX_ROWS, AMX_TILE_REGISTERS};
use plan::Epilogue;

/// The tile product of `elem` (u8s8 or bf16).
fn tile_product(elem: ElemType) -> &'static str {
    match elem {
        ElemType::Bf16 => "tdpbf16ps",
        _ => "tdpbusd",
    }
}

/// The IR of `@name(ptr a, i64 lda, ptr b, i64 steps, ptr c)`: `c` (`mr × nr`
/// 32-bit sums, row stride `nr` values) = the product of A's `mr` rows (`lda`
/// bytes apart) and B's panel (`nr` words a row), over `steps` steps of 16
/// words, in `elem`.
fn tile_loop_ir(name: &str, elem: ElemType, mr: usize, nr: usize, features: &str) -> String {
    let op = tile_product(elem);
    let (tm, tn) = (mr / AMX_ROWS, nr / AMX_ROWS);
    let row_bytes = nr * 4;
    let mut s = String::new();
    let tiles = |s: &mut String, f: &dyn Fn(&mut String, usize, usize)| {
        for i in 0..tm {
            for j in 0..tn {
                f(s, i, j)
            }
        }
    };
    // `write!` to a String cannot fail.
    let _ = writeln!(
        s,
        "declare x86_amx @llvm.x86.tilezero.internal(i16, i16)
declare x86_amx @llvm.x86.tileloadd64.internal(i16, i16, ptr, i64)
declare x86_amx @llvm.x86.{op}.internal(i16, i16, i16, x86_amx, x86_amx, x86_amx)
declare void @llvm.x86.tilestored64.internal(i16, i16, ptr, i64, x86_amx)

define void @{name}(ptr noalias %a, i64 %lda, ptr noalias %b, i64 %steps, ptr noalias %c) #0 {{
entry:
  %lda16 = mul i64 %lda, {AMX_ROWS}"
    );
    tiles(&mut s, &|s, i, j| {
        let _ = writeln!(s, "  %z{i}{j} = call x86_amx @llvm.x86.tilezero.internal(i16 16, i16 64)");
    });
    let _ = writeln!(s, "  br label %head\nhead:\n  %k = phi i64 [0, %entry], [%k.next, %body]");
    tiles(&mut s, &|s, i, j| {
        let _ = writeln!(s, "  %c{i}{j} = phi x86_amx [%z{i}{j}, %entry], [%n{i}{j}, %body]");
    });
    let _ = writeln!(
        s,
        "  %more = icmp slt i64 %k, %steps
  br i1 %more, label %body, label %done
body:
  %a.off = mul i64 %k, 64
  %a0 = getelementptr inbounds i8, ptr %a, i64 %a.off
  %b.off = mul i64 %k, {}
  %b0 = getelementptr inbounds i8, ptr %b, i64 %b.off",
        AMX_ROWS * row_bytes
    );
    for i in 0..tm {
        if i > 0 {
            let _ = writeln!(s, "  %a{i} = getelementptr inbounds i8, ptr %a{}, i64 %lda16", i - 1);
        }
        let _ = writeln!(
            s,
            "  %ta{i} = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 64, ptr %a{i}, i64 %lda)"
        );
    }
    // B's column tiles: all loaded, then the products, where the tiles fit the
    // eight tile registers so (`tm·tn + tm + tn`); for a wider tile (16×64: 4 + 1 +
    // 4) each column's B tile just before its products (`tm·tn + tm + 1` live).
    let product = |s: &mut String, i: usize, j: usize| {
        let _ = writeln!(
            s,
            "  %n{i}{j} = call x86_amx @llvm.x86.{op}.internal(i16 16, i16 64, i16 64, x86_amx %c{i}{j}, \
             x86_amx %ta{i}, x86_amx %tb{j})"
        );
    };
    let all_b = tm * tn + tm + tn <= AMX_TILE_REGISTERS;
    for j in 0..tn {
        if j > 0 {
            let _ = writeln!(s, "  %b{j} = getelementptr inbounds i8, ptr %b0, i64 {}", j * 64);
        }
        let _ = writeln!(
            s,
            "  %tb{j} = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 64, ptr %b{j}, i64 {row_bytes})"
        );
        if !all_b {
            (0..tm).for_each(|i| product(&mut s, i, j));
        }
    }
    if all_b {
        tiles(&mut s, &|s, i, j| product(s, i, j));
    }
    let _ = writeln!(s, "  %k.next = add i64 %k, 1\n  br label %head\ndone:");
    tiles(&mut s, &|s, i, j| {
        let off = i * AMX_ROWS * row_bytes + j * 64;
        let _ = writeln!(
            s,
            "  %cp{i}{j} = getelementptr inbounds i8, ptr %c, i64 {off}
  call void @llvm.x86.tilestored64.internal(i16 16, i16 64, ptr %cp{i}{j}, i64 {row_bytes}, x86_amx %c{i}{j})"
        );
    });
    let _ = writeln!(
        s,
        "  ret void\n}}\n\nattributes #0 = {{ alwaysinline nounwind \"target-features\"=\"{features}\" }}"
    );
    s
}

/// The features an AMX kernel of `elem` is compiled with: `features` and the
/// tile instructions.
fn features(elem: ElemType, features: &str) -> String {
    let sep = if features.is_empty() { "" } else { "," };
    let product = if elem == ElemType::Bf16 { "amx-bf16" } else { "amx-int8" };
    format!("{features}{sep}+amx-tile,+{product}")
}

/// Link the tile loop of an `mr × nr` kernel of `elem` into `module`
/// (compiled with `features`, the kernel's own) and return it.
fn link_tile_loop(
    ctx: &'static Context,
    module: &Module<'static>,
    (elem, mr, nr): (ElemType, usize, usize),
    features: &str,
) -> Result<FunctionValue<'static>, CodegenError> {
    let name = format!("amx_{elem}_{mr}x{nr}");
    let text = tile_loop_ir(&name, elem, mr, nr, features);
    let buf = MemoryBuffer::create_from_memory_range_copy(text.as_bytes(), &name);
    let tiles = ctx.create_module_from_ir(buf).map_err(|e| llvm(format!("AMX tile loop: {e}")))?;
    tiles.set_triple(&module.get_triple());
    tiles.set_data_layout(&module.get_data_layout());
    module.link_in_module(tiles).map_err(|e| llvm(format!("AMX tile loop: {e}")))?;
    let f = module.get_function(&name).ok_or_else(|| llvm(format!("no {name} after linking")))?;
    // Linked as an external definition (the linker drops an unreferenced
    // internal one), then kept to the module, where it is inlined.
    f.set_linkage(inkwell::module::Linkage::Internal);
    Ok(f)
}

/// Build the `mr × nr` AMX micro-kernel `name` multiplying `elem` (u8s8 or
/// bf16; the ABI of `kernels::MicroKernelFn`, `w` f32 lanes to a vector), its
/// A panels row by row (`[MR][words]`).
pub(crate) fn build_microkernel(
    ctx: &'static Context,
    module: &Module<'static>,
    name: &str,
    (mr, nr, w, elem): (usize, usize, usize, ElemType),
    epilogue: &Epilogue,
    cpu: &str,
    features: &str,
) -> Result<(), CodegenError> {
    let features = &self::features(elem, &features_for(elem, features));
    let tile_loop = link_tile_loop(ctx, module, (elem, mr, nr), features)?;
    let (f32t, i32t, i64t, i8t) = (ctx.f32_type(), ctx.i32_type(), ctx.i64_type(), ctx.i8_type());
    let ptr = ctx.ptr_type(AddressSpace::default());
    let (vt, it) = (f32t.vec_type(w as u32), i32t.vec_type(w as u32));
    // The sums' vectors (i32 for u8s8, f32 for bf16) and the words' (A's
    // broadcast and B's): u8s8's i32 lanes of four bytes, bf16's pairs.
    let integer = elem.is_integer();
    let acc_t = crate::accumulator_type(ctx, elem, w);
    let word_t = match integer {
        true => it,
        false => ctx.bf16_type().vec_type(2 * w as u32),
    };
    let dot = match integer {
        true => vpdpbusd(ctx, module, w),
        false => crate::dpbf16ps(ctx, module, w),
    };
    let nv = nr / w;
    let f = crate::declare_microkernel(ctx, module, name, cpu, features, w);
    let param = |i: u32| f.get_nth_param(i).ok_or_else(|| llvm("param"));
    let kc = param(0)?.into_int_value();
    let (a0, b) = (param(1)?.into_pointer_value(), param(2)?.into_pointer_value());
    let c0 = param(3)?.into_pointer_value();
    let (ldc, flags) = (param(4)?.into_int_value(), param(5)?.into_int_value());
    let (bias, r0) = (param(6)?.into_pointer_value(), param(7)?.into_pointer_value());
    let (ldr, tiles) = (param(8)?.into_int_value(), param(9)?.into_int_value());
    // Parameter 10, the next B panel to prefetch, is left to the hardware.
    let (cscale, params) = (param(11)?.into_pointer_value(), param(12)?.into_pointer_value());

    let bld = ctx.create_builder();
    let block = |n: &str| ctx.append_basic_block(f, n);
    let (entry, tile_head, row_head, rem_head, rem_body) =
        (block("entry"), block("tile.head"), block("row.head"), block("k.head"), block("k.body"));
    let (row_done, add_c, set_c, merge) =
        (block("row.done"), block("store.add"), block("store.set"), block("store.merge"));
    let (epi, plain, row_latch, tile_latch, ret) = (
        block("store.epilogue"),
        block("store.plain"),
        block("row.latch"),
        block("tile.latch"),
        block("ret"),
    );
    let c_i64 = |v: usize| i64t.const_int(v as u64, false);
    let codes = epilogue.codes;
    // SAFETY (of the IR, for every `gep` below): the addresses stay inside the
    // panels, the tile of C and the scratch tile the ABI promises; the builder
    // only records them.
    let gep =
        |t: inkwell::types::BasicTypeEnum<'static>, base: PointerValue<'static>, idx: IntValue<'static>| {
            unsafe { bld.build_gep(t, base, &[idx], "at") }.map_err(llvm)
        };

    bld.position_at_end(entry);
    let g = elem.k_group();
    let kc_up = bld.build_int_add(kc, c_i64(g - 1), "kc.up").map_err(llvm)?;
    let kw = bld.build_int_unsigned_div(kc_up, c_i64(g), "kw").map_err(llvm)?;
    let steps = bld.build_int_unsigned_div(kw, c_i64(AMX_ROWS), "steps").map_err(llvm)?;
    let k0 = bld.build_int_mul(steps, c_i64(AMX_ROWS), "k.amx").map_err(llvm)?;
    let lda = bld.build_int_mul(kw, c_i64(4), "lda").map_err(llvm)?;
    // Two scratch tiles: a tile's sums are read from one while the next tile's
    // products go to the other.
    let scratch = bld.build_alloca(i32t.array_type((2 * mr * nr) as u32), "sums").map_err(llvm)?;
    let acc_elem: inkwell::types::BasicTypeEnum<'static> = if integer { i32t.into() } else { f32t.into() };
    scratch.as_instruction().ok_or_else(|| llvm("alloca"))?.set_alignment(64).map_err(llvm)?;
    let more_tiles = bld.build_int_compare(IntPredicate::SGT, tiles, c_i64(1), "tiles.gt1").map_err(llvm)?;
    let tiles = bld.build_select(more_tiles, tiles, c_i64(1), "tiles").map_err(llvm)?.into_int_value();
    let add = {
        let m = bld.build_and(flags, c_i64(kernels::ACCUMULATE as usize), "add").map_err(llvm)?;
        bld.build_int_compare(IntPredicate::NE, m, c_i64(0), "add").map_err(llvm)?
    };
    let apply = {
        let m = bld.build_and(flags, c_i64(kernels::APPLY_EPILOGUE as usize), "apply").map_err(llvm)?;
        bld.build_int_compare(IntPredicate::NE, m, c_i64(0), "apply").map_err(llvm)?
    };
    // The first tile's whole steps.
    let spare = gep(acc_elem, scratch, c_i64(mr * nr))?;
    bld.build_call(tile_loop, &[a0.into(), lda.into(), b.into(), steps.into(), scratch.into()], "")
        .map_err(llvm)?;
    let a_words = bld.build_int_mul(kw, c_i64(mr), "a.step").map_err(llvm)?;
    bld.build_unconditional_branch(tile_head).map_err(llvm)?;

    // tile.head: the tile's A panel, C rows and residual rows, the scratch tile
    // holding its whole steps' sums and the spare one; the next tile's whole
    // steps first, into the spare tile: the tile unit multiplies them while the
    // vector units finish this tile (whose rows do not read them).
    bld.position_at_end(tile_head);
    let t_phi = bld.build_phi(i64t, "t").map_err(llvm)?;
    let a_phi = bld.build_phi(ptr, "a.t").map_err(llvm)?;
    let c_phi = bld.build_phi(ptr, "c.t").map_err(llvm)?;
    let r_phi = bld.build_phi(ptr, "res.t").map_err(llvm)?;
    let sums_phi = bld.build_phi(ptr, "sums.t").map_err(llvm)?;
    let spare_phi = bld.build_phi(ptr, "spare.t").map_err(llvm)?;
    let a = a_phi.as_basic_value().into_pointer_value();
    let (c, res) = (c_phi.as_basic_value().into_pointer_value(), r_phi.as_basic_value().into_pointer_value());
    let (sums_t, spare_t) =
        (sums_phi.as_basic_value().into_pointer_value(), spare_phi.as_basic_value().into_pointer_value());
    let t = t_phi.as_basic_value().into_int_value();
    let t_next = bld.build_int_add(t, c_i64(1), "t.ahead").map_err(llvm)?;
    let ahead = bld.build_int_compare(IntPredicate::SLT, t_next, tiles, "ahead").map_err(llvm)?;
    let (next_tile, rows) = (block("tile.ahead"), block("tile.rows"));
    bld.build_conditional_branch(ahead, next_tile, rows).map_err(llvm)?;
    bld.position_at_end(next_tile);
    // SAFETY (of the IR): tile `t + 1` exists, so its A panel is inside A.
    let a_next = unsafe { bld.build_gep(f32t, a, &[a_words], "a.ahead") }.map_err(llvm)?;
    bld.build_call(tile_loop, &[a_next.into(), lda.into(), b.into(), steps.into(), spare_t.into()], "")
        .map_err(llvm)?;
    bld.build_unconditional_branch(rows).map_err(llvm)?;
    bld.position_at_end(rows);
    bld.build_unconditional_branch(row_head).map_err(llvm)?;

    // row.head: row `i`'s sums from the scratch tile.
    bld.position_at_end(row_head);
    let i_phi = bld.build_phi(i64t, "i").map_err(llvm)?;
    let i = i_phi.as_basic_value().into_int_value();
    let a_row = gep(f32t.into(), a, bld.build_int_mul(i, kw, "a.row").map_err(llvm)?)?;
    let c_off = bld.build_int_mul(i, ldc, "c.row").map_err(llvm)?;
    let c_row = gep(if codes { i8t.into() } else { f32t.into() }, c, c_off)?;
    let r_elem: inkwell::types::BasicTypeEnum =
        if epilogue.residual_codes { i8t.into() } else { f32t.into() };
    let r_row = gep(r_elem, res, bld.build_int_mul(i, ldr, "r.row").map_err(llvm)?)?;
    let s_row = gep(acc_elem, sums_t, bld.build_int_mul(i, c_i64(nr), "s.row").map_err(llvm)?)?;
    let mut start = Vec::with_capacity(nv);
    for v in 0..nv {
        let x = bld.build_load(acc_t, gep(acc_elem, s_row, c_i64(v * w))?, "sum").map_err(llvm)?;
        set_align(&x, 64);
        start.push(x);
    }
    bld.build_unconditional_branch(rem_head).map_err(llvm)?;

    // k.head / k.body: the words past the whole steps, one at a time.
    bld.position_at_end(rem_head);
    let k_phi = bld.build_phi(i64t, "k").map_err(llvm)?;
    let acc_phis = (0..nv)
        .map(|v| bld.build_phi(acc_t, &format!("acc{v}")).map_err(llvm))
        .collect::<Result<Vec<_>, _>>()?;
    let k = k_phi.as_basic_value().into_int_value();
    let more = bld.build_int_compare(IntPredicate::ULT, k, kw, "more").map_err(llvm)?;
    bld.build_conditional_branch(more, rem_body, row_done).map_err(llvm)?;
    bld.position_at_end(rem_body);
    let word = bld.build_load(i32t, gep(i32t.into(), a_row, k)?, "a").map_err(llvm)?.into_int_value();
    let one = bld.build_insert_element(it.get_poison(), word, i32t.const_zero(), "a1").map_err(llvm)?;
    let splat = bld.build_shuffle_vector(one, it.get_poison(), it.const_zero(), "abc").map_err(llvm)?;
    let splat = bld.build_bit_cast(splat, word_t, "aw").map_err(llvm)?;
    let kb = bld.build_int_mul(k, c_i64(nr), "kb").map_err(llvm)?;
    let mut next: Vec<BasicValueEnum<'static>> = Vec::with_capacity(nv);
    for (v, phi) in acc_phis.iter().enumerate() {
        let idx = bld.build_int_add(kb, c_i64(v * w), "bi").map_err(llvm)?;
        let bv = bld.build_load(word_t, gep(i32t.into(), b, idx)?, "b").map_err(llvm)?;
        set_align(&bv, 4);
        let r = bld
            .build_call(dot, &[phi.as_basic_value().into(), splat.into(), bv.into()], "dot")
            .map_err(llvm)?;
        next.push(match r.try_as_basic_value() {
            inkwell::values::ValueKind::Basic(v) => v,
            inkwell::values::ValueKind::Instruction(_) => {
                return Err(llvm("the dot product returned nothing"))
            }
        });
    }
    let k_next = bld.build_int_add(k, c_i64(1), "k.next").map_err(llvm)?;
    bld.build_unconditional_branch(rem_head).map_err(llvm)?;
    k_phi.add_incoming(&[(&k0, row_head), (&k_next, rem_body)]);
    for ((phi, s), n) in acc_phis.iter().zip(&start).zip(&next) {
        phi.add_incoming(&[(s, row_head), (n, rem_body)]);
    }

    // row.done: the row's sums as f32 (u8s8's exact below 2^24), C added when
    // accumulating (never for codes: one K block), the epilogue, the store.
    bld.position_at_end(row_done);
    let mut sums: Vec<VectorValue<'static>> = Vec::with_capacity(nv);
    for phi in &acc_phis {
        let acc = phi.as_basic_value().into_vector_value();
        sums.push(match integer {
            true => bld.build_signed_int_to_float(acc, vt, "sum.f32").map_err(llvm)?,
            false => acc,
        });
    }
    match codes {
        true => bld.build_unconditional_branch(set_c),
        false => bld.build_conditional_branch(add, add_c, set_c),
    }
    .map_err(llvm)?;
    bld.position_at_end(add_c);
    let mut summed = Vec::with_capacity(nv);
    for (v, s) in sums.iter().enumerate() {
        let old = bld.build_load(vt, gep(f32t.into(), c_row, c_i64(v * w))?, "c").map_err(llvm)?;
        set_align(&old, 4);
        summed.push(bld.build_float_add(old.into_vector_value(), *s, "sum").map_err(llvm)?);
    }
    let vals = crate::join_tile(&bld, vt, (add_c, &summed), (set_c, &sums), merge)?;
    let store = |vals: &[VectorValue<'static>]| -> Result<(), CodegenError> {
        for (v, x) in vals.iter().enumerate() {
            let st = match codes {
                true => bld.build_store(
                    gep(i8t.into(), c_row, c_i64(v * w))?,
                    code_bytes(ctx, &bld, *x, epilogue.makes_codes())?,
                ),
                false => bld.build_store(gep(f32t.into(), c_row, c_i64(v * w))?, *x),
            }
            .map_err(llvm)?;
            st.set_alignment(if codes { 1 } else { 4 }).map_err(llvm)?;
        }
        Ok(())
    };
    match (epilogue.is_identity(), codes) {
        (true, _) => bld.build_unconditional_branch(plain),
        (false, true) => bld.build_unconditional_branch(epi),
        (false, false) => bld.build_conditional_branch(apply, epi, plain),
    }
    .map_err(llvm)?;
    bld.position_at_end(plain);
    store(&vals)?;
    bld.build_unconditional_branch(row_latch).map_err(llvm)?;
    // y = act(scale · acc + bias[col] + residual[row, col]): this row's residual.
    bld.position_at_end(epi);
    let vm = vmath::VMath::new(ctx, module, &bld, vt, w, features);
    let load = |base, idx, bytes: bool| -> Result<VectorValue<'static>, CodegenError> {
        let x = match bytes {
            true => {
                let x = bld
                    .build_load(i8t.vec_type(w as u32), gep(i8t.into(), base, idx)?, "ep")
                    .map_err(llvm)?;
                set_align(&x, 1);
                x
            }
            false => {
                let x = bld.build_load(vt, gep(f32t.into(), base, idx)?, "ep").map_err(llvm)?;
                set_align(&x, 4);
                x
            }
        };
        Ok(x.into_vector_value())
    };
    let ptrs = (cscale, bias, r_row, ldr, params);
    let mut out = vals.clone();
    for (v, y) in out.iter_mut().enumerate() {
        match codes {
            true => {
                let bytes = vm.epilogue_codes(epilogue, *y, ptrs, (0, v * w), &load)?;
                let st = bld.build_store(gep(i8t.into(), c_row, c_i64(v * w))?, bytes).map_err(llvm)?;
                st.set_alignment(1).map_err(llvm)?;
            }
            false => *y = vm.epilogue(epilogue, *y, ptrs, (0, v * w), &load)?,
        }
    }
    if !codes {
        store(&out)?;
    }
    bld.build_unconditional_branch(row_latch).map_err(llvm)?;
    bld.position_at_end(row_latch);
    let i_next = bld.build_int_add(i, c_i64(1), "i.next").map_err(llvm)?;
    let more_rows = bld.build_int_compare(IntPredicate::ULT, i_next, c_i64(mr), "more.rows").map_err(llvm)?;
    bld.build_conditional_branch(more_rows, row_head, tile_latch).map_err(llvm)?;
    i_phi.add_incoming(&[(&c_i64(0), rows), (&i_next, row_latch)]);

    // tile.latch: the next MR rows (A's next panel, C's and the residual's rows).
    bld.position_at_end(tile_latch);
    sums_phi.add_incoming(&[(&scratch, entry), (&spare_t, tile_latch)]);
    spare_phi.add_incoming(&[(&spare, entry), (&sums_t, tile_latch)]);
    let phis = crate::TilePhis { t: t_phi, a: a_phi, c: c_phi, res: r_phi, first: (a0, c0, r0) };
    let strides =
        crate::TileStrides { a_words, ldc, ldr, mr, codes, residual_codes: epilogue.residual_codes, tiles };
    crate::close_tile_loop(ctx, &bld, &phis, &strides, (entry, tile_latch, tile_head, ret))
}

/// Build `@name(i64 iters, ptr sink)` (`peak`'s loop): `iters` trips of four
/// independent tile products of `elem` on operand tiles held in registers
/// (`MR = NR = 32`, what a 32 × 32 kernel's steps multiply), a row of the
/// first sum stored to `sink` (16 values). Returns the flops of a trip.
pub(crate) fn build_peak_loop(
    ctx: &'static Context,
    module: &Module<'static>,
    name: &str,
    elem: ElemType,
    cpu: &str,
    features: &str,
) -> Result<usize, CodegenError> {
    let op = tile_product(elem);
    let features = self::features(elem, &features_for(elem, features));
    let mut s = String::new();
    let _ = writeln!(
        s,
        "declare x86_amx @llvm.x86.tilezero.internal(i16, i16)
declare x86_amx @llvm.x86.{op}.internal(i16, i16, i16, x86_amx, x86_amx, x86_amx)
declare void @llvm.x86.tilestored64.internal(i16, i16, ptr, i64, x86_amx)

define void @{name}(i64 %iters, ptr %sink) #0 {{
entry:
  %row = alloca [256 x i32], align 64"
    );
    for t in ["a0", "a1", "b0", "b1", "z00", "z01", "z10", "z11"] {
        let _ = writeln!(s, "  %{t} = call x86_amx @llvm.x86.tilezero.internal(i16 16, i16 64)");
    }
    let _ = writeln!(s, "  br label %head\nhead:\n  %i = phi i64 [0, %entry], [%i.next, %body]");
    let pairs = [("00", "a0", "b0"), ("01", "a0", "b1"), ("10", "a1", "b0"), ("11", "a1", "b1")];
    for (c, ..) in pairs {
        let _ = writeln!(s, "  %c{c} = phi x86_amx [%z{c}, %entry], [%n{c}, %body]");
    }
    let _ = writeln!(s, "  %more = icmp slt i64 %i, %iters\n  br i1 %more, label %body, label %done\nbody:");
    for (c, a, b) in pairs {
        let _ = writeln!(
            s,
            "  %n{c} = call x86_amx @llvm.x86.{op}.internal(i16 16, i16 64, i16 64, x86_amx %c{c}, x86_amx %{a}, \
             x86_amx %{b})"
        );
    }
    let _ = writeln!(
        s,
        "  %i.next = add i64 %i, 1
  br label %head
done:
  call void @llvm.x86.tilestored64.internal(i16 16, i16 64, ptr %row, i64 64, x86_amx %c00)
  call void @llvm.x86.tilestored64.internal(i16 16, i16 64, ptr %row, i64 64, x86_amx %c01)
  call void @llvm.x86.tilestored64.internal(i16 16, i16 64, ptr %row, i64 64, x86_amx %c10)
  call void @llvm.x86.tilestored64.internal(i16 16, i16 64, ptr %row, i64 64, x86_amx %c11)
  %v = load <16 x i32>, ptr %row, align 64
  store <16 x i32> %v, ptr %sink, align 4
  ret void
}}

attributes #0 = {{ nounwind \"target-cpu\"=\"{cpu}\" \"target-features\"=\"{features}\" }}"
    );
    let buf = MemoryBuffer::create_from_memory_range_copy(s.as_bytes(), name);
    let peak = ctx.create_module_from_ir(buf).map_err(|e| llvm(format!("AMX peak loop: {e}")))?;
    peak.set_triple(&module.get_triple());
    peak.set_data_layout(&module.get_data_layout());
    module.link_in_module(peak).map_err(|e| llvm(format!("AMX peak loop: {e}")))?;
    // Four products a trip, each 16 × 16 sums of 16 words of `k_group` depths.
    Ok(4 * AMX_ROWS * AMX_ROWS * AMX_ROWS * elem.k_group() * 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tile_loop_multiplies_each_row_tile_by_each_column_tile() {
        let ir = tile_loop_ir("t", ElemType::U8S8, 32, 16, "+avx512f");
        assert_eq!(ir.matches("tdpbusd.internal(i16 16").count(), 2);
        assert_eq!(ir.matches("@llvm.x86.tileloadd64.internal(i16 16, i16 64, ptr %").count(), 3);
        assert!(ir.contains("%b.off = mul i64 %k, 1024"), "16 words of 16 columns a step");
        assert!(ir.contains("%cp10 = getelementptr inbounds i8, ptr %c, i64 1024"));
        let ctx = Context::create();
        let buf = MemoryBuffer::create_from_memory_range_copy(ir.as_bytes(), "t");
        let m = ctx.create_module_from_ir(buf).expect("the tile loop parses");
        m.verify().expect("and verifies");
        let ir = tile_loop_ir("t", ElemType::Bf16, 16, 32, "+avx512f");
        assert_eq!(ir.matches("tdpbf16ps.internal(i16 16").count(), 2);
    }

    /// A 16×64 tile needs four sums, A's tile and a B tile at a time (its four
    /// B tiles at once would make nine of the eight tile registers): each
    /// column's B tile is loaded after the previous column's product, and LLVM
    /// configures and allocates the tiles of the loop it makes.
    #[test]
    fn a_wide_tile_loads_each_b_tile_just_before_its_products() {
        let ir = tile_loop_ir("t", ElemType::U8S8, 16, 64, "+avx512f,+amx-tile,+amx-int8");
        assert_eq!(ir.matches("tdpbusd.internal(i16 16").count(), 4);
        assert_eq!(ir.matches("@llvm.x86.tileloadd64.internal(i16 16, i16 64, ptr %").count(), 5);
        let at = |what: &str| ir.find(what).unwrap_or_else(|| panic!("no {what} in\n{ir}"));
        for j in 1..4 {
            assert!(
                at(&format!("%n0{}", j - 1)) < at(&format!("%tb{j} =")),
                "B tile {j} loaded early:\n{ir}"
            );
            assert!(at(&format!("%tb{j} =")) < at(&format!("%n0{j} =")));
        }
        // The narrower tiles keep their order: every B tile, then the products.
        let ir = tile_loop_ir("t", ElemType::U8S8, 32, 32, "+avx512f");
        assert!(ir.find("%tb1 =").unwrap() < ir.find("%n00 =").unwrap());
        let ctx = Context::create();
        let ir = tile_loop_ir("t", ElemType::U8S8, 16, 64, "+avx512f,+amx-tile,+amx-int8");
        let buf = MemoryBuffer::create_from_memory_range_copy(ir.as_bytes(), "t");
        let m = ctx.create_module_from_ir(buf).expect("the tile loop parses");
        m.verify().expect("and verifies");
    }
}
