//! The per-shape plan (built once per input-shape signature, then memoized):
//! every dim of the table evaluated, every buffer's size, the arena offsets of
//! the temporaries (first fit by lifetime), each loop step's rows and each
//! matmul's batch entries.

use plan::{BufferKind, ModelPlan, StepKind};
use sym::{Bindings, ShapeEnv};

use crate::RunError;

/// The most elements one buffer may have (larger shapes are an error, not an
/// allocation attempt).
pub const MAX_ELEMS: usize = 1 << 34;

/// Where arena buffers start: a cache line apart.
const ALIGN: usize = 64;

/// One matmul's problem at this shape, and the element offsets of each batch entry.
#[derive(Clone, Debug)]
pub struct MatMulShape {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub rs: [usize; 3],
    pub cs: [usize; 3],
    /// `(a, b, c)` element offsets per batch entry.
    pub entries: Vec<[usize; 3]>,
    /// A read as a convolution's taps over an image from A's offset (implicit GEMM).
    pub taps: Option<kernels::ConvTaps>,
}

/// How a loop step runs at one shape, decided when the shape is planned.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LoopLaunch {
    /// Rows `0..units` of the program (for a one-loop nest, `points`: its
    /// points), split between the threads when `parallel`.
    Loop { units: usize, points: bool, parallel: bool },
    /// For each of `points` points, its reduction of length `len` shared by
    /// `ways` threads (`plan::SplitReduction`).
    Split { points: usize, len: usize, ways: usize },
}

/// Elements of work below which a loop runs on the calling thread: a
/// fork-join costs a few microseconds, more than a small loop takes.
const PARALLEL_MIN: usize = 1 << 15;

/// The most threads that share one reduction (the partials live on the stack).
pub(crate) const MAX_SPLIT: usize = 64;

/// The fewest elements of a split reduction per thread.
const SPLIT_MIN: usize = 1 << 12;

/// How `threads` share a loop of `rows × inner` points whose per-point
/// reduction is `per_point` long (`split_len`: a split reduction's length).
fn launch(
    p: &plan::LoopProgram,
    (rows, inner, per_point): (usize, usize, usize),
    split_len: Option<usize>,
    threads: usize,
) -> LoopLaunch {
    let points = p.schedules.splits_inner;
    let units = if points { inner } else { rows };
    let work = rows.saturating_mul(inner).saturating_mul(per_point);
    if work == 0 {
        return LoopLaunch::Loop { units: 0, points, parallel: false };
    }
    let ways = threads.min(MAX_SPLIT);
    match split_len {
        // Too few points to give every thread one, and a reduction long enough.
        Some(len) if ways > 1 && units < ways && len >= 2 * SPLIT_MIN && work >= PARALLEL_MIN => {
            LoopLaunch::Split { points: units, len, ways: ways.min(len / SPLIT_MIN) }
        }
        _ => LoopLaunch::Loop { units, points, parallel: threads > 1 && units >= 2 && work >= PARALLEL_MIN },
    }
}

#[derive(Clone, Debug)]
pub enum StepShape {
    /// Rows of the nest, elements per row, the length of a reduction computed
    /// per point (1 when none), and how the threads share the loop.
    Loop {
        rows: usize,
        inner: usize,
        per_point: usize,
        launch: LoopLaunch,
    },
    MatMul(MatMulShape),
    /// Fused attention (boxed: the largest shape, and the rarest).
    Attention(Box<AttentionShape>),
}

/// Everything a call at one shape needs besides the data.
#[derive(Debug)]
pub struct ShapePlan {
    pub dims: Vec<i64>,
    pub numel: Vec<usize>,
    /// Byte offset of each temporary in the arena (unused for other buffers;
    /// with canaries, of the outputs too).
    pub offset: Vec<usize>,
    pub arena_bytes: usize,
    pub steps: Vec<StepShape>,
    /// With canaries: the arena's byte ranges around every buffer placed there
    /// (a margin before it, and from its end to a margin past the next line).
    pub margins: Vec<Margin>,
}

/// A canary margin: arena bytes `range` next to buffer `buf`, which is live
/// (its block reserved) from step `first` to step `last`.
#[derive(Clone, Debug)]
pub struct Margin {
    pub range: std::ops::Range<usize>,
    pub buf: usize,
    pub first: usize,
    pub last: usize,
}

