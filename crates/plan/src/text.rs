//! The readable text form of programs and plans (`anyshape inspect --stage
//! programs`): one `let` per shared or reducing subexpression, the rest inline.

use std::collections::HashMap;
use std::fmt::Write;

use ir::DType;

use crate::expr::{Exprs, Node, E};
use crate::model::{BufferKind, ModelPlan, StepKind, View};
use crate::program::LoopProgram;

/// A program as text; without `names`, parameters and the program are unnamed
/// (the form that decides whether two groups share one kernel).
pub fn print_program(p: &LoopProgram, names: bool) -> String {
    let mut s = String::new();
    let space: Vec<String> = p
        .vars
        .iter()
        .zip(&p.space)
        .map(|(v, e)| {
            format!("{} < {}", expr(&p.exprs, *v, &HashMap::new()), expr(&p.exprs, *e, &HashMap::new()))
        })
        .collect();
    let _ = writeln!(s, "program {}", if names { p.name.as_str() } else { "_" });
    for (i, q) in p.params.iter().enumerate() {
        let shape: Vec<String> = q.shape.iter().map(|e| expr(&p.exprs, *e, &HashMap::new())).collect();
        let kind = if q.written { "out" } else { "in" };
        let name = if names { format!(" \"{}\"", q.name) } else { String::new() };
        let _ = writeln!(s, "  %{i}: {kind} {}[{}]{name}", q.dtype, shape.join(", "));
    }
    if !p.schedules.guards.is_empty() {
        let g: Vec<String> = p.schedules.guards.iter().map(|e| expr(&p.exprs, *e, &HashMap::new())).collect();
        let _ = writeln!(s, "  versions on: {}", g.join(", "));
    }
    if let Some(r) = p.schedules.row_reduction {
        let choice = match p.schedules.points_one_at_a_time {
            None => ": lanes over points, or one point at a time",
            Some(_) => "",
        };
        let _ = writeln!(s, "  row reduction along {}{choice}", expr(&p.exprs, r, &HashMap::new()));
    }
    if let Some(sr) = p.schedules.split {
        let _ = writeln!(
            s,
            "  one point's reduction splits over threads along i{} < {}",
            sr.var,
            expr(&p.exprs, sr.extent, &HashMap::new())
        );
    }
    if let Some(why) = p.schedules.points_one_at_a_time {
        let why = match why {
            crate::OnePointWhy::ExtentVaries => "a reduction's extent varies along the inner axis",
            crate::OnePointWhy::NestedReduction => "a reduction is recomputed inside another (one sum order)",
        };
        let _ = writeln!(s, "  points one at a time: {why}");
    }
    if let Some(n) = p.schedules.unswitched {
        let _ = writeln!(
            s,
            "  unswitched: the stored value's choice among {n} alternatives is made once per row"
        );
    }
    for b in &p.schedules.border_guards {
        let along: Vec<String> = (0..64).filter(|v| b.along >> v & 1 == 1).map(|v| format!("i{v}")).collect();
        let _ = writeln!(
            s,
            "  border: {} tested at a vector's two ends along {}: plain loads inside, masked at the border",
            expr(&p.exprs, b.guard, &HashMap::new()),
            along.join(", ")
        );
    }
    if let Some(il) = p.schedules.interleaved {
        let last = p.inner_var().map_or(String::new(), |v| format!("i{v}"));
        let _ = writeln!(
            s,
            "  interleaved: lanes along i{}, the {} values of {last} computed in turn and stored interleaved",
            il.lanes, il.unrolled
        );
    }
    if let Some(sc) = p.schedules.scattered {
        let _ = writeln!(
            s,
            "  scattered: lanes along i{}, the other variables its rows, each vector stored apart",
            sc.lanes
        );
    }
    if let Some((warp, len)) = p.gpu_warp_schedule() {
        let min = crate::gpu::WARP_ROW_MIN;
        let points = crate::gpu::GpuLoopSchedule::Points.name();
        let _ = match p.exprs.as_int(len) {
            Some(c) if c >= min => writeln!(s, "  gpu: {} (rows of {c})", warp.name()),
            Some(c) => writeln!(s, "  gpu: {points} (rows of {c}, under a warp)"),
            None => {
                let len = expr(&p.exprs, len, &HashMap::new());
                writeln!(s, "  gpu: {} where {len} >= {min}, else {points}", warp.name())
            }
        };
    }
    if let Some(len) = p.gpu_quads(crate::gpu::GpuLoopSchedule::Points) {
        let quads = "quads (4 adjacent points a thread or lane, vector accesses where aligned)";
        let _ = match p.exprs.as_int(len) {
            Some(_) => writeln!(s, "  gpu: {quads}"),
            None => writeln!(s, "  gpu: {quads} where {} % 4 == 0", expr(&p.exprs, len, &HashMap::new())),
        };
    }
    let _ = writeln!(s, "  for {}:", space.join(", "));
    // Shared and reducing subexpressions get a name, in dependence order.
    let mut uses = vec![0usize; p.exprs.len()];
    let mut order = Vec::new();
    let mut seen = vec![false; p.exprs.len()];
    for st in &p.stores {
        count(&p.exprs, st.value, &mut uses, &mut seen, &mut order);
    }
    let mut named: HashMap<E, String> = HashMap::new();
    for e in order {
        let shared =
            uses[e.index()] > 1 && !matches!(p.exprs.node(e), Node::Var(_) | Node::Dim(_) | Node::Const(_));
        if shared || matches!(p.exprs.node(e), Node::Reduce { .. }) {
            let text = expr(&p.exprs, e, &named);
            let name = format!("t{}", named.len());
            let _ = writeln!(s, "    {name}: {} = {text}", p.exprs.dtype(e));
            named.insert(e, name);
        }
    }
    for st in &p.stores {
        let _ = writeln!(s, "    %{}[·] = {}", st.param, expr(&p.exprs, st.value, &named));
    }
    if let Some(rs) = p.schedules.row_scratch {
        let sum = (0..p.exprs.len())
            .map(|i| E(i as u32))
            .find(|e| matches!(p.exprs.node(*e), Node::Reduce { body, .. } if *body == rs.body))
            .and_then(|e| named.get(&e).cloned())
            .unwrap_or_else(|| "a row sum".into());
        let _ = writeln!(
            s,
            "  row scratch: {sum}'s terms are kept in %{} and read back for {}",
            rs.param,
            expr(&p.exprs, rs.twin, &named)
        );
    }
    for (i, c) in p.checks.iter().enumerate() {
        let _ = writeln!(s, "  error #{}: {c}", i + 1);
    }
    s
}

