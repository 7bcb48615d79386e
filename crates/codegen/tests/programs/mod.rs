//! Epilogue programs the CPU's micro-kernels and the GPU family are both
//! tested with (`tests/microkernels.rs`, `tests/nvptx.rs`), and the u8s8
//! kernels' quantized residual block (`tests/contraction.rs`,
//! `tests/direct_u8s8.rs`).
#![allow(dead_code)]

/// Epilogue programs that use every operation: ReLU6, SiLU, hard-swish, a
/// leaky ReLU's select, and one of each remaining unary operation (and a
/// multiply-add).
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
            // `t·q + acc` rounded once.
            let acc = push(O::MulAdd(t, q, acc));
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

/// A quantized residual block's sum (QDQ ResNet's): the product requantized
/// to its codes (zero point 7), both it and the shortcut's codes (the
/// program's residual, zero point 110) dequantized and added, the sum
/// quantized; its four scales given when it runs (the values returned).
pub fn residual_block() -> (plan::Pointwise, [f32; 4]) {
    use plan::{PwBinary, PwOp};
    let p = block_sum(&mut |push, q, [s1, s2, s3]| {
        let (z0, z1) = (push(PwOp::Const(7f32.to_bits())), push(PwOp::Const(110f32.to_bits())));
        let dq = push(PwOp::Binary(PwBinary::Sub, q, z0));
        let dq = push(PwOp::Binary(PwBinary::Mul, dq, s1));
        let res = push(PwOp::Residual);
        let dr = push(PwOp::Binary(PwBinary::Sub, res, z1));
        let dr = push(PwOp::Binary(PwBinary::Mul, dr, s2));
        let sum = push(PwOp::Binary(PwBinary::Add, dq, dr));
        push(PwOp::Binary(PwBinary::Div, sum, s3))
    });
    (p, [2f32.powi(-12), 0.02, 0.013, 0.031])
}

/// The same sum in one rounding, as `lower` computes it where that gives
/// every pair of codes the same integer (`lower::requantize`): the product's
/// code and the shortcut's in two multiply-adds, `mul_add(q, p1,
/// mul_add(residual, p2, p3))`, with [`residual_block`]'s parameters.
pub fn residual_block_in_one_rounding() -> plan::Pointwise {
    use plan::PwOp;
    block_sum(&mut |push, q, [s1, s2, s3]| {
        let res = push(PwOp::Residual);
        let inner = push(PwOp::MulAdd(res, s2, s3));
        push(PwOp::MulAdd(q, s1, inner))
    })
}

/// A residual block's program: the product's code (`x·p0` rounded, zero
/// point 7, u8), the value `sum(push, code, [p1, p2, p3])` makes of it, that
/// rounded and clamped to u8.
type Push<'a> = dyn FnMut(plan::PwOp) -> u8 + 'a;

fn block_sum(sum: &mut dyn FnMut(&mut Push, u8, [u8; 3]) -> u8) -> plan::Pointwise {
    use plan::{PwBinary, PwOp, PwUnary};
    let mut p = plan::Pointwise::empty();
    let mut push = |op| p.push(op).expect("room");
    let x = push(PwOp::Input);
    let [s0, s1, s2, s3] = [0, 1, 2, 3].map(|i| push(PwOp::Param(i)));
    let scaled = push(PwOp::Binary(PwBinary::Mul, x, s0));
    let r = push(PwOp::Unary(PwUnary::Round, scaled));
    let q = push(PwOp::Integer { x: r, offset: 7, lo: 0, hi: 255 });
    let y = sum(&mut push, q, [s1, s2, s3]);
    let out = push(PwOp::Unary(PwUnary::Round, y));
    push(PwOp::Integer { x: out, offset: 0, lo: 0, hi: 255 });
    p
}