/// Fused attention at one shape: its two products (the softmax's rows are their
/// query rows), and what runs them, chosen once.
#[derive(Clone, Debug)]
pub struct AttentionShape {
    pub scores: MatMulShape,
    pub output: MatMulShape,
    /// The CPU's tasks (`None` on a GPU, whose kernel has its own geometry).
    pub tasks: Option<AttentionTasks>,
}

/// Fused attention's query block and the single-thread direct schedules of its
/// two products at one shape.
#[derive(Clone, Copy, Debug)]
pub struct AttentionTasks {
    pub block: usize,
    /// Keys per chunk of online softmax; `None`: whole rows.
    pub chunk: Option<usize>,
    pub scores: kernels::Schedule,
    pub output: kernels::Schedule,
}

/// Chooses [`AttentionTasks`] for the shapes of an attention's two products
/// (and whether the step has an online softmax program).
pub(crate) type AttentionChoice<'a> =
    dyn Fn(&MatMulShape, &MatMulShape, bool) -> Result<Option<AttentionTasks>, RunError> + 'a;

/// Bytes of canary before and after each buffer (tests: see `CompiledModel::new`).
pub(crate) const MARGIN: usize = 64;

fn usize_of(v: i64, what: &str) -> Result<usize, RunError> {
    usize::try_from(v).map_err(|_| RunError::Shape(format!("{what} is {v}, not a size")))
}

impl ShapePlan {
    /// With `canaries`, every temporary and output is placed in the arena with
    /// [`MARGIN`] bytes on each side, recorded in `margins`.
    pub fn build(
        plan: &ModelPlan,
        env: &ShapeEnv,
        b: &Bindings,
        canaries: bool,
        attention: &AttentionChoice,
        threads: usize,
    ) -> Result<ShapePlan, RunError> {
        let dims = plan
            .dims
            .exprs()
            .iter()
            .map(|e| env.eval(e, b).map_err(|err| RunError::Shape(format!("evaluating {e}: {err}"))))
            .collect::<Result<Vec<i64>, _>>()?;
        let mut numel = Vec::with_capacity(plan.buffers.len());
        for buf in &plan.buffers {
            let v = dims[buf.numel as usize];
            let n = usize::try_from(v)
                .map_err(|_| RunError::Shape(format!("the size of '{}' is {v}, not a size", buf.name)))?;
            if n > MAX_ELEMS || n.checked_mul(buf.dtype.size()).is_none() {
                return Err(RunError::Shape(format!(
                    "'{}' would have {n} elements, more than the {MAX_ELEMS} allowed",
                    buf.name
                )));
            }
            numel.push(n);
        }
        // Temporaries (with canaries, outputs too, live to the end), placed by [`place`].
        let in_arena = |i: usize| match plan.buffers[i].kind {
            BufferKind::Temp => plan.buffers[i].first <= plan.buffers[i].last,
            BufferKind::Output(_) => canaries,
            _ => false,
        };
        let life = |i: usize| match plan.buffers[i].kind {
            BufferKind::Output(_) => (plan.buffers[i].first.min(plan.steps.len()), usize::MAX),
            _ => (plan.buffers[i].first, plan.buffers[i].last),
        };
        let margin = if canaries { MARGIN } else { 0 };
        let mut margins = Vec::new();
        let resident: Vec<usize> = (0..plan.buffers.len()).filter(|i| in_arena(*i)).collect();
        let data = |i: usize| numel[i] * plan.buffers[i].dtype.size();
        let blocks: Vec<Block> = resident
            .iter()
            .map(|&i| {
                let (first, last) = life(i);
                Block { bytes: data(i).div_ceil(ALIGN) * ALIGN + 2 * margin, first, last }
            })
            .collect();
        let (at, arena_bytes) = place(&blocks);
        let mut offset = vec![0usize; plan.buffers.len()];
        for ((&i, &at), b) in resident.iter().zip(&at).zip(&blocks) {
            offset[i] = at + margin;
            if canaries {
                for range in [at..at + margin, at + margin + data(i)..at + b.bytes] {
                    margins.push(Margin { range, buf: i, first: b.first, last: b.last });
                }
            }
        }
        let mut steps = Vec::with_capacity(plan.steps.len());
        for st in &plan.steps {
            steps.push(match &st.kind {
                StepKind::Loop { program, .. } => {
                    let p = &plan.programs[*program];
                    let (rows, inner) = nest(p, &dims)?;
                    let split_len = match p.schedules.split {
                        Some(sr) => Some(extent(p, sr.extent, &dims)?),
                        None => None,
                    };
                    // A row reduction, or the one reduction of a split program.
                    let per_point = match (p.schedules.row_reduction, split_len) {
                        (Some(e), _) => extent(p, e, &dims)?.max(1),
                        (None, Some(l)) => l.max(1),
                        (None, None) => 1,
                    };
                    let launch = launch(p, (rows, inner, per_point), split_len, threads);
                    StepShape::Loop { rows, inner, per_point, launch }
                }
                StepKind::MatMul(mm) => StepShape::MatMul(matmul_shape(mm, &dims)?),
                StepKind::Attention(a) => {
                    let (rows, inner) = nest(&plan.programs[a.softmax], &dims)?;
                    if plan.programs[a.softmax].schedules.splits_inner {
                        return Err(RunError::Internal("fused attention: a softmax that splits its row".into()));
                    }
                    let scores = matmul_shape(&a.scores, &dims)?;
                    let output = matmul_shape(&a.output, &dims)?;
                    // The tiles stand for S and P: one softmax row per query row.
                    if rows != scores.entries.len() * scores.m || inner != scores.n {
                        return Err(RunError::Internal(format!(
                            "fused attention: a softmax of {rows} rows of {inner} over {} entries of {}x{} scores",
                            scores.entries.len(),
                            scores.m,
                            scores.n
                        )));
                    }
                    let tasks = attention(&scores, &output, a.online.is_some())?;
                    StepShape::Attention(Box::new(AttentionShape { scores, output, tasks }))
                }
            });
        }
        Ok(ShapePlan { dims, numel, offset, arena_bytes, steps, margins })
    }
}