fn count(x: &Exprs, e: E, uses: &mut [usize], seen: &mut [bool], order: &mut Vec<E>) {
    uses[e.index()] += 1;
    if seen[e.index()] {
        return;
    }
    seen[e.index()] = true;
    if let Node::Reduce { vars, .. } = x.node(e) {
        for v in vars {
            let ext = x.extents[*v as usize];
            count(x, ext, uses, seen, order);
        }
    }
    for c in x.node(e).children() {
        count(x, c, uses, seen, order);
    }
    order.push(e);
}

fn constant(x: &Exprs, e: E, bits: u64) -> String {
    let dt = x.dtype(e);
    if dt.is_float() {
        let v = f64::from_bits(bits);
        if dt == DType::F32 {
            format!("{v:?}")
        } else {
            format!("{v:?}:{dt}")
        }
    } else if dt == DType::I64 {
        format!("{}", bits as i64)
    } else {
        format!("{}:{dt}", bits as i64)
    }
}

/// One expression, with the names given so far.
fn expr(x: &Exprs, e: E, named: &HashMap<E, String>) -> String {
    if let Some(n) = named.get(&e) {
        return n.clone();
    }
    let sub = |c: E| expr(x, c, named);
    match x.node(e) {
        Node::Var(v) => format!("i{v}"),
        Node::Dim(d) => format!("d{d}"),
        Node::Const(b) => constant(x, e, *b),
        Node::Load { buf, index, guard } => {
            let idx: Vec<String> = index.iter().map(|i| sub(*i)).collect();
            match guard {
                Some(gd) => format!("%{buf}[{}] if {}", idx.join(", "), sub(*gd)),
                None => format!("%{buf}[{}]", idx.join(", ")),
            }
        }
        Node::Unary(op, a) => format!("{}({})", ir::Op::Unary(*op).name(), sub(*a)),
        Node::Binary(op, a, b) => format!("{}({}, {})", ir::Op::Binary(*op).name(), sub(*a), sub(*b)),
        Node::Select(c, a, b) => format!("select({}, {}, {})", sub(*c), sub(*a), sub(*b)),
        Node::Cast(a) => format!("cast<{}>({})", x.dtype(e), sub(*a)),
        Node::Check { ok, code, value } => format!("check({}, #{code}, {})", sub(*ok), sub(*value)),
        Node::Reduce { combine, vars, body } => {
            let vs: Vec<String> =
                vars.iter().map(|v| format!("i{v} < {}", sub(x.extents[*v as usize]))).collect();
            format!("{combine}({}: {})", vs.join(", "), sub(*body))
        }
    }
}

