//! Fused attention (RUNTIME.md §2): for every batch entry (batch × heads) and
//! block of query rows, `S = Q·Kᵀ` is computed into a tile of the thread's
//! scratch, the softmax (with whatever scale and mask the model applies: a
//! step the caller supplies, a generated loop program) turns the tile's rows
//! into probabilities in a second tile, and `O = P·V` is written to the output.
//! The `T × T` score matrix never exists: a block's two tiles stay in L1/L2.
//!
//! Both products run on the direct kernels (no packing: Q and P are read where
//! they lie, Kᵀ and V too when their rows are contiguous), one thread per task;
//! threads take tasks (entry, query block) from a shared counter, so that a
//! ragged last block or an odd head count does not leave a thread idle.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::direct::{direct_band, DirectPlan};
use crate::gemm::{BOperand, CPtr, EpilogueArgs, MatMut, MatRef, WORKSPACE};
use crate::{KernelError, ThreadPool};

/// The work (flops of both products) below which attention runs on the
/// calling thread: about 30 µs of it, more than a fork-join costs.
const PARALLEL_FLOPS: f64 = 2e6;

/// The block of query rows, and the schedules of the two products for it.
#[derive(Clone, Copy, Debug)]
pub struct AttentionPlan<'k> {
    /// Query rows per task (the last block of an entry may be shorter).
    pub block: usize,
    /// `S = Q·Kᵀ` for `block` rows: single-thread direct kernels.
    pub scores: DirectPlan<'k>,
    /// `O = P·V` for `block` rows: single-thread direct kernels.
    pub output: DirectPlan<'k>,
}

/// The softmax step between the products: `(entry, first query row, rows,
/// scores, probabilities)`, both tiles `rows × keys` row-major. Returns a
/// message when the step finds bad data.
pub type SoftmaxStep<'a> = dyn Fn(usize, usize, usize, &[f32], &mut [f32]) -> Result<(), String> + Sync + 'a;

/// The query block for `rows × keys` scores: two tiles of `block × keys` f32
/// within half of L2, at least one kernel height `mr` and at most 64 rows, and
/// small enough that `entries` give every thread two tasks when they can.
pub fn attention_block(
    l2: usize,
    threads: usize,
    entries: usize,
    rows: usize,
    keys: usize,
    mr: usize,
) -> usize {
    let mr = mr.max(1);
    let fit = (l2 / 2 / (2 * 4 * keys.max(1))).clamp(mr, 64) / mr * mr;
    let mut block = fit.min(rows.div_ceil(mr) * mr).max(mr);
    while block > mr && entries * rows.div_ceil(block) < 2 * threads {
        block -= mr;
    }
    block.min(rows.max(1))
}