/// Rows of a loop program's nest at this shape, and elements per row.
/// A loop extent's value (a dim or a constant).
pub(crate) fn extent(p: &plan::LoopProgram, e: plan::E, dims: &[i64]) -> Result<usize, RunError> {
    let v = match p.exprs.node(e) {
        plan::Node::Dim(s) => dims[*s as usize],
        plan::Node::Const(c) => *c as i64,
        _ => return Err(RunError::Internal("a loop extent is not a dim".into())),
    };
    usize_of(v, "a loop extent")
}

fn nest(p: &plan::LoopProgram, dims: &[i64]) -> Result<(usize, usize), RunError> {
    let ext = |e: plan::E| extent(p, e, dims);
    let total = p.space.iter().try_fold(1usize, |a, e| Ok::<_, RunError>(a.saturating_mul(ext(*e)?)))?;
    let inner = match (p.schedules.scattered, p.row_from()) {
        (Some(sc), _) => ext(p.space[sc.at as usize])?,
        (None, Some(i)) => {
            p.space[i..].iter().try_fold(1usize, |a, e| Ok::<_, RunError>(a.saturating_mul(ext(*e)?)))?
        }
        (None, None) => 1,
    };
    Ok((total.checked_div(inner).unwrap_or(0), inner))
}

/// A matmul's problem at this shape and its batch entries' offsets.
fn matmul_shape(mm: &plan::MatMulStep, dims: &[i64]) -> Result<MatMulShape, RunError> {
    let d = |s: u32| dims[s as usize];
    let ext: Vec<usize> =
        mm.batch.iter().map(|s| usize_of(d(*s), "a batch extent")).collect::<Result<_, _>>()?;
    let count = ext.iter().product::<usize>();
    let views = [&mm.a, &mm.b, &mm.c];
    let mut off = [0usize; 3];
    for (j, v) in views.iter().enumerate() {
        off[j] = usize_of(d(v.offset), "a view offset")?;
    }
    let mut strides = Vec::with_capacity(ext.len());
    for bd in 0..ext.len() {
        let mut st = [0usize; 3];
        for (j, v) in views.iter().enumerate() {
            st[j] = usize_of(d(v.batch[bd]), "a batch stride")?;
        }
        strides.push(st);
    }
    // Entry `e`'s offsets: the view's plus each batch index times its
    // stride, the last batch dim fastest; stepped through like an odometer
    // (wrapping as the sums they equal would in release builds).
    let mut entries = Vec::with_capacity(count);
    let mut at = vec![0usize; ext.len()];
    for _ in 0..count {
        entries.push(off);
        for bd in (0..ext.len()).rev() {
            at[bd] += 1;
            if at[bd] < ext[bd] {
                for j in 0..3 {
                    off[j] = off[j].wrapping_add(strides[bd][j]);
                }
                break;
            }
            at[bd] = 0;
            for j in 0..3 {
                off[j] = off[j].wrapping_sub(strides[bd][j].wrapping_mul(ext[bd] - 1));
            }
        }
    }
    let s = |x: u32| usize_of(d(x), "a stride");
    let taps = match &mm.taps {
        Some(t) => {
            let e = |x: u32| usize_of(d(x), "a convolution's extent");
            let [b, h, w, c] = t.image;
            Some(kernels::ConvTaps {
                batch: e(b)?,
                height: e(h)?,
                width: e(w)?,
                channels: e(c)?,
                strides: [s(t.strides[0])?, s(t.strides[1])?, s(t.strides[2])?],
                out: [e(t.out[0])?, e(t.out[1])?],
                kernel: t.kernel,
                stride: t.stride,
                dilation: t.dilation,
                pad: t.pad,
            })
        }
        None => None,
    };
    Ok(MatMulShape {
        taps,
        m: usize_of(d(mm.m), "M")?,
        n: usize_of(d(mm.n), "N")?,
        k: usize_of(d(mm.k), "K")?,
        rs: [s(mm.a.rs)?, s(mm.b.rs)?, s(mm.c.rs)?],
        cs: [s(mm.a.cs)?, s(mm.b.cs)?, s(mm.c.cs)?],
        entries,
    })
}

