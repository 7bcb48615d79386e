//! Fused attention (RUNTIME.md §2): for every batch entry (batch × heads) and
//! block of query rows, `S = Q·Kᵀ` is computed into a tile of the thread's
//! scratch, the softmax (with whatever scale and mask the model applies: a
//! step the caller supplies, a generated loop program) turns the tile's rows
//! into probabilities in a second tile, and `O = P·V` is written to the output.
//! The `T × T` score matrix never exists: a block's two tiles stay in L1/L2.
//!
//! At long key lengths a block's whole rows of scores no longer fit in cache:
//! there the keys are taken a chunk at a time with online softmax (the
//! flash-attention recurrence): per chunk, the scores, the logits (a generated
//! program applies the model's scale and mask) and `exp(logits - m)` against
//! the rows' running maximum `m`; when a chunk raises `m`, the rows' running
//! sums and their output so far are rescaled by `exp(m_old - m_new)`; the
//! output is divided by the sums at the end. Tiles are then `block × chunk`
//! whatever the key length.
//!
//! Both products run on the direct kernels (no packing: Q and P are read where
//! they lie, Kᵀ and V too when their rows are contiguous), one thread per task;
//! threads take tasks (entry, query block) from a shared counter, so that a
//! ragged last block or an odd head count does not leave a thread idle.

use std::sync::Mutex;

use crate::direct::{direct_band, DirectPlan};
use crate::gemm::{BOperand, CPtr, EpilogueArgs, MatMut, MatRef, WORKSPACE};
use crate::{KernelError, ThreadPool};

/// The work (flops of both products) below which attention runs on the
/// calling thread: a microsecond of it, about what a fork-join to the pool's
/// spinning workers costs. (At 2e6, BERT's 12 heads at 8-24 keys ran on one
/// thread, 1.2-1.45x slower than on two and behind the unfused steps.)
const PARALLEL_FLOPS: f64 = 1e5;

/// The block of query rows, and the schedules of the two products for it.
#[derive(Clone, Copy, Debug)]
pub struct AttentionPlan<'k> {
    /// Query rows per task (the last block of an entry may be shorter).
    pub block: usize,
    /// Keys per chunk of online softmax (the last chunk may be shorter); `None`
    /// takes every key at once (whole rows of scores in the tiles).
    pub chunk: Option<usize>,
    /// `S = Q·Kᵀ` for `block` rows: single-thread direct kernels.
    pub scores: DirectPlan<'k>,
    /// `O = P·V` for `block` rows: single-thread direct kernels.
    pub output: DirectPlan<'k>,
    /// Online softmax gives a row that weighs nothing (every logit -inf)
    /// 0, not NaN: the model makes its softmax's NaNs 0
    /// (`plan::OnlineSoftmax::nan_to_zero`).
    pub zero_empty_rows: bool,
}

/// The softmax step between the products: `(entry, first query row, rows,
/// scores, probabilities)`, both tiles `rows × keys` row-major. Returns a
/// message when the step finds bad data.
pub type SoftmaxStep<'a> = dyn Fn(usize, usize, usize, &[f32], &mut [f32]) -> Result<(), String> + Sync + 'a;

/// One chunk of online softmax: `(entry, first query row, rows, first key,
/// keys, scores, running max, logits, probabilities)`; the three tiles are
/// `rows × keys` row-major (keys of the chunk), the running max one value per
/// row. It writes the logits (scores scaled and masked, as the model's softmax
/// takes them) and `exp(logits - max(running max, the row's largest logit))`.
pub type ChunkStep<'a> = dyn Fn(usize, usize, usize, usize, usize, &[f32], &[f32], &mut [f32], &mut [f32]) -> Result<(), String>
    + Sync
    + 'a;

/// The softmax between the products: over whole rows of scores, or over
/// chunks of keys (when the plan has a chunk).
#[derive(Clone, Copy)]
pub enum Softmax<'s, 'a> {
    Rows(&'s SoftmaxStep<'a>),
    Chunks(&'s ChunkStep<'a>),
}