fn view(v: &View) -> String {
    let batch: Vec<String> = v.batch.iter().map(|d| format!("d{d}")).collect();
    format!("b{}+d{} strides [{}] d{} d{}", v.buf, v.offset, batch.join(", "), v.rs, v.cs)
}

fn epilogue(e: &crate::MatEpilogue) -> String {
    if e.is_identity() {
        return String::new();
    }
    let mut parts = Vec::new();
    if let Some(k) = e.scale {
        parts.push(format!("scale {k:?}"));
    }
    if let Some(b) = e.column_scale {
        parts.push(format!("column scale b{b}"));
    }
    if let Some(b) = e.bias {
        parts.push(format!("bias b{b}"));
    }
    // A residual the program reads is named after it, not summed.
    let of_codes = if e.residual_codes { " (u8 codes)" } else { "" };
    let residual = e.residual.map(|r| format!("residual b{r}{of_codes}"));
    let (read, summed) = match e.function().residual_in_program() {
        true => (residual, None),
        false => (None, residual),
    };
    parts.extend(summed);
    match &e.activation {
        crate::Activation::None => {}
        crate::Activation::Pointwise(p) => parts.push(p.to_string()),
        a => parts.push(format!("{a:?}").to_lowercase()),
    }
    let params = e.params.values();
    let params = match params.is_empty() {
        true => String::new(),
        false => format!(" with {}", params.iter().map(|v| format!("{v:?}")).collect::<Vec<_>>().join(", ")),
    };
    let codes = if e.codes { ", stored as u8 codes" } else { "" };
    let read = read.map_or(String::new(), |r| format!(", reading {r}"));
    format!(", epilogue {}{params}{read}{codes}", parts.join(" + "))
}

/// A's view, or the taps it reads: `taps b3+d0 image [d1, d2, d3, d4] strides
/// [d5, d6, d7] out [d8, d9] kernel 3x3 stride 1x1 dilation 1x1 pad 1x1`.
fn a_view(m: &crate::model::MatMulStep) -> String {
    let Some(t) = &m.taps else {
        let norm = match &m.a_norm {
            Some(n) => format!(
                " ({} of b{} by step {}, which a normalizing GEMV skips)",
                if n.norm.centered { "layer norm" } else { "RMS norm" },
                n.x,
                n.step
            ),
            None => String::new(),
        };
        return match m.a_bf16 {
            Some(b) => format!("{} (as bf16 in b{b}){norm}", view(&m.a)),
            None => format!("{}{norm}", view(&m.a)),
        };
    };
    let slots = |s: &[u32]| s.iter().map(|d| format!("d{d}")).collect::<Vec<_>>().join(", ");
    let pair = |p: [usize; 2]| format!("{}x{}", p[0], p[1]);
    let bf16 = m.a_bf16.map(|b| format!(" (image as bf16 in b{b})")).unwrap_or_default();
    format!(
        "taps b{}+d{} image [{}] strides [{}] out [{}] kernel {} stride {} dilation {} pad {}{bf16}",
        m.a.buf,
        m.a.offset,
        slots(&t.image),
        slots(&t.strides),
        slots(&t.out),
        pair(t.kernel),
        pair(t.stride),
        pair(t.dilation),
        pair(t.pad)
    )
}

