//! A contraction's epilogue: the element-wise function applied to each output
//! tile while it is in registers, one vocabulary for every backend (the CPU's
//! micro-kernels compile it in; the GPU family builds the forms it has), and
//! its scalar definitions (the generated vector code follows the same formulas).

use crate::model::BufId;
use crate::Pointwise;

/// The activation of an epilogue.
// A program is kept inline (a few hundred bytes): an epilogue is a `Copy`
// value that kernels are keyed by, and a model has a few of them.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Activation {
    #[default]
    None,
    Relu,
    /// `0.5·x·(1 + erf(x/√2))`.
    Gelu,
    /// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
    GeluTanh,
    Tanh,
    /// Any other element-wise function (see [`Pointwise`]).
    Pointwise(Pointwise),
}

impl Activation {
    /// The activation of one value, with the formulas the generated code uses.
    pub fn apply(self, x: f32) -> f32 {
        self.apply_with(x, &[])
    }

    /// [`Self::apply`] with the program's parameters.
    pub fn apply_with(self, x: f32, params: &[f32]) -> f32 {
        self.apply_at(x, f32::NAN, params)
    }

    /// [`Self::apply_with`] where a program reads the residual `residual`
    /// ([`crate::PwOp::Residual`]).
    pub fn apply_at(self, x: f32, residual: f32, params: &[f32]) -> f32 {
        match self {
            Activation::None => x,
            Activation::Relu => {
                if x < 0.0 {
                    0.0
                } else {
                    x
                }
            }
            Activation::Gelu => 0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2)),
            Activation::GeluTanh => 0.5 * x * (1.0 + tanh(GELU_C * (x + 0.044715 * x * x * x))),
            Activation::Tanh => tanh(x),
            Activation::Pointwise(p) => p.eval_at(x, residual, params),
        }
    }

    /// Whether it is a program reading the residual ([`crate::PwOp::Residual`]).
    pub fn reads_residual(&self) -> bool {
        matches!(self, Activation::Pointwise(p) if p.reads_residual())
    }
}

/// An element-wise expression applied to each output tile while it is in
/// registers: `y = act(scale · column_scale[col] · acc + bias[col] +
/// residual[row, col])` (a dense layer's bias and GELU, a residual add,
/// ResNet's `relu(conv + identity)`, a quantized product's dequantization:
/// its scales per column, computed per call when they come from the
/// activation's dynamic quantization). Where the activation is a program
/// reading the residual, the residual is its operand instead of a term of the
/// sum (a quantized residual block). Kernels are compiled and cached per
/// epilogue, so two are equal when they compute the same thing: the scale
/// compares by its bits.
#[derive(Clone, Copy, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Epilogue {
    pub scale: Option<f32>,
    /// Multiply by a vector of `n` values read at the column (before the bias).
    #[serde(default)]
    pub column_scale: bool,
    pub bias: bool,
    pub residual: bool,
    pub activation: Activation,
    /// C is 8-bit codes: each value (an integer in 0..=255, which the compiler
    /// proved of the activation's output) is stored as one byte, where the next
    /// product reads it as its A. Such a product is computed in one K block
    /// (there is no partial sum to keep in a byte).
    #[serde(default)]
    pub codes: bool,
    /// The residual is 8-bit codes (a byte each, its row stride in bytes),
    /// read as the values they hold: a quantized shortcut.
    #[serde(default)]
    pub residual_codes: bool,
}

impl Epilogue {
    /// The identity: the accumulator as it is.
    pub const NONE: Epilogue = Epilogue {
        scale: None,
        column_scale: false,
        bias: false,
        residual: false,
        activation: Activation::None,
        codes: false,
        residual_codes: false,
    };

    /// Field by field, the activation by its kind: the drivers ask at every
    /// tile, and comparing with [`Epilogue::NONE`] copies two programs.
    pub fn is_identity(&self) -> bool {
        let Epilogue { scale, column_scale, bias, residual, activation, codes, residual_codes } = *self;
        scale.is_none()
            && !(column_scale || bias || residual || codes || residual_codes)
            && matches!(activation, Activation::None)
    }