/// How a call takes its keys: whole rows of scores, or chunks of this many.
#[derive(Clone, Copy)]
enum Mode<'s, 'a> {
    Rows(&'s SoftmaxStep<'a>),
    Chunks(&'s ChunkStep<'a>, usize),
}

/// The most query rows of a task.
const MAX_BLOCK: usize = 64;

/// Whether online softmax pays over `keys` keys for `rows` query rows: when a
/// block of query rows (a full one, or all the rows where they are fewer:
/// a decode step's one) would no longer keep its two whole-row tiles
/// (scores, probabilities) in less than half of `l2`. Measured on the 2-core
/// Zen 4 (1 MB L2), BERT's attention shape: whole rows 2-3% ahead at T =
/// 256-768, chunks 2-9% ahead from T = 1024 on (BENCHMARKS.md, "Online
/// softmax").
pub fn online_pays(l2: usize, keys: usize, rows: usize) -> bool {
    2 * 4 * keys * rows.clamp(1, MAX_BLOCK) >= l2 / 2
}

/// The query block and the key chunk for online softmax over `keys` keys: a
/// block of up to 64 rows (a multiple of `mr`) and a chunk (a multiple of the
/// scores kernels' width `nr`) such that the block's three tiles (scores,
/// logits, probabilities) fill no more than half of `l2`; `entries` still give
/// every thread two tasks when they can.
pub fn online_blocks(
    l2: usize,
    threads: usize,
    entries: usize,
    rows: usize,
    keys: usize,
    mr: usize,
    nr: usize,
) -> (usize, usize) {
    let (mr, nr) = (mr.max(1), nr.max(1));
    let block = spread(MAX_BLOCK / mr * mr, mr, entries, rows, threads);
    let chunk = (l2 / 2 / (3 * 4 * block) / nr * nr).clamp(nr, 512 / nr * nr);
    (block, chunk.min(keys.max(1)))
}

