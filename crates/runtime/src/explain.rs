//! What a compiled model holds and what a call at a shape runs, as text
//! (`anyshape inspect --stage kernels` and `--stage dispatch --shape ...`).

use std::fmt::Write;

use ir::Tensor;
use kernels::{ALayout, BLayout, Problem};
use plan::StepKind;

use crate::shape::{LoopLaunch, StepShape};
use crate::{CompiledModel, RunError};

impl CompiledModel<crate::Cpu> {
    /// The kernels: every contraction family (its epilogue, its packed-panel
    /// micro-kernels and direct kernels with their measured rates) and the loop
    /// programs.
    pub fn kernels_text(&self) -> String {
        let mut s = String::new();
        for (e, d) in &self.backend.dispatchers {
            let f = d.family();
            let _ = writeln!(s, "contraction family, epilogue {e:?}:");
            let tiles: Vec<String> = f
                .variants()
                .iter()
                .map(|v| {
                    let amx = if v.kernel.amx { " amx" } else { "" };
                    format!("{}x{}{amx} ({:.1})", v.kernel.mr, v.kernel.nr, v.gflops)
                })
                .collect();
            let _ = writeln!(s, "  micro-kernels in {} (GFLOP/s, 1 thread): {}", f.elem(), tiles.join(", "));
            let direct: Vec<String> = f
                .direct_variants()
                .iter()
                .map(|v| format!("{}x{} ({:.1})", v.kernel.mr, v.kernel.nr, v.gflops))
                .collect();
            let _ = writeln!(s, "  direct kernels in f32: {}", direct.join(", "));
            let m = d.machine();
            let _ = writeln!(
                s,
                "  machine model: {} threads, peak {:.1} GFLOP/s, L2 {} KiB, DRAM {:.1} GB/s",
                m.threads,
                m.peak_gflops,
                m.l2 / 1024,
                m.dram_bw / 1e9
            );
        }
        let packed: Vec<&kernels::PackedB> = self.backend.packed.iter().flatten().collect();
        let coded: Vec<String> = packed
            .iter()
            .filter_map(|p| {
                p.codes.map(|c| format!("{}x{} ({}-bit, groups of {})", p.k, p.n, c.bits, c.group))
            })
            .collect();
        let _ = writeln!(s, "packed weights: {}, from weight codes: {}", packed.len(), coded.len());
        if !coded.is_empty() {
            let _ = writeln!(s, "  weight codes: {}", coded.join(", "));
        }
        let _ = writeln!(s, "loop programs: {}", self.plan.programs.len());
        for (i, p) in self.plan.programs.iter().enumerate() {
            let _ =
                writeln!(s, "  p{i}: {} ({} stores, {} parameters)", p.name, p.stores.len(), p.params.len());
        }
        let _ = writeln!(s, "threads: {}", self.backend.pool.threads());
        s
    }