/// A block of a call's arena: its bytes and the steps it is live over (both ends
/// included).
#[derive(Clone, Copy, Debug)]
struct Block {
    bytes: usize,
    first: usize,
    last: usize,
}

/// Offsets for `blocks`, and the arena's size: largest first, each at the lowest
/// offset clear of the blocks already placed that are live at the same time
/// (ties by first use). Placed by first use instead, ResNet-50's arena at 224
/// was 53% over the most bytes live at once (11.0 against 7.2 MB) and GPT-2's at
/// seq 128 17%; largest first, the arenas of ResNet-50, BERT-base, GPT-2 and
/// ViT-base are at that bound.
fn place(blocks: &[Block]) -> (Vec<usize>, usize) {
    let mut order: Vec<usize> = (0..blocks.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(blocks[i].bytes), blocks[i].first));
    let mut at = vec![0usize; blocks.len()];
    let mut placed: Vec<usize> = Vec::with_capacity(blocks.len());
    let mut size = 0usize;
    let mut live: Vec<(usize, usize)> = Vec::new();
    for i in order {
        let b = blocks[i];
        live.clear();
        live.extend(
            placed
                .iter()
                .filter(|&&p| blocks[p].first <= b.last && b.first <= blocks[p].last)
                .map(|&p| (at[p], at[p] + blocks[p].bytes)),
        );
        live.sort_unstable();
        let mut offset = 0usize;
        for &(s, e) in &live {
            if offset + b.bytes <= s {
                break;
            }
            offset = offset.max(e);
        }
        at[i] = offset;
        placed.push(i);
        size = size.max(offset + b.bytes);
    }
    (at, size)
}

#[cfg(test)]
mod tests {
    use super::{matmul_shape, place, Block};