/// `block` (a multiple of `mr`), cut to the rows (in whole heights, at least
/// one), lowered a height at a time until `entries × rows` give every thread
/// two tasks (where they can), and at most `rows`.
fn spread(block: usize, mr: usize, entries: usize, rows: usize, threads: usize) -> usize {
    let mut block = block.min(rows.div_ceil(mr) * mr).max(mr);
    while block > mr && entries * rows.div_ceil(block) < 2 * threads {
        block -= mr;
    }
    block.min(rows.max(1))
}

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
    let fit = (l2 / 2 / (2 * 4 * keys.max(1))).clamp(mr, MAX_BLOCK) / mr * mr;
    spread(fit, mr, entries, rows, threads)
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
    softmax: Softmax,
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
    let (_, snr, selem) = plan.scores.check()?;
    let (_, onr, oelem) = plan.output.check()?;
    if (selem, oelem) != (crate::ElemType::F32, crate::ElemType::F32) {
        return Err(KernelError::Shape("attention's products run f32 direct kernels".into()));
    }
    if plan.block == 0 || plan.chunk == Some(0) {
        return Err(KernelError::Shape("an attention block of 0 rows or a chunk of 0 keys".into()));
    }
    // Whole rows (no chunk) or chunks of keys, as the plan says.
    let mode = match (softmax, plan.chunk) {
        (Softmax::Rows(step), None) => Mode::Rows(step),
        (Softmax::Chunks(step), Some(chunk)) => {
            if kt.iter().chain(v).any(|b| matches!(b, BOperand::Packed(_))) {
                return Err(KernelError::Shape("online softmax reads Kᵀ and V as plain views".into()));
            }
            Mode::Chunks(step, chunk)
        }
        _ => return Err(KernelError::Shape("an attention plan's chunk does not match its softmax".into())),
    };
    if o.iter().any(MatMut::is_codes) {
        return Err(KernelError::Shape("fused attention writes floats, an output is codes".into()));
    }
    if rows == 0 || dv == 0 {
        return Ok(());
    }
    if keys == 0 {
        // The product with an empty V is zero (no softmax step runs).
        for m in o.iter_mut() {
            let ldc = m.ldc;
            let data = m.floats()?;
            for i in 0..rows {
                data[i * ldc..i * ldc + dv].fill(0.0);
            }
        }
        return Ok(());
    }
    let blocks = rows.div_ceil(plan.block);
    let tasks = entries * blocks;
    let mut outs: Vec<(CPtr, usize)> = Vec::with_capacity(o.len());
    for m in o.iter_mut() {
        let ldc = m.ldc;
        outs.push((CPtr(m.floats()?.as_mut_ptr()), ldc));
    }
    let parallel = pool.threads() > 1 && tasks > 1;
    let queue = crate::Parts::new(tasks, if parallel { pool.threads() } else { 1 });
    let failed: Mutex<Option<String>> = Mutex::new(None);
    let work = |me: usize| {
        WORKSPACE.with(|ws| {
            let ws = &mut *ws.borrow_mut();
            let tile = plan.block * if let Mode::Chunks(_, c) = mode { c } else { keys };
            // The tiles leave the workspace for the thread's tasks (the products
            // borrow the rest of it) and go back after them.
            let mut scores = std::mem::take(&mut ws.scores);
            let mut probs = std::mem::take(&mut ws.probs);
            let mut logits = std::mem::take(&mut ws.logits);
            let mut row_max = std::mem::take(&mut ws.row_max);
            let mut row_sum = std::mem::take(&mut ws.row_sum);
            if scores.len() < tile {
                scores.resize(tile);
                probs.resize(tile);
            }
            if matches!(mode, Mode::Chunks(..)) {
                if logits.len() < tile {
                    logits.resize(tile);
                }
                if row_max.len() < plan.block {
                    row_max.resize(plan.block, 0.0);
                    row_sum.resize(plan.block, 0.0);
                }
            }
            // A thread's consecutive tasks of one entry pack its Kᵀ once (in whole
            // rows; a chunk's keys differ from task to task).
            ws.keep_b = true;
            ws.b_kept = None;
            while let Some(t) = queue.take(me) {
                let (e, b) = (t / blocks, t % blocks);
                let first = b * plan.block;
                let n = plan.block.min(rows - first);
                let qe = &q[e];
                let qb = MatRef { data: &qe.data[first * qe.rs..], rows: n, ..*qe };
                let (optr, ldo) = outs[e];
                // SAFETY: rows first..first+n of entry e's output are this task's
                // alone (tasks are disjoint (entry, block) pairs), and inside
                // the output (its shape was checked above).
                let ob = CPtr(unsafe { optr.get().add(first * ldo) });
                let softmax = match mode {
                    Mode::Rows(softmax) => softmax,
                    Mode::Chunks(step, chunk) => {
                        let tiles = Tiles { scores: &mut scores, logits: &mut logits, probs: &mut probs };
                        let task = Task { entry: e, first, q: &qb, kt: &kt[e], v: &v[e], o: ob, ldo };
                        if let Err(msg) =
                            online_task(plan, chunk, &task, step, tiles, &mut row_max, &mut row_sum, ws)
                        {
                            failed.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(msg);
                        }
                        continue;
                    }
                };
                let sp = CPtr(scores.as_mut_ptr());
                let cols = 0..keys.div_ceil(snr);
                direct_band(
                    &plan.scores,
                    &qb,
                    &kt[e],
                    sp,
                    keys,
                    0..n,
                    cols,
                    &EpilogueArgs::default(),
                    false,
                    ws,
                );
                if let Err(msg) = softmax(e, first, n, &scores[..n * keys], &mut probs[..n * keys]) {
                    failed.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(msg);
                    continue;
                }
                let pb = MatRef {
                    data: &probs[..n * keys],
                    codes: None,
                    rows: n,
                    cols: keys,
                    rs: keys,
                    cs: 1,
                    taps: None,
                };
                let cols = 0..dv.div_ceil(onr);
                direct_band(
                    &plan.output,
                    &pb,
                    &v[e],
                    ob,
                    ldo,
                    0..n,
                    cols,
                    &EpilogueArgs::default(),
                    false,
                    ws,
                );
            }
            ws.keep_b = false;
            ws.b_kept = None;
            ws.scores = scores;
            ws.probs = probs;
            ws.logits = logits;
            ws.row_max = row_max;
            ws.row_sum = row_sum;
        });
    };
    // A fork-join (waking the pool) costs more than a few microseconds of work.
    let flops = 4.0 * (entries * rows * keys) as f64 * (depth + dv) as f64 / 2.0;
    if parallel && flops >= PARALLEL_FLOPS {
        pool.run_taking(&work);
    } else {
        work(0);
    }
    match failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(msg) => Err(KernelError::Step(msg)),
        None => Ok(()),
    }
}

