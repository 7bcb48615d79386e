//! Hand-checked tests of the constant, element-wise, select and cast ops.

mod common;

use std::sync::Arc;

use common::reference::{self, RefError};
use common::*;
use ir::{BinaryOp as B, ConstData, DType, Elems, Graph, Op, Tensor, TensorType, UnaryOp as U};
use sym::{lit, sym, Range, ShapeEnv, SymOrigin};

fn un(op: U, x: Tensor) -> Tensor {
    eval(Op::Unary(op), &[x])
}
fn bin(op: B, a: Tensor, b: Tensor) -> Tensor {
    eval(Op::Binary(op), &[a, b])
}
fn f(v: &[f32]) -> Tensor {
    f32t(&[v.len()], v)
}
fn i(v: &[i64]) -> Tensor {
    i64t(&[v.len()], v)
}
const NAN: f32 = f32::NAN;

#[test]
fn constant_decodes_its_data() {
    for t in [f32t(&[2, 2], &[1.0, -2.0, 3.5, 0.0]), i64t(&[3], &[-1, 0, 1 << 40]), boolt(&[], &[true])] {
        let got = eval(Op::Constant(Arc::new(ConstData::from_tensor(&t))), NO_INPUTS);
        assert_eq!(got, t);
    }
}

/// A graph with input `x: f32[seq, 2]` for ops that read the bindings.
fn with_seq(op: Op, out: TensorType, seq: usize) -> Result<Tensor, RefError> {
    let mut env = ShapeEnv::new();
    let s = env.declare("seq", Range::at_least(1), SymOrigin::User).unwrap();
    let mut g = Graph::new(env);
    g.add_input("x", TensorType::new(DType::F32, vec![s, lit(2)]));
    let y = g.add_node(op, vec![], "y", out);
    g.outputs.push(y);
    let x = f32t(&[seq, 2], &vec![0.0; seq * 2]);
    Ok(reference::run(&g, &[("x", x)])?.remove(0).1)
}

#[test]
fn sym_const_evaluates_dims() {
    let s = sym("seq");
    let e = vec![s.clone(), s.try_mul(&lit(3)).unwrap().try_add(&lit(1)).unwrap()];
    let got = with_seq(Op::SymConst(e), TensorType::fixed(DType::I64, &[2]), 4).unwrap();
    assert_eq!(got, i64t(&[2], &[4, 13]));
    // Rank-0 output: a scalar.
    let got = with_seq(Op::SymConst(vec![s]), TensorType::fixed(DType::I64, &[]), 7).unwrap();
    assert_eq!(got, i64t(&[], &[7]));
}

#[test]
fn iota_counts_along_its_axis() {
    assert_eq!(
        eval_to(Op::Iota { axis: 1 }, NO_INPUTS, DType::I64, &[2, 3]),
        i64t(&[2, 3], &[0, 1, 2, 0, 1, 2])
    );
    assert_eq!(
        eval_to(Op::Iota { axis: 0 }, NO_INPUTS, DType::F32, &[2, 3]),
        f32t(&[2, 3], &[0., 0., 0., 1., 1., 1.])
    );
    // The extent comes from the bindings.
    let ty = TensorType::new(DType::I32, vec![sym("seq")]);
    assert_eq!(with_seq(Op::Iota { axis: 0 }, ty, 4).unwrap(), i32t(&[4], &[0, 1, 2, 3]));
    let err =
        try_eval(Op::Iota { axis: 2 }, NO_INPUTS, Some(TensorType::fixed(DType::I64, &[2, 3]))).unwrap_err();
    assert!(err.to_string().contains("axis 2 is out of range"), "{err}");
}