fn matmul(m: &crate::model::MatMulStep) -> String {
    let batch: Vec<String> = m.batch.iter().map(|d| format!("d{d}")).collect();
    format!(
        "[{}] m d{} n d{} k d{}{}{}: A {} · B {} → C {}{}",
        batch.join(", "),
        m.m,
        m.n,
        m.k,
        if m.weight { " (weight)" } else { "" },
        match (m.u8s8, m.i16s8, m.i16) {
            (true, _, _) => " (u8·s8)",
            (false, true, _) => " (i16·s8)",
            (false, false, true) => " (i16)",
            _ => "",
        },
        a_view(m),
        view(&m.b),
        match m.c_bf16 {
            Some(b) => format!("{} (also as bf16 in b{b})", view(&m.c)),
            None => view(&m.c),
        },
        epilogue(&m.epilogue)
    )
}

/// The whole plan: dims, buffers, programs and steps by group.
pub fn print_plan(p: &ModelPlan) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "dims:");
    // Online softmax's scratch slots hold a chunk's keys, set while it runs.
    let mut scratch = std::collections::HashMap::new();
    for st in &p.steps {
        if let StepKind::Attention(a) = &st.kind {
            if let Some(o) = &a.online {
                scratch.insert(o.offset_slot as usize, "the chunk's first key");
                scratch.insert(o.len_slot as usize, "the chunk's keys");
            }
        }
    }
    for (i, e) in p.dims.exprs().iter().enumerate() {
        match scratch.get(&i) {
            Some(what) => writeln!(s, "  d{i} = {what}, set per chunk"),
            None => writeln!(s, "  d{i} = {e}"),
        }
        .ok();
    }
    let _ = writeln!(s, "buffers:");
    for (i, b) in p.buffers.iter().enumerate() {
        let shape: Vec<String> = b.shape.iter().map(|d| d.to_string()).collect();
        let kind = match &b.kind {
            BufferKind::Input(k) => format!("input {k}"),
            BufferKind::Output(k) => format!("output {k}"),
            BufferKind::Constant(c) => match c.weight_codes() {
                // A weight-only quantized weight's values: its codes go with them.
                Some(w) => format!("constant ({}-bit codes, groups of {})", w.bits, w.group),
                None => "constant".to_string(),
            },
            BufferKind::Packed => "packed weight".to_string(),
            BufferKind::Temp if b.first > b.last => "temp, unused".to_string(),
            BufferKind::Temp => format!("temp, steps {}..={}", b.first, b.last),
        };
        let _ = writeln!(s, "  b{i}: {}[{}] \"{}\" ({kind})", b.dtype, shape.join(", "), b.name);
    }
    for (i, prog) in p.programs.iter().enumerate() {
        let _ = write!(s, "p{i}: {}", print_program(prog, true));
    }
    for (gi, g) in p.groups.iter().enumerate() {
        let _ = writeln!(s, "group {gi}: {}", g.kind);
        for st in &p.steps[g.steps.clone()] {
            match &st.kind {
                StepKind::Loop { program, args } => {
                    let a: Vec<String> = args.iter().map(|b| format!("b{b}")).collect();
                    let _ = writeln!(s, "  loop p{program}({})", a.join(", "));
                }
                StepKind::MatMul(m) => {
                    let _ = writeln!(s, "  matmul {}", matmul(m));
                }
                StepKind::Attention(a) => {
                    let args: Vec<String> = a
                        .args
                        .iter()
                        .enumerate()
                        .map(|(i, b)| match i {
                            _ if i == a.scores_param => "scores".to_string(),
                            _ if i == a.probs_param => "probs".to_string(),
                            _ => format!("b{b}"),
                        })
                        .collect();
                    let _ = writeln!(s, "  attention, fused per block of query rows:");
                    let _ = writeln!(s, "    scores = matmul {}", matmul(&a.scores));
                    let _ = writeln!(s, "    probs = p{}({})", a.softmax, args.join(", "));
                    let _ = writeln!(s, "    matmul {}", matmul(&a.output));
                    if let Some(o) = &a.online {
                        let _ = writeln!(
                            s,
                            "    long rows: keys in chunks (offset d{}, length d{}), online softmax p{}",
                            o.offset_slot, o.len_slot, o.program
                        );
                    }
                }
            }
        }
    }
    s
}