    /// Whether every value the epilogue makes is an integer in 0..=255 by its
    /// own last operation (a quantization's store), so that storing it as a
    /// code needs no clamp.
    pub fn makes_codes(&self) -> bool {
        match self.activation {
            Activation::Pointwise(p) => p.integer_bounds().is_some_and(|(lo, hi)| lo >= 0 && hi <= 255),
            _ => false,
        }
    }

    /// Whether the residual is the program's operand ([`crate::PwOp::Residual`])
    /// rather than a term of the sum the activation is applied to.
    pub fn residual_in_program(&self) -> bool {
        self.residual && self.activation.reads_residual()
    }

    fn key(&self) -> (Option<u32>, bool, bool, bool, Activation, bool, bool) {
        (
            self.scale.map(f32::to_bits),
            self.column_scale,
            self.bias,
            self.residual,
            self.activation,
            self.codes,
            self.residual_codes,
        )
    }
}

impl PartialEq for Epilogue {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Epilogue {}

impl std::hash::Hash for Epilogue {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.key().hash(h)
    }
}

/// A matmul step's epilogue: the function and the buffers it reads.
#[derive(Clone, Copy, Debug, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct MatEpilogue {
    pub scale: Option<f32>,
    /// A vector of `n` values the accumulator is multiplied by.
    #[serde(default)]
    pub column_scale: Option<BufId>,
    /// A vector of `n` values.
    pub bias: Option<BufId>,
    /// A dense tensor in the output's row-major order.
    pub residual: Option<BufId>,
    pub activation: Activation,
    /// The values of the activation's parameters ([`crate::PwOp::Param`]).
    #[serde(default)]
    pub params: EpilogueParams,
    /// C is stored as 8-bit codes ([`Epilogue::codes`]).
    #[serde(default)]
    pub codes: bool,
    /// The residual is 8-bit codes ([`Epilogue::residual_codes`]).
    #[serde(default)]
    pub residual_codes: bool,
}

/// The parameters of an epilogue's program, kept with the step that runs it.
#[derive(Clone, Copy, Debug, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct EpilogueParams {
    values: [f32; crate::MAX_POINTWISE_PARAMS],
    len: u8,
}

impl EpilogueParams {
    /// `None` past [`crate::MAX_POINTWISE_PARAMS`] values.
    pub fn new(values: &[f32]) -> Option<EpilogueParams> {
        let mut p = EpilogueParams::default();
        p.values.get_mut(..values.len())?.copy_from_slice(values);
        p.len = values.len() as u8;
        Some(p)
    }

    pub fn values(&self) -> &[f32] {
        &self.values[..self.len as usize]
    }
}

impl MatEpilogue {
    pub fn is_identity(&self) -> bool {
        *self == MatEpilogue::default()
    }

    /// The buffers it reads: column scales, bias, residual (those it has).
    pub fn buffers(&self) -> impl Iterator<Item = BufId> {
        self.column_scale.into_iter().chain(self.bias).chain(self.residual)
    }

    /// The function a kernel is built for (which operands it reads, not where).
    pub fn function(&self) -> Epilogue {
        Epilogue {
            scale: self.scale,
            column_scale: self.column_scale.is_some(),
            bias: self.bias.is_some(),
            residual: self.residual.is_some(),
            activation: self.activation,
            codes: self.codes,
            residual_codes: self.residual_codes,
        }
    }
}

/// `√(2/π)`.
pub const GELU_C: f32 = 0.797_884_6;

/// Abramowitz & Stegun 7.1.26: |error| < 1.5e-7.
pub const ERF_P: f32 = 0.327_591_1;
pub const ERF_A: [f32; 5] = [0.254_829_6, -0.284_496_74, 1.421_413_7, -1.453_152_1, 1.061_405_4];

/// tanh's odd Taylor series for `|x| < ½`, where `1 - 2/(e^{2x} + 1)` cancels:
/// `tanh x ≈ x + x·x²·P(x²)`, `P`'s coefficients (of `x¹²` down to `x⁰`) highest
/// first, for Horner's rule; its first omitted term is below 1e-8 relative there.
pub const TANH_SERIES: [f64; 7] = [
    -929_569.0 / 638_512_875.0,
    21_844.0 / 6_081_075.0,
    -1_382.0 / 155_925.0,
    62.0 / 2_835.0,
    -17.0 / 315.0,
    2.0 / 15.0,
    -1.0 / 3.0,
];