#[test]
fn float_unary_ops() {
    let x = f(&[-1.5, 0.0, 0.5, 2.0]);
    let cases: [(U, [f32; 4]); 10] = [
        (U::Neg, [1.5, -0.0, -0.5, -2.0]),
        (U::Abs, [1.5, 0.0, 0.5, 2.0]),
        (U::Relu, [0.0, 0.0, 0.5, 2.0]),
        (U::Floor, [-2.0, 0.0, 0.0, 2.0]),
        (U::Ceil, [-1.0, 0.0, 1.0, 2.0]),
        (U::Sign, [-1.0, 0.0, 1.0, 1.0]),
        (U::Exp, [0.22313016, 1.0, 1.6487213, 7.389056]),
        (U::Tanh, [-0.9051483, 0.0, 0.46211717, 0.9640276]),
        (U::Sigmoid, [0.18242553, 0.5, 0.62245935, 0.8807971]),
        (U::Sin, [-0.997495, 0.0, 0.47942555, 0.9092974]),
    ];
    for (op, want) in cases {
        let got = f32s(&un(op, x.clone()));
        let want: Vec<f64> = want.iter().map(|v| *v as f64).collect();
        assert_close(&got.iter().map(|v| *v as f64).collect::<Vec<_>>(), &want, 1e-6);
    }
    let y = f(&[0.25, 1.0, 4.0, 100.0]);
    assert_eq!(f32s(&un(U::Sqrt, y.clone())), [0.5, 1.0, 2.0, 10.0]);
    assert_eq!(f32s(&un(U::Reciprocal, y.clone())), [4.0, 1.0, 0.25, 0.01]);
    assert_close(&un(U::Log, y).to_f64_vec(), &[-1.3862944, 0.0, 1.3862944, 4.6051702], 1e-6);
    assert_close(&un(U::Cos, f(&[0.0, 1.0])).to_f64_vec(), &[1.0, 0.5403023], 1e-6);
    // Round: half to even.
    let r = un(U::Round, f(&[0.5, 1.5, 2.5, -0.5, -1.5, 2.4, -2.6]));
    assert_eq!(f32s(&r), [0.0, 2.0, 2.0, -0.0, -2.0, 2.0, -3.0]);
    // NaN passes through relu, sign and abs; log of a negative is NaN.
    for op in [U::Relu, U::Sign, U::Abs, U::Neg, U::Exp] {
        assert!(f32s(&un(op, f(&[NAN])))[0].is_nan(), "{op:?}");
    }
    assert!(f32s(&un(U::Log, f(&[-1.0])))[0].is_nan());
}

#[test]
fn erf_is_accurate_in_f32_and_f64() {
    // Python's math.erf.
    let xs = [-3.0, -0.5, 0.0, 1e-3, 0.5, 1.0, 2.0];
    let want = [-0.9999779095030014, -0.5204998778130465, 0.0, 0.0011283787909692365, 0.5204998778130465];
    let want = [&want[..], &[0.8427007929497149, 0.9953222650189527]].concat();
    let got = un(U::Erf, f64t(&[7], &xs)).to_f64_vec();
    assert_close(&got, &want, 1e-14);
    let got = un(U::Erf, f32t(&[7], &xs.map(|x| x as f32))).to_f64_vec();
    let want32: Vec<f64> = want.iter().map(|w| *w as f32 as f64).collect();
    assert_eq!(got, want32, "f32 erf is the correctly rounded f64 value");
}

#[test]
fn bool_and_classification_ops() {
    assert_eq!(bools(&un(U::Not, boolt(&[2], &[true, false]))), [false, true]);
    let x = f(&[1.0, NAN, f32::INFINITY, f32::NEG_INFINITY]);
    assert_eq!(bools(&un(U::IsNaN, x.clone())), [false, true, false, false]);
    assert_eq!(bools(&un(U::IsInf, x)), [false, false, true, true]);
}

#[test]
fn integer_unary_ops() {
    let x = i(&[-3, 0, 5]);
    assert_eq!(i64s(&un(U::Neg, x.clone())), [3, 0, -5]);
    assert_eq!(i64s(&un(U::Abs, x.clone())), [3, 0, 5]);
    assert_eq!(i64s(&un(U::Sign, x.clone())), [-1, 0, 1]);
    assert_eq!(i64s(&un(U::Relu, x)), [0, 0, 5]);
    // i32 arithmetic wraps like two's complement.
    assert_eq!(un(U::Abs, i32t(&[2], &[i32::MIN, -7])), i32t(&[2], &[i32::MIN, 7]));
}

#[test]
fn unsupported_dtypes_are_errors_naming_op_and_dtype() {
    let err = try_eval(Op::Unary(U::Exp), &[i(&[1])], None).unwrap_err();
    assert_eq!(err, RefError::Unsupported { op: "exp", value: "y".into(), dtype: DType::I64 });
    assert_eq!(err.to_string(), "exp computing 'y' does not support i64");
    let ty = Some(TensorType::fixed(DType::Bool, &[1]));
    let err = try_eval(Op::Unary(U::Not), &[f(&[1.0])], ty).unwrap_err();
    assert!(matches!(err, RefError::Unsupported { dtype: DType::F32, .. }), "{err}");
    let err = try_eval(Op::Binary(B::Add), &[boolt(&[1], &[true]), boolt(&[1], &[true])], None).unwrap_err();
    assert!(matches!(err, RefError::Unsupported { op: "add", dtype: DType::Bool, .. }), "{err}");
}

