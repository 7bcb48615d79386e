//! The oracle for the GPU kernels: a plain product on the host, in f64, of the same
//! 16-bit inputs, with the same epilogue; and the tolerance a 16-bit result of an
//! f32-accumulated product is held to.

use crate::kernel::{Activation, BLayout, ElemType, Epilogue, Problem};
use half::{bf16, f16};

/// 16-bit storage of a GPU kernel's element type, as raw bits (rounded to
/// nearest even, denormals kept, as `cvt.rn` does). `GemmKernel::check` refuses
/// f32 operands, so no kernel's data is f32 here.
pub fn to_bits(elem: ElemType, x: f32) -> u16 {
    match elem {
        ElemType::Bf16 => bf16::from_f32(x).to_bits(),
        ElemType::F16 => f16::from_f32(x).to_bits(),
        ElemType::F32 | ElemType::U8S8 | ElemType::I16 | ElemType::I16S8 => {
            unreachable!("GPU kernels' operands are 16-bit (GemmKernel::check refuses others)")
        }
    }
}

pub fn from_bits(elem: ElemType, b: u16) -> f32 {
    match elem {
        ElemType::Bf16 => bf16::from_bits(b).to_f32(),
        ElemType::F16 => f16::from_bits(b).to_f32(),
        ElemType::F32 | ElemType::U8S8 | ElemType::I16 | ElemType::I16S8 => {
            unreachable!("GPU kernels' operands are 16-bit (GemmKernel::check refuses others)")
        }
    }
}

/// `erf` by Abramowitz and Stegun 7.1.26 refined (|error| < 1.2e-7), in f64.
pub fn erf(x: f64) -> f64 {
    // The complementary error function's Chebyshev fit (Numerical Recipes' erfcc).
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let erfc = t * poly.exp();
    if x >= 0.0 {
        1.0 - erfc
    } else {
        erfc - 1.0
    }
}

/// An epilogue's activation in f64 (GELU's erf by the fit above; a program's
/// own scalar meaning, in f32).
pub fn activation(act: Activation, x: f64) -> f64 {
    match act {
        Activation::None => x,
        Activation::Relu => {
            if x < 0.0 {
                0.0
            } else {
                x
            }
        }
        Activation::GeluTanh => {
            0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
        }
        Activation::Gelu => 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2)),
        Activation::Tanh => x.tanh(),
        Activation::Pointwise(p) => p.eval(x as f32) as f64,
    }
}

/// Operands of one check, as 16-bit bits, contiguous: A `[batch, m, k]`, B
/// `[batch, n, k]` or `[batch, k, n]` as the problem's layout says, bias `[n]`,
/// residual `[batch, m, n]`.
pub struct Operands<'a> {
    pub elem: ElemType,
    pub a: &'a [u16],
    pub b: &'a [u16],
    pub bias: &'a [u16],
    pub residual: &'a [u16],
}

/// `C = epilogue(A·B)` in f64, `[batch, m, n]`.
pub fn gemm(p: &Problem, epi: &Epilogue, o: &Operands) -> Vec<f64> {
    let Problem { batch, m, n, k, b: b_layout, .. } = *p;
    let v = |x: u16| from_bits(o.elem, x) as f64;
    let mut c = vec![0.0; batch * m * n];
    for z in 0..batch {
        let a = &o.a[z * m * k..(z + 1) * m * k];
        let b = &o.b[z * n * k..(z + 1) * n * k];
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0;
                for l in 0..k {
                    let bv = match b_layout {
                        BLayout::KMajor => b[j * k + l],
                        _ => b[l * n + j],
                    };
                    s += v(a[i * k + l]) * v(bv);
                }
                if let Some(k) = epi.scale {
                    s *= k as f64;
                }
                if epi.bias {
                    s += v(o.bias[j]);
                }
                if epi.residual {
                    s += v(o.residual[(z * m + i) * n + j]);
                }
                s = activation(epi.activation, s);
                c[(z * m + i) * n + j] = s;
            }
        }
    }
    c
}

/// Whether a 16-bit result `got` of an f32-accumulated product is within what
/// rounding explains: the 16-bit output's rounding (half a unit in the last place:
/// 2⁻⁸ relative for bf16, 2⁻¹¹ for f16), doubled; f32 accumulation's error, well
/// under 10⁻⁴ of `scale` (the products' typical magnitude) at these K; and where the
/// epilogue is `approximate` (GELU, tanh: see `kernel::epilogue_approximate`),
/// `tanh.approx`'s and `ex2.approx`'s 2⁻¹¹ relative error on a pre-activation a
/// few `scale` large.
pub fn close(elem: ElemType, got: f32, want: f64, scale: f64, approximate: bool) -> bool {
    let ulp = match elem {
        ElemType::Bf16 => 2f64.powi(-8),
        ElemType::F16 => 2f64.powi(-11),
        ElemType::F32 | ElemType::U8S8 | ElemType::I16 | ElemType::I16S8 => 2f64.powi(-24),
    };
    let approx = if approximate { 2e-3 * scale } else { 0.0 };
    let tol = 2.0 * ulp * want.abs() + 1e-4 * scale + approx;
    got.is_finite() && (got as f64 - want).abs() <= tol
}