    /// Each batch entry's offsets are the views' plus the batch indices
    /// times their strides (the last batch dim fastest), over every count of
    /// batch dims and extents of 1.
    #[test]
    fn batch_entries_are_the_views_strided_offsets() {
        // Slots: 0-2 extents, 3-5 offsets, 6.. strides (A, B, C per dim).
        for ext in [vec![], vec![5], vec![3, 1], vec![2, 3, 4], vec![1, 7, 1]] {
            let nd = ext.len();
            let mut dims: Vec<i64> = ext.iter().map(|&e| e as i64).collect();
            dims.resize(3, 1);
            dims.extend([11, 0, 7]);
            for bd in 0..nd {
                for j in 0..3 {
                    dims.push(((bd + 1) * 100 + j * 13 + 1) as i64);
                }
            }
            let rest = dims.len() as u32;
            dims.extend([2, 3, 4]);
            let view = |buf: usize, j: usize| plan::View {
                buf,
                offset: 3 + j as u32,
                batch: (0..nd).map(|bd| (6 + 3 * bd + j) as u32).collect(),
                rs: rest,
                cs: rest + 1,
            };
            let mm = plan::MatMulStep {
                batch: (0..nd as u32).collect(),
                m: rest,
                n: rest + 1,
                k: rest + 2,
                a: view(0, 0),
                taps: None,
                b: view(1, 1),
                c: view(2, 2),
                weight: false,
                u8s8: false,
                i16: false,
                i16s8: false,
                epilogue: Default::default(),
                a_bf16: None,
                c_bf16: None,
                a_norm: None,
            };
            let s = matmul_shape(&mm, &dims).unwrap();
            let count: usize = ext.iter().product();
            assert_eq!(s.entries.len(), count, "{ext:?}");
            for (e, got) in s.entries.iter().enumerate() {
                let (mut rest, mut want) = (e, [11usize, 0, 7]);
                for bd in (0..nd).rev() {
                    let i = rest % ext[bd];
                    rest /= ext[bd];
                    for (j, w) in want.iter_mut().enumerate() {
                        *w += i * dims[6 + 3 * bd + j] as usize;
                    }
                }
                assert_eq!(*got, want, "{ext:?} entry {e}");
            }
        }
    }

    /// The most bytes live at any one step.
    fn most_live(blocks: &[Block]) -> usize {
        let steps = blocks.iter().map(|b| b.last.min(1000)).max().unwrap_or(0);
        (0..=steps)
            .map(|s| blocks.iter().filter(|b| b.first <= s && s <= b.last).map(|b| b.bytes).sum())
            .max()
            .unwrap_or(0)
    }

    /// Blocks live at the same time never share a byte, and the arena holds
    /// them all, at random sizes and lifetimes.
    #[test]
    fn blocks_live_together_never_overlap() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n) as usize
        };
        for case in 0..400 {
            let count = 1 + next(24);
            let blocks: Vec<Block> = (0..count)
                .map(|_| {
                    let first = next(30);
                    let last = if next(10) == 0 { usize::MAX } else { first + next(8) };
                    let range = if next(3) == 0 { 4 } else { 300 };
                    Block { bytes: 64 * (1 + next(range)), first, last }
                })
                .collect();
            let (at, size) = place(&blocks);
            for (i, a) in blocks.iter().enumerate() {
                assert!(at[i] + a.bytes <= size, "case {case}: block {i} past the arena");
                assert_eq!(at[i] % 64, 0, "case {case}");
                for (j, b) in blocks.iter().enumerate().skip(i + 1) {
                    if a.first <= b.last && b.first <= a.last {
                        let apart = at[i] + a.bytes <= at[j] || at[j] + b.bytes <= at[i];
                        assert!(
                            apart,
                            "case {case}: blocks {i} {a:?} and {j} {b:?} overlap at {} and {}",
                            at[i], at[j]
                        );
                    }
                }
            }
            assert!(size >= most_live(&blocks), "case {case}");
        }
    }

    /// A chain of layers (each output live over two steps, a long-lived skip
    /// beside them, as a residual network's): the arena is the most bytes live
    /// at once, where placing by first use left holes.
    #[test]
    fn a_residual_chain_takes_the_most_bytes_live() {
        let mut blocks = vec![Block { bytes: 4096, first: 0, last: 5 }];
        for (s, bytes) in [1024, 4096, 1024, 8192, 2048].into_iter().enumerate() {
            blocks.push(Block { bytes, first: s, last: s + 1 });
        }
        let (_, size) = place(&blocks);
        assert_eq!(size, most_live(&blocks));
        assert_eq!(size, 4096 + 8192 + 2048);
    }
}