#[test]
fn scalars_and_empty_tensors() {
    assert_eq!(un(U::Neg, f32t(&[], &[2.0])), f32t(&[], &[-2.0]));
    assert_eq!(bin(B::Mul, f32t(&[], &[2.0]), f32t(&[], &[3.0])), f32t(&[], &[6.0]));
    assert_eq!(un(U::Exp, f32t(&[0, 3], &[])), f32t(&[0, 3], &[]));
    assert_eq!(bin(B::Add, i64t(&[2, 0], &[]), i64t(&[2, 0], &[])), i64t(&[2, 0], &[]));
}

#[test]
fn float_arithmetic() {
    let (a, b) = (f(&[1.0, -6.0, 5.5, -5.5]), f(&[4.0, 4.0, 2.0, 2.0]));
    assert_eq!(f32s(&bin(B::Add, a.clone(), b.clone())), [5.0, -2.0, 7.5, -3.5]);
    assert_eq!(f32s(&bin(B::Sub, a.clone(), b.clone())), [-3.0, -10.0, 3.5, -7.5]);
    assert_eq!(f32s(&bin(B::Mul, a.clone(), b.clone())), [4.0, -24.0, 11.0, -11.0]);
    assert_eq!(f32s(&bin(B::Div, a.clone(), b.clone())), [0.25, -1.5, 2.75, -2.75]);
    // fmod: the sign of the dividend.
    assert_eq!(f32s(&bin(B::Mod, a, b)), [1.0, -2.0, 1.5, -1.5]);
    let d = f32s(&bin(B::Div, f(&[1.0, -1.0, 0.0]), f(&[0.0, 0.0, 0.0])));
    assert_eq!(d[..2], [f32::INFINITY, f32::NEG_INFINITY]);
    assert!(d[2].is_nan());
}

#[test]
fn max_min_propagate_nan() {
    let (a, b) = (f(&[1.0, NAN, 3.0, -0.5]), f(&[NAN, 2.0, 1.0, -1.0]));
    let mx = f32s(&bin(B::Max, a.clone(), b.clone()));
    assert!(mx[0].is_nan() && mx[1].is_nan());
    assert_eq!(mx[2..], [3.0, -0.5]);
    let mn = f32s(&bin(B::Min, a, b));
    assert!(mn[0].is_nan() && mn[1].is_nan());
    assert_eq!(mn[2..], [1.0, -1.0]);
    assert_eq!(i64s(&bin(B::Max, i(&[1, -5]), i(&[0, 7]))), [1, 7]);
}

#[test]
fn integer_division_and_mod_signs() {
    let (a, b) = (i(&[7, -7, 7, -7, 6]), i(&[3, 3, -3, -3, 3]));
    // Division truncates toward zero.
    assert_eq!(i64s(&bin(B::Div, a.clone(), b.clone())), [2, -2, -2, 2, 2]);
    // Mod has the sign of the divisor (Python's %).
    assert_eq!(i64s(&bin(B::Mod, a, b)), [1, 2, -2, -1, 0]);
    let a32 = i32t(&[2], &[-9, 9]);
    assert_eq!(bin(B::Mod, a32, i32t(&[2], &[4, -4])), i32t(&[2], &[3, -3]));
    for op in [B::Div, B::Mod] {
        let err = try_eval(Op::Binary(op), &[i(&[1, 2]), i(&[1, 0])], None).unwrap_err();
        assert!(err.to_string().contains("integer division by zero"), "{err}");
        assert!(err.to_string().contains("computing 'y'"), "{err}");
    }
}

#[test]
fn integer_overflow_wraps() {
    let got = bin(B::Add, i32t(&[2], &[i32::MAX, 1]), i32t(&[2], &[1, 1]));
    assert_eq!(got, i32t(&[2], &[i32::MIN, 2]));
    let got = bin(B::Mul, u8t(&[2], &[200, 3]), u8t(&[2], &[2, 4]));
    assert_eq!(got, u8t(&[2], &[144, 12]));
}

#[test]
fn pow_with_mixed_dtypes() {
    // An i64 exponent is cast to the f32 base's dtype.
    let got = eval(Op::Binary(B::Pow), &[f(&[2.0, 3.0, 4.0, -2.0]), i(&[2, 3, -1, 3])]);
    assert_eq!(f32s(&got), [4.0, 27.0, 0.25, -8.0]);
    assert_eq!(f32s(&bin(B::Pow, f(&[4.0, 2.0]), f(&[0.5, -2.0]))), [2.0, 0.25]);
    assert_eq!(i64s(&bin(B::Pow, i(&[2, 3, -2, 5, 1]), i(&[10, 2, 3, -1, -4]))), [1024, 9, -8, 0, 1]);
    assert!(try_eval(Op::Binary(B::Pow), &[i(&[0]), i(&[-1])], None).is_err());
}

