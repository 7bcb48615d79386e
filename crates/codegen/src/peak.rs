//! Measured peak FMA throughput: a generated loop of independent vector FMAs
//! (enough accumulators to cover FMA latency on every port, no memory traffic),
//! timed on every thread of a pool. The denominator of "fraction of peak".

use std::time::Instant;

use inkwell::{AddressSpace, IntPredicate};
use kernels::{Target, ThreadPool};

use crate::{jit_function, llvm, target_attributes, CodegenError};

/// Independent accumulators: covers 2 FMA ports × 4-cycle latency with margin.
const CHAINS: usize = 12;

type FmaLoopFn = unsafe extern "C" fn(iters: i64, sink: *mut f32);

/// Peak f32 GFLOP/s of `t` measured with `pool`'s threads (each thread running
/// the FMA loop for about `millis` ms).
pub fn measure_peak_gflops(t: &Target, pool: &ThreadPool, millis: u64) -> Result<f64, CodegenError> {
    let w = t.f32_lanes;
    let name = "fma_peak";
    let jit = jit_function(t, name, |ctx, module, cpu, features| {
        let (f32t, i64t) = (ctx.f32_type(), ctx.i64_type());
        let vt = f32t.vec_type(w as u32);
        let fn_type =
            ctx.void_type().fn_type(&[i64t.into(), ctx.ptr_type(AddressSpace::default()).into()], false);
        let f = module.add_function(name, fn_type, None);
        target_attributes(ctx, f, cpu, features, w);
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
        let accs: Vec<_> = (0..CHAINS)
            .map(|c| bld.build_phi(vt, &format!("a{c}")))
            .collect::<Result<_, _>>()
            .map_err(llvm)?;
        let more = bld
            .build_int_compare(IntPredicate::SLT, i.as_basic_value().into_int_value(), iters, "more")
            .map_err(llvm)?;
        bld.build_conditional_branch(more, body, done).map_err(llvm)?;
        bld.position_at_end(body);
        let fma = inkwell::intrinsics::Intrinsic::find("llvm.fma").ok_or_else(|| llvm("no llvm.fma"))?;
        let fma = fma.get_declaration(module, &[vt.into()]).ok_or_else(|| llvm("no llvm.fma"))?;
        // acc = acc * x + y with x, y constants close to 1 and 0: stays finite.
        let splat = |v: f64| inkwell::types::VectorType::const_vector(&vec![f32t.const_float(v); w]);
        let (x, y) = (splat(0.999_999), splat(1e-7));
        let mut next = Vec::new();
        for a in &accs {
            let r =
                bld.build_call(fma, &[a.as_basic_value().into(), x.into(), y.into()], "f").map_err(llvm)?;
            match r.try_as_basic_value() {
                inkwell::values::ValueKind::Basic(v) => next.push(v),
                inkwell::values::ValueKind::Instruction(_) => return Err(llvm("fma returned nothing")),
            }
        }
        let i_next = bld
            .build_int_add(i.as_basic_value().into_int_value(), i64t.const_int(1, false), "i1")
            .map_err(llvm)?;
        bld.build_unconditional_branch(head).map_err(llvm)?;
        i.add_incoming(&[(&i64t.const_zero(), entry), (&i_next, body)]);
        for (a, n) in accs.iter().zip(&next) {
            a.add_incoming(&[(&vt.const_zero(), entry), (n, body)]);
        }
        bld.position_at_end(done);
        // Sum the chains into the sink so that nothing is dead.
        let mut total = accs[0].as_basic_value().into_vector_value();
        for a in &accs[1..] {
            total = bld.build_float_add(total, a.as_basic_value().into_vector_value(), "t").map_err(llvm)?;
        }
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
    let flops = iters as f64 * (CHAINS * w * 2) as f64 * pool.threads() as f64;
    let mut best: f64 = 0.0;
    for _ in 0..3 {
        let start = Instant::now();
        pool.run(&|_| call(iters));
        best = best.max(flops / start.elapsed().as_secs_f64().max(1e-12) / 1e9);
    }
    Ok(best)
}
