//! Property tests: random valid graphs verify and round-trip through the text
//! form; random and mutated text never makes the parser (or the verifier) panic.

mod common;

use std::sync::Arc;

use common::*;
use ir::*;
use proptest::prelude::*;
use sym::{lit, sym, Range, ShapeEnv, SymExpr, SymOrigin};

/// One random construction step; the builder reads its fields as choices.
#[derive(Clone, Debug)]
struct Step {
    kind: u8,
    a: u32,
    b: u32,
    c: u32,
    fs: Vec<f32>,
}

fn float() -> impl Strategy<Value = f32> {
    prop_oneof![
        Just(f32::NAN),
        Just(f32::INFINITY),
        Just(f32::NEG_INFINITY),
        Just(-0.0f32),
        Just(f32::MIN_POSITIVE),
        -10.0f32..10.0,
        any::<f32>(),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    (any::<u8>(), any::<u32>(), any::<u32>(), any::<u32>(), prop::collection::vec(float(), 0..30))
        .prop_map(|(kind, a, b, c, fs)| Step { kind, a, b, c, fs })
}

/// Value names: plain, ONNX-style, and ones that need quoting.
const NAMES: [&str; 12] = [
    "x",
    "h",
    "onnx::MatMul_12",
    "/bert/Add_output_0",
    "a b",
    "q\"uote",
    "back\\slash",
    "n\nl",
    "ünï",
    "1.5",
    "",
    "t",
];

struct Builder {
    g: Graph,
    dims: Vec<SymExpr>,
    vals: Vec<ValueId>,
}

impl Builder {
    fn new(flags: u8) -> Builder {
        let mut env = ShapeEnv::new();
        env.declare("batch", Range::at_least(1), SymOrigin::Param).unwrap();
        env.declare("seq", Range::new(1, 512), SymOrigin::Param).unwrap();
        env.declare("h", Range::new(1, 1024), SymOrigin::User).unwrap();
        if flags & 1 != 0 {
            env.set_divisor("seq", 8).unwrap();
        }
        let (batch, seq, h) = (sym("batch"), sym("seq"), sym("h"));
        let mut dims = vec![
            lit(1),
            lit(2),
            lit(3),
            lit(5),
            batch.clone(),
            seq.clone(),
            h.clone(),
            seq.clone() * 2,
            (h.clone() + 1).try_floor_div(2).unwrap(),
            batch.clone() * seq.clone(),
            seq.min(&lit(4)),
            h.clone().try_rem(3).unwrap() + 1,
            seq.clone() - 1,
        ];
        if flags & 2 != 0 {
            // `let unk0 = batch*seq`: the fresh symbol is eliminated.
            let unk = ShapeEnv::fresh(&mut env, "unk");
            env.equate(&unk, &(batch.clone() * seq.clone())).unwrap();
            dims.push(unk);
        }
        if flags & 4 != 0 {
            // `assert 2*k == batch*h`: not solvable for a symbol, kept as a constraint.
            let k = env.declare("k", Range::at_least(0), SymOrigin::Fresh).unwrap();
            env.equate(&(k.clone() * 2), &(batch * h)).unwrap();
            dims.push(k);
        }
        Builder { g: Graph::new(env), dims, vals: vec![] }
    }

    fn dim(&self, r: u32) -> SymExpr {
        self.dims[r as usize % self.dims.len()].clone()
    }

    fn shape(&self, rank: u32, r: u32) -> Vec<SymExpr> {
        (0..rank).map(|i| self.dim(r.rotate_left(i * 5) ^ i)).collect()
    }

    fn name(r: u32) -> &'static str {
        NAMES[r as usize % NAMES.len()]
    }

    fn input(&mut self, t: TensorType, r: u32) -> ValueId {
        let v = self.g.add_input(Self::name(r), t);
        self.vals.push(v);
        v
    }

    fn push(&mut self, op: Op, ins: &[ValueId], t: TensorType, r: u32) -> ValueId {
        let v = self.g.add_node(op, ins.to_vec(), Self::name(r), t);
        self.vals.push(v);
        v
    }

    /// A node whose type `infer` gives.
    fn infer(&mut self, op: Op, ins: &[ValueId], r: u32) -> ValueId {
        let tys: Vec<&TensorType> = ins.iter().map(|v| self.g.ty(*v)).collect();
        let t = infer(&op, &tys, &self.g.env)
            .unwrap_or_else(|e| panic!("generator bug: {e} for {op:?} on {tys:?}"))
            .expect("an op infer determines");
        self.push(op, ins, t, r)
    }

    fn pick(&mut self, r: u32, ok: impl Fn(&TensorType) -> bool) -> ValueId {
        let cands: Vec<ValueId> = self.vals.iter().copied().filter(|v| ok(self.g.ty(*v))).collect();
        if cands.is_empty() {
            // Rank 3 or 4 f32 satisfies every predicate the steps use.
            let t = TensorType::new(DType::F32, self.shape(3 + r % 2, r));
            return self.input(t, r);
        }
        cands[r as usize % cands.len()]
    }

    fn constant(&mut self, s: &Step) -> ValueId {
        let shape: Vec<usize> = match s.a % 6 {
            0 => vec![],
            1 => vec![1 + s.b as usize % 4],
            2 => vec![1 + s.b as usize % 3, 1 + s.c as usize % 3],
            3 => vec![5, 5],
            4 => vec![0],
            _ => vec![2, 1, 1 + s.c as usize % 9],
        };
        let n: usize = shape.iter().product();
        let f = |i: usize| s.fs.get(i % s.fs.len().max(1)).copied().unwrap_or(i as f32 * 0.5);
        let bits = |i: usize| (s.c as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(i as u32 * 7);
        let elems = match s.b % 8 {
            0..=2 => Elems::F32((0..n).map(f).collect()),
            3 => Elems::F64((0..n).map(|i| f(i) as f64 / 3.0).collect()),
            4 => Elems::F16((0..n).map(|i| bits(i) as u16).collect()),
            5 => Elems::I64((0..n).map(|i| bits(i) as i64).collect()),
            6 => Elems::I8((0..n).map(|i| bits(i) as i8).collect()),
            _ => Elems::Bool((0..n).map(|i| bits(i) & 1 == 1).collect()),
        };
        let data = Arc::new(ConstData::from_tensor(&Tensor::new(shape, elems).unwrap()));
        self.infer(Op::Constant(data), &[], s.c)
    }

    fn step(&mut self, s: &Step) {
        let (a, b, c) = (s.a, s.b, s.c);
        let not_bool = |t: &TensorType| t.dtype != DType::Bool;
        match s.kind % 21 {
            0 => {
                let dtype = [DType::F32, DType::F32, DType::I64, DType::Bool, DType::F16][b as usize % 5];
                let t = TensorType::new(dtype, self.shape(a % 4, b));
                self.input(t, c);
            }
            1 => {
                self.constant(s);
            }
            2 => {
                let v = self.pick(a, |_| true);
                let dt = self.g.ty(v).dtype;
                let ops: Vec<UnaryOp> = Op::UNARY
                    .into_iter()
                    .filter(|u| match dt {
                        DType::Bool => *u == UnaryOp::Not,
                        d if d.is_float() => *u != UnaryOp::Not,
                        _ => matches!(u, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sign | UnaryOp::Relu),
                    })
                    .collect();
                self.infer(Op::Unary(ops[b as usize % ops.len()]), &[v], c);
            }
            3 => {
                let v = self.pick(a, |_| true);
                let t = self.g.ty(v).clone();
                let ops: Vec<BinaryOp> = Op::BINARY
                    .into_iter()
                    .filter(|o| {
                        if t.dtype == DType::Bool {
                            o.is_logical() || *o == BinaryOp::Equal
                        } else {
                            !o.is_logical()
                        }
                    })
                    .collect();
                let w = self.pick(c, |u| *u == t);
                self.infer(Op::Binary(ops[b as usize % ops.len()]), &[v, w], c);
            }
            4 => {
                let v = self.pick(a, not_bool);
                let cond = self.infer(Op::Binary(BinaryOp::Less), &[v, v], b);
                self.infer(Op::Select, &[cond, v, v], c);
            }
            5 => {
                let v = self.pick(a, |_| true);
                let dtype = [
                    DType::F32,
                    DType::F64,
                    DType::F16,
                    DType::I8,
                    DType::U8,
                    DType::I32,
                    DType::I64,
                    DType::Bool,
                ][b as usize % 8];
                let t = TensorType::new(dtype, self.g.ty(v).shape.clone());
                self.push(Op::Cast, &[v], t, c);
            }
            6 => {
                // Unsqueeze with a reshape, then broadcast the new 1.
                let v = self.pick(a, |_| true);
                let t = self.g.ty(v).clone();
                let at = b as usize % (t.rank() + 1);
                let mut shape = t.shape.clone();
                shape.insert(at, lit(1));
                let u = self.push(Op::Reshape, &[v], TensorType::new(t.dtype, shape.clone()), c);
                shape[at] = self.dim(c);
                self.push(Op::Broadcast, &[u], TensorType::new(t.dtype, shape), c >> 8);
            }
            7 => {
                let v = self.pick(a, |_| true);
                let t = self.g.ty(v).clone();
                let n = t.numel().unwrap();
                self.push(Op::Reshape, &[v], TensorType::new(t.dtype, vec![n]), c);
            }
            8 => {
                let v = self.pick(a, |t| t.rank() >= 1);
                let r = self.g.ty(v).rank();
                let mut perm: Vec<usize> = (0..r).collect();
                for i in (1..r).rev() {
                    perm.swap(i, (b as usize >> i) % (i + 1));
                }
                self.infer(Op::Transpose { perm }, &[v], c);
            }
            9 => {
                let v = self.pick(a, |t| t.rank() >= 1);
                let t = self.g.ty(v).clone();
                let mut shape = t.shape.clone();
                let mut axes = vec![];
                for (i, d) in t.shape.iter().enumerate() {
                    if (b >> i) & 1 == 0 {
                        continue;
                    }
                    // `d-1` extents only where d >= 1 is provable.
                    let pick = (c >> (2 * i)) % 4;
                    let pick = if pick % 2 == 1 && self.g.env.range(d).lo < 1 { pick - 1 } else { pick };
                    let (start, step, extent) = match pick {
                        0 => (lit(0), 1, d.clone()),
                        1 => (lit(1), 1, d.clone() - 1),
                        2 => (lit(0), 2, (d.clone() + 1).try_floor_div(2).unwrap()),
                        _ => (d.clone() - 1, -1, d.clone()),
                    };
                    axes.push(SliceAxis { axis: i, start, step });
                    shape[i] = extent;
                }
                if b & 0x100 != 0 {
                    axes.reverse();
                }
                self.push(Op::Slice { axes }, &[v], TensorType::new(t.dtype, shape), c);
            }
            10 => {
                let v = self.pick(a, |t| t.rank() >= 1);
                let t = self.g.ty(v).clone();
                let w = self.pick(c, |u| *u == t);
                self.infer(Op::Concat { axis: b as usize % t.rank() }, &[v, w, v], c);
            }
            11 => {
                let v = self.pick(a, |t| t.rank() >= 1);
                let axis = b as usize % self.g.ty(v).rank();
                let idx = if c & 1 == 0 {
                    let t = TensorType::new(DType::I64, self.shape(1 + c % 2, c));
                    self.push(Op::Iota { axis: 0 }, &[], t, c)
                } else {
                    let data = Tensor::new(vec![2], Elems::I32(vec![0, -1])).unwrap();
                    self.infer(Op::Constant(Arc::new(ConstData::from_tensor(&data))), &[], c)
                };
                self.infer(Op::Gather { axis }, &[v, idx], c >> 4);
            }
            12 => {
                let v = self.pick(a, |_| true);
                let r = self.g.ty(v).rank();
                let pads = (0..r)
                    .map(|i| {
                        [(lit(0), lit(0)), (lit(1), lit(2)), (sym("seq"), lit(0))]
                            [(b as usize >> (2 * i)) % 3]
                            .clone()
                    })
                    .collect();
                let mode = match c % 4 {
                    0 => PadMode::Constant(s.fs.first().map_or(0.25, |f| *f as f64 / 7.0)),
                    1 => PadMode::Reflect,
                    2 => PadMode::Wrap,
                    _ => PadMode::Edge,
                };
                self.infer(Op::Pad { pads, mode }, &[v], c);
            }
            13 => {
                let v = self.pick(a, |_| true);
                let r = self.g.ty(v).rank();
                let axes = (0..r).filter(|i| (b >> i) & 1 == 1).collect();
                let op = [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod]
                    [c as usize % 5];
                self.infer(Op::Reduce { op, axes, keep_dims: c & 8 != 0 }, &[v], c);
            }
            14 => {
                let v = self.pick(a, |t| t.rank() >= 2);
                let t = self.g.ty(v).clone();
                let mut shape = t.shape[..t.rank() - 1].to_vec();
                shape[t.rank() - 2] = t.shape[t.rank() - 1].clone();
                shape.push(self.dim(b));
                let w = self.input(TensorType::new(t.dtype, shape), c);
                self.infer(Op::MATMUL, &[v, w], c >> 3);
            }
            15 | 16 => {
                let group = 1 + (b % 2) as i64;
                let (k, m) = (1 + (b >> 1) as usize % 3, 2 * (1 + (b >> 3) as usize % 2));
                let x = self.input(
                    TensorType::new(DType::F32, vec![sym("batch"), lit(2), sym("h"), self.dim(c) + 8]),
                    a,
                );
                let geom = ConvAttrs {
                    strides: vec![1 + (c % 2) as i64, 1],
                    dilations: vec![1, 1 + (c >> 1) as i64 % 2],
                    pads_begin: vec![(c >> 2) as i64 % 2, 0],
                    pads_end: vec![0, (c >> 3) as i64 % 3],
                    group,
                };
                if s.kind % 21 == 15 {
                    let w = self.constant_f32(&[m, 2 / group as usize, k, k], s, c);
                    self.infer(Op::Conv(geom), &[x, w], c);
                } else {
                    let w = self.constant_f32(&[2, m / group as usize, k, k], s, c);
                    let t = TensorType::new(
                        DType::F32,
                        vec![sym("batch"), lit(m as i64), self.dim(a), self.dim(b)],
                    );
                    self.push(Op::ConvTranspose(geom), &[x, w], t, c);
                }
            }
            17 => {
                let v = self.pick(a, |t| t.rank() >= 3);
                let t = self.g.ty(v).clone();
                let sp = t.rank() - 2;
                let kind = match b % 3 {
                    0 => PoolKind::Max,
                    k => PoolKind::Avg { count_include_pad: k == 2 },
                };
                let attrs = PoolAttrs {
                    kind,
                    kernel: vec![1 + (c % 3) as i64; sp],
                    strides: vec![1 + (c >> 2) as i64 % 2; sp],
                    dilations: vec![1; sp],
                    pads_begin: vec![(c >> 3) as i64 % 2; sp],
                    pads_end: vec![0; sp],
                    channels_last: (c >> 4) & 1 == 1,
                };
                let (_, first) = attrs.axes(t.rank());
                let mut shape = t.shape.clone();
                for i in 0..sp {
                    shape[first + i] = self.dim(b >> (i + 2));
                }
                self.push(Op::Pool(attrs), &[v], TensorType::new(t.dtype, shape), c);
            }
            18 => {
                let v = self.pick(a, |t| t.rank() >= 1 && t.dtype != DType::Bool);
                let axis = b as usize % self.g.ty(v).rank();
                self.infer(Op::CumSum { axis, exclusive: c & 1 == 1, reverse: c & 2 == 2 }, &[v], c);
            }
            19 => {
                let shape = self.shape(1 + a % 3, b);
                let dtype = [DType::I64, DType::I32, DType::F32][c as usize % 3];
                let axis = b as usize % shape.len();
                self.push(Op::Iota { axis }, &[], TensorType::new(dtype, shape), c);
            }
            _ => {
                let n = 1 + a as usize % 3;
                let es: Vec<SymExpr> = (0..n).map(|i| self.dim(b >> (4 * i))).collect();
                let shape = if n == 1 && c & 1 == 1 { vec![] } else { vec![lit(n as i64)] };
                self.push(Op::SymConst(es), &[], TensorType::new(DType::I64, shape), c);
            }
        }
    }

    fn constant_f32(&mut self, shape: &[usize], s: &Step, r: u32) -> ValueId {
        let n: usize = shape.iter().product();
        let v = (0..n).map(|i| s.fs.get(i).copied().unwrap_or(i as f32)).collect::<Vec<_>>();
        self.infer(Op::Constant(f32s(shape, &v)), &[], r)
    }
}

fn build(flags: u8, steps: &[Step], outs: u64) -> Graph {
    let mut b = Builder::new(flags);
    for s in steps {
        b.step(s);
    }
    let mut outputs: Vec<ValueId> =
        b.vals.iter().enumerate().filter(|(i, _)| (outs >> (i % 64)) & 1 == 1).map(|(_, v)| *v).collect();
    outputs.extend(b.vals.last());
    b.g.outputs = outputs;
    b.g
}

fn graph() -> impl Strategy<Value = Graph> {
    (any::<u8>(), prop::collection::vec(step(), 1..24), any::<u64>()).prop_map(|(f, s, o)| build(f, &s, o))
}

/// Parse arbitrary text: no panic; errors name an existing line; whatever parses
/// can be verified without panicking and prints to text that round-trips.
fn parse_any(text: &str) {
    let lines = text.lines().count().max(1);
    match parse_graph(text, &|n| (n == "w").then(|| f32s(&[5, 5], &[0.0; 25]))) {
        Err(IrError::Parse { line, .. }) => assert!((1..=lines).contains(&line), "line {line} of {lines}"),
        Err(e) => panic!("not a parse error: {e}"),
        Ok(g) => {
            let _ = verify(&g);
            roundtrip(&g);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_graphs_verify_and_roundtrip(g in graph()) {
        let text = print_graph(&g);
        if let Err(e) = verify(&g) {
            panic!("{e}\n{text}");
        }
        let g2 = roundtrip(&g);
        if let Err(e) = verify(&g2) {
            panic!("parsed graph fails to verify: {e}\n{text}");
        }
        prop_assert_eq!(g2.nodes.len(), g.nodes.len());
        prop_assert_eq!(g2.inputs.len(), g.inputs.len());
        prop_assert_eq!(g2.outputs.len(), g.outputs.len());
    }

    #[test]
    fn truncated_text_never_panics(g in graph(), cut in any::<prop::sample::Index>()) {
        let text = print_graph(&g);
        let ends: Vec<usize> = text.char_indices().map(|(i, _)| i).chain([text.len()]).collect();
        parse_any(&text[..*cut.get(&ends)]);
        // A prefix of whole lines, closed again: usually a valid smaller graph.
        let lines: Vec<&str> = text.lines().collect();
        let k = cut.index(lines.len().saturating_sub(2)) + 1;
        parse_any(&format!("{}\n  output\n}}\n", lines[..k].join("\n")));
    }

    #[test]
    fn mutated_text_never_panics(
        g in graph(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), 0u8..4, prop::sample::select(
            vec!['%', '"', '\\', '[', ']', '(', ')', ',', ':', '=', '@', ' ', '\n', '0', '9', '-', 'x', '{', '}', 'é'],
        )), 1..4),
    ) {
        let mut chars: Vec<char> = print_graph(&g).chars().collect();
        for (at, what, ch) in edits {
            let i = at.index(chars.len() + 1);
            match what {
                0 => chars.insert(i, ch),
                1 if i < chars.len() => { chars.remove(i); }
                2 if i < chars.len() => chars[i] = ch,
                _ => { // duplicate or drop a whole line
                    let text: String = chars.iter().collect();
                    let mut lines: Vec<&str> = text.lines().collect();
                    let k = i % lines.len().max(1);
                    if i % 2 == 0 && !lines.is_empty() { lines.remove(k); } else if let Some(l) = lines.get(k).copied() { lines.insert(k, l); }
                    chars = lines.join("\n").chars().collect();
                }
            }
        }
        parse_any(&chars.iter().collect::<String>());
    }

    #[test]
    fn random_strings_never_panic(s in any::<String>()) {
        parse_any(&s);
        parse_any(&format!("graph {{\n{s}\n  output\n}}\n"));
    }

    #[test]
    fn grammar_soup_never_panics(s in "[graph{}%:=\\[\\](),@ a-z0-9_.\"\\\\\n+*/-]{0,200}") {
        parse_any(&s);
        parse_any(&format!("graph {{\n{s}\n  output\n}}\n"));
        parse_any(&format!("graph {{\n  input %x: f32[2]\n  %y: f32[2] = {s}\n  output %y\n}}\n"));
    }
}