/// One task of online softmax: a block of query rows of one entry.
struct Task<'t, 'a> {
    entry: usize,
    first: usize,
    /// The block's rows of Q.
    q: &'t MatRef<'a>,
    kt: &'t BOperand<'a>,
    v: &'t BOperand<'a>,
    /// The block's first output row, rows `ldo` apart.
    o: CPtr,
    ldo: usize,
}

/// A thread's tiles, each at least `block × chunk`.
struct Tiles<'w> {
    scores: &'w mut [f32],
    logits: &'w mut [f32],
    probs: &'w mut [f32],
}

/// Columns `cols` of a plain operand (Kᵀ's keys of a chunk).
fn columns<'a>(b: &BOperand<'a>, cols: std::ops::Range<usize>) -> MatRef<'a> {
    let BOperand::Plain(m) = b else { unreachable!("online softmax takes plain operands (checked)") };
    MatRef { data: &m.data[cols.start * m.cs..], cols: cols.len(), ..*m }
}

/// Rows `rows` of a plain operand (V's rows of a chunk's keys).
fn rows_of<'a>(b: &BOperand<'a>, rows: std::ops::Range<usize>) -> MatRef<'a> {
    let BOperand::Plain(m) = b else { unreachable!("online softmax takes plain operands (checked)") };
    MatRef { data: &m.data[rows.start * m.rs..], rows: rows.len(), ..*m }
}

