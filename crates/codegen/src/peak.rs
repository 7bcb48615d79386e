//! Measured peak FMA throughput: a generated loop of independent vector FMAs
//! (enough accumulators to cover FMA latency on every port, no memory traffic),
//! timed on every thread of a pool. The denominator of "fraction of peak". The
//! bf16 peak is the same loop of `vdpbf16ps` (two products per f32 lane), the
//! u8s8 one of `vpdpbusd` (four per i32 lane), the i16 one of `vpmaddwd` and
//! its add (two per i32 lane); where a family multiplies in AMX tiles, a loop
//! of their tile products (`amx`).

use std::time::Instant;

use inkwell::{AddressSpace, IntPredicate};
use kernels::{ElemType, Target, ThreadPool};

use crate::{jit_function, llvm, target_attributes, CodegenError};

/// Independent accumulators: covers 2 FMA ports × 4-cycle latency with margin
/// (and `vdpbf16ps`'s longer latency: measured best with 24 on Zen 5 with
/// AVX-512, where 12 chains leave a tenth of its rate unused). AVX2's 16 registers
/// hold 12 at most.
fn chains(t: &Target, elem: ElemType) -> usize {
    match elem {
        ElemType::Bf16 if t.vector_registers >= 32 => 24,
        _ => 12,
    }
}

type FmaLoopFn = unsafe extern "C" fn(iters: i64, sink: *mut f32);

/// Peak f32 GFLOP/s of `t` measured with `pool`'s threads (each thread running
/// the FMA loop for about `millis` ms).
pub fn measure_peak_gflops(t: &Target, pool: &ThreadPool, millis: u64) -> Result<f64, CodegenError> {
    measure_peak_gflops_of(t, ElemType::F32, pool, millis)
}