/// `O[e] = softmax_step(Q[e] · Kᵀ[e]) · V[e]` for every entry `e`, on `pool`.
/// `q[e]` is `rows × depth` with rows contiguous along the depth, `kt[e]` is
/// `depth × keys`, `v[e]` is `keys × dv`, `o[e]` is `rows × dv`.
pub fn attention(
    pool: &ThreadPool,
    plan: &AttentionPlan,
    q: &[MatRef],
    kt: &[BOperand],
    v: &[BOperand],
    o: &mut [MatMut],
    softmax: &SoftmaxStep,
) -> Result<(), KernelError> {
    let entries = q.len();
    if kt.len() != entries || v.len() != entries || o.len() != entries {
        return Err(KernelError::Shape(format!(
            "attention over {entries} Q, {} Kᵀ, {} V and {} outputs",
            kt.len(),
            v.len(),
            o.len()
        )));
    }
    let (Some(q0), Some(k0), Some(v0)) = (q.first(), kt.first(), v.first()) else { return Ok(()) };
    let (rows, depth) = (q0.rows, q0.cols);
    let (kd, keys) = k0.dims();
    let (vk, dv) = v0.dims();
    if kd != depth || vk != keys {
        return Err(KernelError::Shape(format!(
            "attention with Q {rows}x{depth}, Kᵀ {kd}x{keys} and V {vk}x{dv}"
        )));
    }
    for e in 0..entries {
        if (q[e].rows, q[e].cols) != (rows, depth)
            || kt[e].dims() != (depth, keys)
            || v[e].dims() != (keys, dv)
            || (o[e].rows, o[e].cols) != (rows, dv)
        {
            return Err(KernelError::Shape("the entries of an attention batch differ in shape".into()));
        }
        if !crate::direct::a_in_place(&q[e]) {
            return Err(KernelError::Shape("attention reads Q in place: its rows must be contiguous".into()));
        }
    }
    let (_, snr) = plan.scores.check()?;
    let (_, onr) = plan.output.check()?;
    if plan.block == 0 {
        return Err(KernelError::Shape("an attention block of 0 rows".into()));
    }
    if rows == 0 || dv == 0 {
        return Ok(());
    }
    let blocks = rows.div_ceil(plan.block);
    let tasks = entries * blocks;
    let outs: Vec<(CPtr, usize)> = o.iter_mut().map(|m| (CPtr(m.data.as_mut_ptr()), m.ldc)).collect();
    let next = AtomicUsize::new(0);
    let failed: Mutex<Option<String>> = Mutex::new(None);
    let work = |_: usize| {
        WORKSPACE.with(|ws| {
            let ws = &mut *ws.borrow_mut();
            let tile = plan.block * keys;
            // The tiles leave the workspace for the thread's tasks (the products
            // borrow the rest of it) and go back after them.
            let mut scores = std::mem::take(&mut ws.scores);
            let mut probs = std::mem::take(&mut ws.probs);
            if scores.len() < tile {
                scores.resize(tile, 0.0);
                probs.resize(tile, 0.0);
            }
            loop {
                let t = next.fetch_add(1, Ordering::Relaxed);
                if t >= tasks {
                    break;
                }
                let (e, b) = (t / blocks, t % blocks);
                let first = b * plan.block;
                let n = plan.block.min(rows - first);
                let qe = &q[e];
                let qb = MatRef { data: &qe.data[first * qe.rs..], rows: n, ..*qe };
                if keys > 0 {
                    let sp = CPtr(scores.as_mut_ptr());
                    direct_band(
                        &plan.scores,
                        &qb,
                        &kt[e],
                        sp,
                        keys,
                        0..n,
                        0..keys.div_ceil(snr),
                        &EpilogueArgs::default(),
                        ws,
                    );
                }
                let r = softmax(e, first, n, &scores[..n * keys], &mut probs[..n * keys]);
                if let Err(msg) = r {
                    failed.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(msg);
                } else if keys > 0 {
                    let pb =
                        MatRef { data: &probs[..n * keys], rows: n, cols: keys, rs: keys, cs: 1, taps: None };
                    let (optr, ldo) = outs[e];
                    // SAFETY: rows first..first+n of entry e's output are this task's
                    // alone (tasks are disjoint (entry, block) pairs), and inside
                    // the output (its shape was checked above).
                    let ob = CPtr(unsafe { optr.get().add(first * ldo) });
                    direct_band(
                        &plan.output,
                        &pb,
                        &v[e],
                        ob,
                        ldo,
                        0..n,
                        0..dv.div_ceil(onr),
                        &EpilogueArgs::default(),
                        ws,
                    );
                } else {
                    // No keys: the product with an empty V is zero.
                    let (optr, ldo) = outs[e];
                    for i in first..first + n {
                        // SAFETY: as above: this task's rows of entry e's output.
                        unsafe { std::ptr::write_bytes(optr.get().add(i * ldo), 0, dv) };
                    }
                }
            }
            ws.scores = scores;
            ws.probs = probs;
        });
    };
    // A fork-join (waking the pool) costs more than a few microseconds of work.
    let flops = 4.0 * (entries * rows * keys) as f64 * (depth + dv) as f64 / 2.0;
    if pool.threads() > 1 && tasks > 1 && flops >= PARALLEL_FLOPS {
        pool.run(&work);
    } else {
        work(0);
    }
    match failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(msg) => Err(KernelError::Step(msg)),
        None => Ok(()),
    }
}