/// Online softmax over one task's rows: for each chunk of keys, the scores, the
/// chunk step (logits, `exp(logits - m_new)`), the rows' running maxima and
/// sums, the output rescaled where the maximum rose, and `O += P·V` (skipped
/// where every probability of the chunk is 0: keys a mask hides from the whole
/// block); at the end the output is divided by the sums.
#[allow(clippy::too_many_arguments)]
fn online_task(
    plan: &AttentionPlan,
    chunk: usize,
    t: &Task,
    step: &ChunkStep,
    tiles: Tiles,
    row_max: &mut [f32],
    row_sum: &mut [f32],
    ws: &mut crate::gemm::Workspace,
) -> Result<(), String> {
    let n = t.q.rows;
    let (_, keys) = t.kt.dims();
    let (_, dv) = t.v.dims();
    let snr = plan.scores.kernels[0].kernel.nr;
    let onr = plan.output.kernels[0].kernel.nr;
    let (m, l) = (&mut row_max[..n], &mut row_sum[..n]);
    m.fill(f32::NEG_INFINITY);
    l.fill(0.0);
    let mut at = 0;
    while at < keys {
        let len = chunk.min(keys - at);
        let tile = n * len;
        let (s, lg, p) = (&mut tiles.scores[..tile], &mut tiles.logits[..tile], &mut tiles.probs[..tile]);
        let kc = BOperand::Plain(columns(t.kt, at..at + len));
        let sp = CPtr(s.as_mut_ptr());
        direct_band(
            &plan.scores,
            t.q,
            &kc,
            sp,
            len,
            0..n,
            0..len.div_ceil(snr),
            &EpilogueArgs::default(),
            false,
            ws,
        );
        step(t.entry, t.first, n, at, len, s, m, lg, p)?;
        // Whether any key of the chunk weighs anything: a chunk a causal or padding
        // mask hides from every row of the block adds nothing to the output.
        let mut weighs = false;
        for r in 0..n {
            let (lr, pr) = (&lg[r * len..(r + 1) * len], &mut p[r * len..(r + 1) * len]);
            let m_new = m[r].max(row_max_of(lr));
            let alpha = if m_new == f32::NEG_INFINITY {
                // Every logit so far is -inf: the step's exp(-inf - -inf) is NaN;
                // these keys weigh nothing yet (the whole row: 0/0, as softmax gives).
                pr.fill(0.0);
                1.0
            } else {
                (m[r] - m_new).exp()
            };
            let sum = row_sum_of(pr);
            // The probabilities are at least 0 (or NaN, which is not 0).
            weighs |= sum != 0.0;
            l[r] = l[r] * alpha + sum;
            if at > 0 && alpha != 1.0 {
                scale_row(t, r, dv, alpha);
            }
            m[r] = m_new;
        }
        if !weighs && at > 0 {
            at += len;
            continue;
        }
        let pb = MatRef { data: p, codes: None, rows: n, cols: len, rs: len, cs: 1, taps: None };
        let vc = BOperand::Plain(rows_of(t.v, at..at + len));
        direct_band(
            &plan.output,
            &pb,
            &vc,
            t.o,
            t.ldo,
            0..n,
            0..dv.div_ceil(onr),
            &EpilogueArgs::default(),
            at > 0,
            ws,
        );
        at += len;
    }
    for (r, &sum) in l.iter().enumerate() {
        if sum == 0.0 && plan.zero_empty_rows {
            zero_row(t, r, dv);
        } else {
            scale_row(t, r, dv, 1.0 / sum);
        }
    }
    Ok(())
}

/// Row `r` of a task's output block (its `dv` values) set to 0.
fn zero_row(t: &Task, r: usize, dv: usize) {
    on_output_row(t, r, dv, |row| row.fill(0.0));
}

/// Row `r` of a task's output block (its `dv` values) times `by`.
fn scale_row(t: &Task, r: usize, dv: usize, by: f32) {
    on_output_row(t, r, dv, |row| row.iter_mut().for_each(|x| *x *= by));
}

/// `f` of row `r` of a task's output block: its `dv` values.
fn on_output_row(t: &Task, r: usize, dv: usize, f: impl FnOnce(&mut [f32])) {
    // SAFETY: row r < the block's rows of the task's output (this task's alone:
    // tasks are disjoint (entry, block) pairs), `dv` values inside the output
    // whose shape `attention` checked.
    f(unsafe { std::slice::from_raw_parts_mut(t.o.get().add(r * t.ldo), dv) })
}

/// The largest value of a row (16 lanes, so that it vectorizes).
fn row_max_of(r: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 16];
    let mut it = r.chunks_exact(16);
    for c in &mut it {
        for (a, x) in acc.iter_mut().zip(c) {
            *a = if *x > *a { *x } else { *a };
        }
    }
    let tail = it.remainder().iter().fold(f32::NEG_INFINITY, |a, x| if *x > a { *x } else { a });
    acc.iter().fold(tail, |a, x| if *x > a { *x } else { a })
}

/// The sum of a row (16 lanes, so that it vectorizes).
fn row_sum_of(r: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let mut it = r.chunks_exact(16);
    for c in &mut it {
        for (a, x) in acc.iter_mut().zip(c) {
            *a += *x;
        }
    }
    acc.iter().sum::<f32>() + it.remainder().iter().sum::<f32>()
}