    /// What a call with these inputs runs: the shape's arena, and per step the
    /// kernel variant, schedule and thread split chosen for it.
    pub fn dispatch_text(&self, inputs: &[(&str, Tensor)]) -> Result<String, RunError> {
        let sp = self.shape_plan(inputs)?;
        let internal = |e: kernels::KernelError| RunError::Internal(e.to_string());
        let mut s = String::new();
        let _ = writeln!(s, "arena: {} bytes", sp.arena_bytes);
        let threads = self.backend.pool.threads();
        for (i, st) in self.plan.steps.iter().enumerate() {
            let g = st.group;
            let _ = write!(s, "step {i} (group {g}, {}): ", self.plan.groups[g].kind);
            match (&st.kind, &sp.steps[i]) {
                (StepKind::Loop { program, .. }, StepShape::Loop { rows, inner, per_point, launch }) => {
                    let on = match launch {
                        LoopLaunch::Split { ways, .. } => {
                            format!("each point's reduction split over {ways} threads")
                        }
                        LoopLaunch::Loop { parallel: true, points: false, .. } => {
                            format!("rows split over {threads} threads")
                        }
                        LoopLaunch::Loop { parallel: true, points: true, .. } => {
                            format!("points split over {threads} threads")
                        }
                        LoopLaunch::Loop { parallel: false, .. } => "one thread".into(),
                    };
                    let per_point = match per_point {
                        1 => String::new(),
                        r => format!(
                            ", a reduction of {r} per point (one point at a time when {r} fills a vector)"
                        ),
                    };
                    let _ = writeln!(s, "loop p{program}: {rows} rows of {inner}{per_point}, {on}");
                }
                (StepKind::MatMul(mm), StepShape::MatMul(ms)) => {
                    let d = self.backend.dispatcher(mm)?;
                    let b = match &self.backend.packed[i] {
                        Some(p) => BLayout::Packed { nr: p.nr, kc: p.kc },
                        None => BLayout::of(ms.cs[1], ms.n),
                    };
                    // A convolution's taps (as `Dispatcher::problem` sees them).
                    let a = ms.taps.map_or(ALayout::of(ms.cs[0], ms.k), |t| t.layout());
                    let p = Problem { batch: ms.entries.len(), m: ms.m, n: ms.n, k: ms.k, a, b };
                    if ms.entries.is_empty() || ms.m == 0 || ms.n == 0 {
                        let _ = writeln!(s, "matmul {}x{}x{}: empty", ms.m, ms.n, ms.k);
                        continue;
                    }
                    let codes = self.plan.buffers[mm.a.buf].dtype == ir::DType::U8;
                    // The arena's buffers start on whole words; an A of codes is
                    // read as words where K and its rows (or channels) are.
                    let words = codes
                        && (ms.taps.is_some() || ms.cs[0] == 1)
                        && kernels::direct::whole_words(ms.k, ms.m, ms.rs[0], ms.taps);
                    let sched = d.schedule_of(&p, codes, words).map_err(internal)?;
                    let e = mm.epilogue.function();
                    let ep = if e.is_identity() { String::new() } else { format!(", epilogue {e:?}") };
                    let _ = writeln!(
                        s,
                        "matmul {} x [{}x{}x{}] (A {a:?}{}, B {b:?}): {sched}{ep}",
                        p.batch,
                        p.m,
                        p.n,
                        p.k,
                        if codes { " of u8 codes" } else { "" }
                    );
                }
                (StepKind::Attention(at), StepShape::Attention(shape)) => {
                    let Some(tasks) = &shape.tasks else { continue };
                    let scores = &shape.scores;
                    let n = scores.entries.len() * scores.m.div_ceil(tasks.block.max(1));
                    let softmax = match (tasks.chunk, &at.online) {
                        (Some(c), Some(o)) => format!(
                            "online softmax p{} over chunks of {c} keys ({} chunks)",
                            o.program,
                            scores.n.div_ceil(c.max(1))
                        ),
                        _ => format!("softmax p{} over whole rows", at.softmax),
                    };
                    let _ = writeln!(
                        s,
                        "fused attention over {} entries, {} queries x {} keys, depth {}: blocks of {} query rows ({n} tasks), scores {}, output {}, {softmax}",
                        scores.entries.len(),
                        scores.m,
                        scores.n,
                        scores.k,
                        tasks.block,
                        tasks.scores,
                        tasks.output,
                    );
                }
                _ => return Err(RunError::Internal("a step and its shape disagree".into())),
            }
        }
        Ok(s)
    }

    /// Bytes each step's buffers hold at the shape of `inputs`: the distinct
    /// buffers a loop program reads and writes, a matmul's A, B and C (a
    /// packed weight as packed: its codes, bf16 or f32 words), fused
    /// attention's Q, K, V and output. A lower bound on the memory traffic a
    /// memory-bound step needs (its GB/s in `bench --profile --top`).
    pub fn step_bytes(&self, inputs: &[(&str, Tensor)]) -> Result<Vec<usize>, RunError> {
        let sp = self.shape_plan(inputs)?;
        let size = |b: usize| sp.numel[b] * self.plan.buffers[b].dtype.size();
        let sum = |mut bufs: Vec<usize>| {
            bufs.sort_unstable();
            bufs.dedup();
            bufs.into_iter().map(size).sum::<usize>()
        };
        Ok(self
            .plan
            .steps
            .iter()
            .enumerate()
            .map(|(i, st)| match &st.kind {
                StepKind::Loop { args, .. } => sum(args.clone()),
                StepKind::MatMul(m) => match self.backend.packed.get(i).and_then(Option::as_ref) {
                    Some(w) => sum(vec![m.a.buf, m.c.buf]) + 4 * w.words().len(),
                    None => sum(vec![m.a.buf, m.b.buf, m.c.buf]),
                },
                StepKind::Attention(a) => {
                    sum(vec![a.scores.a.buf, a.scores.b.buf, a.output.b.buf, a.output.c.buf])
                }
            })
            .collect())
    }
}
