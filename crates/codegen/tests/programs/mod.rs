//! Epilogue programs the CPU's micro-kernels and the GPU family are both
//! tested with (`tests/microkernels.rs`, `tests/nvptx.rs`).

/// Epilogue programs that use every operation: ReLU6, SiLU, hard-swish, a
/// leaky ReLU's select, and one of each remaining unary operation.
pub fn pointwise_programs() -> [plan::Pointwise; 6] {
    use plan::{Pointwise, PwBinary as B, PwCmp, PwOp as O, PwUnary as U};
    type Push<'a> = dyn FnMut(O) -> u8 + 'a;
    let build = |f: &dyn Fn(&mut Push)| {
        let mut p = Pointwise::empty();
        f(&mut |op| p.push(op).expect("a valid program"));
        p
    };
    let k = |v: f32| O::Const(v.to_bits());
    [
        build(&|push| {
            let x = push(O::Input);
            let (z, six) = (push(k(0.0)), push(k(6.0)));
            let m = push(O::Binary(B::Max, x, z));
            push(O::Binary(B::Min, m, six));
        }),
        build(&|push| {
            let x = push(O::Input);
            let s = push(O::Unary(U::Sigmoid, x));
            push(O::Binary(B::Mul, x, s));
        }),
        build(&|push| {
            let x = push(O::Input);
            let (three, z, six) = (push(k(3.0)), push(k(0.0)), push(k(6.0)));
            let a = push(O::Binary(B::Add, x, three));
            let r = push(O::Binary(B::Max, a, z));
            let c = push(O::Binary(B::Min, r, six));
            let m = push(O::Binary(B::Mul, x, c));
            push(O::Binary(B::Div, m, six));
        }),
        build(&|push| {
            let x = push(O::Input);
            let (z, a) = (push(k(0.0)), push(k(0.01)));
            let ax = push(O::Binary(B::Mul, x, a));
            push(O::Select(PwCmp::Less, x, z, ax, x));
        }),
        build(&|push| {
            let x = push(O::Input);
            let one = push(k(1.0));
            let ab = push(O::Unary(U::Abs, x));
            let ab1 = push(O::Binary(B::Add, ab, one));
            let l = push(O::Unary(U::Log, ab1));
            let s = push(O::Unary(U::Sqrt, ab));
            let na = push(O::Unary(U::Neg, ab));
            let e = push(O::Unary(U::Exp, na));
            let r = push(O::Unary(U::Reciprocal, ab1));
            let t = push(O::Unary(U::Tanh, x));
            let q = push(O::Unary(U::Erf, x));
            let u = push(O::Unary(U::Relu, x));
            let mut acc = push(O::Binary(B::Add, l, s));
            for v in [e, r, t, q, u] {
                acc = push(O::Binary(B::Add, acc, v));
            }
            push(O::Select(PwCmp::GreaterEq, x, one, acc, x));
        }),
        // Discontinuous: checked only where the value before it is exact.
        build(&|push| {
            let x = push(O::Input);
            let h = push(k(0.5));
            let xh = push(O::Binary(B::Mul, x, h));
            let f = push(O::Unary(U::Floor, xh));
            let c = push(O::Unary(U::Ceil, xh));
            push(O::Binary(B::Sub, c, f));
        }),
    ]
}

/// Whether an epilogue's program rounds (the last of [`pointwise_programs`]).
pub fn rounds(ep: &plan::Epilogue) -> bool {
    matches!(ep.activation, plan::Activation::Pointwise(p) if p.to_string().contains("floor"))
}