/// erf's Maclaurin series for `|x| < ½`, where A&S 7.1.26's absolute error of
/// 1.5e-7 is large against the value: `erf x ≈ 2/√π·x·P(x²)`, `P`'s
/// coefficients highest first.
pub const ERF_SERIES: [f64; 7] =
    [1.0 / 9360.0, -1.0 / 1320.0, 1.0 / 216.0, -1.0 / 42.0, 1.0 / 10.0, -1.0 / 3.0, 1.0];

/// `erf(x)` by A&S 7.1.26 (the generated code's formula).
pub fn erf(x: f32) -> f32 {
    let ax = x.abs();
    let t = 1.0 / (1.0 + ERF_P * ax);
    let poly = ERF_A.iter().rev().fold(0.0f32, |acc, a| acc * t + a) * t;
    let y = 1.0 - poly * (-ax * ax).exp();
    if x < 0.0 {
        -y
    } else {
        y
    }
}

/// `tanh(x) = 1 - 2/(e^{2x} + 1)` with the input clamped to ±9 (beyond, f32
/// rounds tanh to ±1), the generated code's formula.
pub fn tanh(x: f32) -> f32 {
    let x = x.clamp(-9.0, 9.0);
    1.0 - 2.0 / ((2.0 * x).exp() + 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PwOp, PwUnary};

    #[test]
    fn formulas_are_accurate() {
        for i in -800..=800 {
            let x = i as f32 / 100.0;
            let (e, t) = (erf(x) as f64, tanh(x) as f64);
            // erf from its series-free reference: f64 tanh and a numeric erf.
            assert!((t - (x as f64).tanh()).abs() < 2e-7, "tanh({x})");
            let want = libm_erf(x as f64);
            // A&S bounds the formula by 1.5e-7; f32 evaluation adds a few ulps.
            assert!((e - want).abs() < 5e-7, "erf({x}) = {e}, want {want}");
        }
        assert_eq!(Activation::Relu.apply(-1.0), 0.0);
        assert!(Activation::Relu.apply(f32::NAN).is_nan());
        assert!((Activation::Gelu.apply(1.0) - 0.841_344_7).abs() < 1e-6);
        assert!((Activation::GeluTanh.apply(1.0) - 0.841_192).abs() < 1e-5);
    }

    /// A store of codes skips its clamp only where the epilogue's own last
    /// operation bounds every value (NaN and overflow included) to a byte's.
    #[test]
    fn codes_made_by_the_epilogue_itself() {
        let quantize = |lo, hi| {
            let mut p = Pointwise::empty();
            let x = p.push(PwOp::Input).unwrap();
            let r = p.push(PwOp::Unary(PwUnary::Round, x)).unwrap();
            p.push(PwOp::Integer { x: r, offset: 3, lo, hi }).unwrap();
            Epilogue { activation: Activation::Pointwise(p), codes: true, ..Epilogue::NONE }
        };
        assert!(quantize(0, 255).makes_codes());
        assert!(quantize(10, 20).makes_codes());
        assert!(!quantize(-128, 127).makes_codes(), "signed bounds");
        assert!(!quantize(0, 256).makes_codes());
        assert!(!Epilogue { activation: Activation::Relu, codes: true, ..Epilogue::NONE }.makes_codes());
    }

    /// erf by its Taylor series (|x| < 3) or its asymptotic complement, in f64.
    fn libm_erf(x: f64) -> f64 {
        if x.abs() > 3.0 {
            // erfc by its continued fraction, evaluated backwards (accurate for x > 2).
            let a = x.abs();
            let mut k = 0.0;
            for n in (1..=80).rev() {
                k = (n as f64 / 2.0) / (a + k);
            }
            let erfc = (-a * a).exp() / std::f64::consts::PI.sqrt() / (a + k);
            return x.signum() * (1.0 - erfc);
        }
        let mut term = x;
        let mut sum = x;
        for n in 1..200 {
            term *= -x * x / n as f64;
            sum += term / (2 * n + 1) as f64;
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    }
}