#[test]
fn comparisons_and_logic() {
    let (a, b) = (f(&[1.0, 2.0, 3.0, NAN]), f(&[2.0, 2.0, 2.0, NAN]));
    assert_eq!(bools(&bin(B::Equal, a.clone(), b.clone())), [false, true, false, false]);
    assert_eq!(bools(&bin(B::Less, a.clone(), b.clone())), [true, false, false, false]);
    assert_eq!(bools(&bin(B::Greater, a.clone(), b.clone())), [false, false, true, false]);
    assert_eq!(bools(&bin(B::LessEq, a.clone(), b.clone())), [true, true, false, false]);
    assert_eq!(bools(&bin(B::GreaterEq, a, b)), [false, true, true, false]);
    // i64 compares exactly beyond 2^53.
    let big = 1i64 << 60;
    assert_eq!(bools(&bin(B::Equal, i(&[big, big + 1]), i(&[big + 1, big + 1]))), [false, true]);
    let (p, q) = (boolt(&[4], &[false, false, true, true]), boolt(&[4], &[false, true, false, true]));
    assert_eq!(bools(&bin(B::And, p.clone(), q.clone())), [false, false, false, true]);
    assert_eq!(bools(&bin(B::Or, p.clone(), q.clone())), [false, true, true, true]);
    assert_eq!(bools(&bin(B::Xor, p, q)), [false, true, true, false]);
}

#[test]
fn binary_operands_must_match() {
    let ty = Some(TensorType::fixed(DType::F32, &[2]));
    let err = try_eval(Op::Binary(B::Add), &[f(&[1.0, 2.0]), f32t(&[1], &[1.0])], ty).unwrap_err();
    assert!(err.to_string().contains("operand shapes differ"), "{err}");
    let ty = Some(TensorType::fixed(DType::F32, &[1]));
    let err = try_eval(Op::Binary(B::Add), &[f(&[1.0]), i(&[1])], ty).unwrap_err();
    assert!(err.to_string().contains("operand dtypes differ: f32 and i64"), "{err}");
}

#[test]
fn select_picks_per_element() {
    let c = boolt(&[2, 2], &[true, false, false, true]);
    let got = eval(Op::Select, &[c, i64t(&[2, 2], &[1, 2, 3, 4]), i64t(&[2, 2], &[-1, -2, -3, -4])]);
    assert_eq!(got, i64t(&[2, 2], &[1, -2, -3, 4]));
}

#[test]
fn cast_semantics() {
    let cast = |x: Tensor, dt: DType| {
        let dims: Vec<i64> = x.shape().iter().map(|d| *d as i64).collect();
        eval_to(Op::Cast, &[x], dt, &dims)
    };
    // Float → int truncates toward zero, saturates, NaN → 0.
    let x = f(&[1.9, -1.9, 3e10, -3e10, NAN]);
    assert_eq!(cast(x, DType::I32), i32t(&[5], &[1, -1, i32::MAX, i32::MIN, 0]));
    assert_eq!(cast(f(&[-1.5, 300.0]), DType::U8), u8t(&[2], &[0, 255]));
    // Int → narrower int wraps.
    assert_eq!(cast(i(&[300, -1]), DType::U8), u8t(&[2], &[44, 255]));
    // → bool is `x != 0` (NaN is true); bool → number is 0/1.
    assert_eq!(bools(&cast(i(&[0, 2, -1]), DType::Bool)), [false, true, true]);
    assert_eq!(bools(&cast(f(&[0.0, -0.0, 0.1, NAN]), DType::Bool)), [false, false, true, true]);
    assert_eq!(f32s(&cast(boolt(&[2], &[false, true]), DType::F32)), [0.0, 1.0]);
    // f64 → f32 rounds to nearest.
    assert_eq!(f32s(&cast(f64t(&[1], &[0.1]), DType::F32)), [0.1f32]);
    assert_eq!(cast(i(&[(1 << 53) + 1]), DType::F64), f64t(&[1], &[(1u64 << 53) as f64]));
}

#[test]
fn f16_cast_round_trip() {
    let x = f(&[1.0, -2.5, 65504.0, 1e5, 1.0 + 1.0 / 2048.0, 5.96e-8]);
    let h = eval_to(Op::Cast, &[x], DType::F16, &[6]);
    assert_eq!(h.elems(), &Elems::F16(vec![0x3c00, 0xc100, 0x7bff, 0x7c00, 0x3c00, 0x0001]));
    let back = eval_to(Op::Cast, &[&h], DType::F32, &[6]);
    assert_eq!(f32s(&back), [1.0, -2.5, 65504.0, f32::INFINITY, 1.0, 5.9604645e-8]);
    // f16 also moves as data.
    let r = eval_to(Op::Reshape, &[&h], DType::F16, &[2, 3]);
    assert_eq!(r.elems(), h.elems());
}