/// Peak GFLOP/s of `t`'s multiply-adds in `elem` (a bf16 pair product and its
/// add count as 4 flops per lane, a u8s8 quad as 8, an i16 pair as 4, as i16s8's), with
/// `pool`'s threads.
pub fn measure_peak_gflops_of(
    t: &Target,
    elem: ElemType,
    pool: &ThreadPool,
    millis: u64,
) -> Result<f64, CodegenError> {
    t.check_elem(elem).map_err(|e| CodegenError::Unsupported(e.to_string()))?;
    let w = t.f32_lanes;
    let chains = chains(t, elem);
    let name = "fma_peak";
    // Where the family multiplies in AMX tiles, their peak: the loop of tile
    // products (its flops a trip), not the vectors'.
    let amx = crate::AMX_PEAK_TILE;
    let mut tile_flops = None;
    let jit = jit_function(t, name, &crate::ObjectCache::none(), |ctx, module, cpu, features| {
        if t.amx_tile(elem, amx.0, amx.1) {
            tile_flops = Some(crate::amx::build_peak_loop(ctx, module, name, elem, cpu, features)?);
            return Ok(());
        }
        let (f32t, i64t) = (ctx.f32_type(), ctx.i64_type());
        let vt = f32t.vec_type(w as u32);
        let at = crate::accumulator_type(ctx, elem, w);
        let fn_type =
            ctx.void_type().fn_type(&[i64t.into(), ctx.ptr_type(AddressSpace::default()).into()], false);
        let f = module.add_function(name, fn_type, None);
        target_attributes(ctx, f, cpu, &crate::features_for(elem, features), w);
        let iters = f.get_nth_param(0).ok_or_else(|| llvm("param"))?.into_int_value();
        let sink = f.get_nth_param(1).ok_or_else(|| llvm("param"))?.into_pointer_value();
        let bld = ctx.create_builder();
        let (entry, head, body, done) = (
            ctx.append_basic_block(f, "entry"),
            ctx.append_basic_block(f, "head"),
            ctx.append_basic_block(f, "body"),
            ctx.append_basic_block(f, "done"),
        );
        bld.position_at_end(entry);
        bld.build_unconditional_branch(head).map_err(llvm)?;
        bld.position_at_end(head);
        let i = bld.build_phi(i64t, "i").map_err(llvm)?;
        let accs: Vec<_> = (0..chains)
            .map(|c| bld.build_phi(at, &format!("a{c}")))
            .collect::<Result<_, _>>()
            .map_err(llvm)?;
        let more = bld
            .build_int_compare(IntPredicate::SLT, i.as_basic_value().into_int_value(), iters, "more")
            .map_err(llvm)?;
        bld.build_conditional_branch(more, body, done).map_err(llvm)?;
        bld.position_at_end(body);
        let (fma, x, y) = match elem {
            ElemType::F32 => {
                let fma =
                    inkwell::intrinsics::Intrinsic::find("llvm.fma").ok_or_else(|| llvm("no llvm.fma"))?;
                let fma = fma.get_declaration(module, &[vt.into()]).ok_or_else(|| llvm("no llvm.fma"))?;
                // acc = acc * x + y with x, y constants close to 1 and 0: stays finite.
                let splat = |v: f64| inkwell::types::VectorType::const_vector(&vec![f32t.const_float(v); w]);
                (fma, splat(0.999_999), splat(1e-7))
            }
            ElemType::Bf16 => {
                let bt = ctx.bf16_type();
                let dp = crate::dpbf16ps(ctx, module, w);
                // acc += 2 · 2⁻¹⁰ · 2⁻¹⁰ per call: finite for any run.
                let splat =
                    |v: f64| inkwell::types::VectorType::const_vector(&vec![bt.const_float(v); 2 * w]);
                (dp, splat(1.0 / 1024.0), splat(1.0 / 1024.0))
            }
            ElemType::U8S8 => {
                // acc += four products of 1 · 1 per lane: wraps after 2^29 calls, harmlessly.
                let ones = vec![ctx.i32_type().const_int(0x0101_0101, false); w];
                let ones = inkwell::types::VectorType::const_vector(&ones);
                (crate::vpdpbusd(ctx, module, w), ones, ones)
            }
            // i16s8's products are i16's (its bytes are widened as they load).
            ElemType::I16 | ElemType::I16S8 => {
                // acc += two products of 1 · 1 per lane, added: wraps harmlessly.
                let ones = vec![ctx.i16_type().const_int(1, false); 2 * w];
                let ones = inkwell::types::VectorType::const_vector(&ones);
                (crate::pmaddwd(ctx, module, w), ones, ones)
            }
            ElemType::F16 => return Err(crate::f16_on_cpu()),
        };
        let mut next = Vec::new();
        for a in &accs {
            let acc = a.as_basic_value();
            let args: Vec<inkwell::values::BasicMetadataValueEnum> = match elem {
                // The accumulator's own halves times ones, so that the product is
                // not the same in every trip (and hoisted out of the loop).
                ElemType::I16 | ElemType::I16S8 => {
                    vec![bld.build_bit_cast(acc, x.get_type(), "h").map_err(llvm)?.into(), y.into()]
                }
                _ => vec![acc.into(), x.into(), y.into()],
            };
            let r = match bld.build_call(fma, &args, "f").map_err(llvm)?.try_as_basic_value() {
                inkwell::values::ValueKind::Basic(v) => v,
                inkwell::values::ValueKind::Instruction(_) => return Err(llvm("fma returned nothing")),
            };
            next.push(match elem {
                ElemType::I16 | ElemType::I16S8 => {
                    crate::add_in_order(ctx, &bld, acc.into_vector_value(), r.into_vector_value())?
                }
                _ => r,
            });
        }
        let i_next = bld
            .build_int_add(i.as_basic_value().into_int_value(), i64t.const_int(1, false), "i1")
            .map_err(llvm)?;
        bld.build_unconditional_branch(head).map_err(llvm)?;
        i.add_incoming(&[(&i64t.const_zero(), entry), (&i_next, body)]);
        for (a, n) in accs.iter().zip(&next) {
            a.add_incoming(&[(&at.const_zero(), entry), (n, body)]);
        }
        bld.position_at_end(done);
        // Sum the chains into the sink so that nothing is dead.
        let mut total = accs[0].as_basic_value().into_vector_value();
        for a in &accs[1..] {
            let a = a.as_basic_value().into_vector_value();
            total = match elem {
                e if e.is_integer() => bld.build_int_add(total, a, "t"),
                _ => bld.build_float_add(total, a, "t"),
            }
            .map_err(llvm)?;
        }
        let total = bld.build_bit_cast(total, vt, "sink.bits").map_err(llvm)?;
        let st = bld.build_store(sink, total).map_err(llvm)?;
        st.set_alignment(4).map_err(llvm)?;
        bld.build_return(None).map_err(llvm)?;
        Ok(())
    })?;
    // SAFETY: the function was generated with exactly this signature; its engine
    // (`jit.engine`) lives until the end of this function, after the last call.
    let f: FmaLoopFn = unsafe { std::mem::transmute::<usize, FmaLoopFn>(jit.addr) };
    let call = |iters: i64| {
        let mut sink = vec![0.0f32; w];
        // SAFETY: `sink` holds one vector of `w` floats, all the loop writes.
        unsafe { f(iters, sink.as_mut_ptr()) };
        std::hint::black_box(sink);
    };
    // Calibrate the iteration count to about `millis` on one thread.
    let mut iters: i64 = 1 << 16;
    loop {
        let start = Instant::now();
        call(iters);
        let secs = start.elapsed().as_secs_f64();
        if secs * 1e3 >= millis as f64 / 4.0 || iters > 1 << 40 {
            iters = ((iters as f64) * (millis as f64 / 1e3) / secs.max(1e-9)) as i64;
            break;
        }
        iters *= 4;
    }
    // Best of three runs of a third of the time each: a slow phase of this machine
    // (a core taken away for a while) would otherwise set the peak.
    let iters = (iters / 3).max(1);
    let trip = tile_flops.unwrap_or(chains * w * 2 * elem.k_group());
    let flops = iters as f64 * trip as f64 * pool.threads() as f64;
    let mut best: f64 = 0.0;
    for _ in 0..3 {
        let start = Instant::now();
        pool.run(&|_| call(iters));
        best = best.max(flops / start.elapsed().as_secs_f64().max(1e-12) / 1e9);
    }
    Ok(best)
}
