//! Element types, tensor types, and tensor data (host tensors and weights).

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use sym::SymExpr;

use crate::IrError;

/// Element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub enum DType {
    F32,
    F64,
    F16,
    I8,
    U8,
    I32,
    I64,
    Bool,
    /// bfloat16: f32's exponent, 8 bits of significand. Only the GPU plan's
    /// contraction operands hold it (a producer's copy of its output that a
    /// tensor-core product reads); no model's own tensor has it.
    BF16,
}

impl DType {
    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Bool => "bool",
        }
    }
    pub fn from_name(s: &str) -> Option<DType> {
        Some(match s {
            "f32" => DType::F32,
            "f64" => DType::F64,
            "f16" => DType::F16,
            "bf16" => DType::BF16,
            "i8" => DType::I8,
            "u8" => DType::U8,
            "i32" => DType::I32,
            "i64" => DType::I64,
            "bool" => DType::Bool,
            _ => return None,
        })
    }
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }
    pub fn is_int(self) -> bool {
        matches!(self, DType::I8 | DType::U8 | DType::I32 | DType::I64)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The type of an IR value: element type and symbolic shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Vec<SymExpr>,
}

impl TensorType {
    pub fn new(dtype: DType, shape: Vec<SymExpr>) -> TensorType {
        TensorType { dtype, shape }
    }
    /// A type with a fully known shape.
    pub fn fixed(dtype: DType, dims: &[i64]) -> TensorType {
        TensorType { dtype, shape: dims.iter().map(|d| SymExpr::constant(*d)).collect() }
    }
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
    /// The number of elements, symbolically.
    pub fn numel(&self) -> Result<SymExpr, sym::SymError> {
        self.shape.iter().try_fold(SymExpr::constant(1), |acc, d| acc.try_mul(d))
    }
    /// The shape when every dim is a constant.
    pub fn const_shape(&self) -> Option<Vec<i64>> {
        self.shape.iter().map(|d| d.as_const()).collect()
    }
    /// Whether the value has exactly one element (a scalar, or every dim 1).
    pub fn is_one_element(&self) -> bool {
        self.shape.iter().all(|d| d.as_const() == Some(1))
    }
}

impl fmt::Display for TensorType {
    /// `f32[batch, seq, 768]`; a scalar is `f32[]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{d}")?;
        }
        write!(f, "]")
    }
}

/// Typed element storage of a host tensor.
#[derive(Clone, Debug, PartialEq)]
pub enum Elems {
    F32(Vec<f32>),
    F64(Vec<f64>),
    /// Half floats are kept as raw IEEE binary16 bits.
    F16(Vec<u16>),
    /// bfloat16 as its raw bits (the high half of an f32's).
    BF16(Vec<u16>),
    I8(Vec<i8>),
    U8(Vec<u8>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    Bool(Vec<bool>),
}

/// `$body` with `$v` bound to the vector of whichever variant `$e` is.
macro_rules! each_vec {
    ($e:expr, $v:ident => $body:expr) => {
        match $e {
            Elems::F32($v) => $body,
            Elems::F64($v) => $body,
            Elems::F16($v) => $body,
            Elems::BF16($v) => $body,
            Elems::I8($v) => $body,
            Elems::U8($v) => $body,
            Elems::I32($v) => $body,
            Elems::I64($v) => $body,
            Elems::Bool($v) => $body,
        }
    };
}

impl Elems {
    pub fn dtype(&self) -> DType {
        match self {
            Elems::F32(_) => DType::F32,
            Elems::F64(_) => DType::F64,
            Elems::F16(_) => DType::F16,
            Elems::BF16(_) => DType::BF16,
            Elems::I8(_) => DType::I8,
            Elems::U8(_) => DType::U8,
            Elems::I32(_) => DType::I32,
            Elems::I64(_) => DType::I64,
            Elems::Bool(_) => DType::Bool,
        }
    }
    pub fn len(&self) -> usize {
        each_vec!(self, v => v.len())
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The elements the vector has room for without growing.
    pub fn capacity(&self) -> usize {
        each_vec!(self, v => v.capacity())
    }
    /// The bytes of the room [`Elems::capacity`] counts.
    pub fn capacity_bytes(&self) -> usize {
        self.capacity().saturating_mul(self.dtype().size())
    }
    /// The bytes of the elements.
    pub fn byte_len(&self) -> usize {
        each_vec!(self, v => std::mem::size_of_val(v.as_slice()))
    }
    /// Keep the first `n` elements (the memory stays).
    pub fn truncate(&mut self, n: usize) {
        each_vec!(self, v => v.truncate(n))
    }
    /// The first element's address, for code that writes the elements in place.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        each_vec!(self, v => v.as_mut_ptr().cast::<u8>())
    }
}

/// What a run reads an input from: its dtype, shape and the address of its
/// row-major elements. A [`Tensor`] owns them; a [`TensorView`] borrows them
/// (a numpy array read in place).
pub trait TensorData {
    fn dtype(&self) -> DType;
    fn shape(&self) -> &[usize];
    /// The first element (the elements are row-major, as many as the shape says,
    /// aligned for the dtype).
    fn as_ptr(&self) -> *const u8;
}

/// Elements someone else owns, read in place.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    dtype: DType,
    shape: &'a [usize],
    bytes: &'a [u8],
}

/// An element type a [`TensorView`] may borrow (half floats as their bits, `u16`).
pub trait ViewElement: bytemuck::NoUninit {
    const DTYPE: DType;
}

macro_rules! view_elements {
    ($($t:ty => $d:ident),*) => {
        $(impl ViewElement for $t {
            const DTYPE: DType = DType::$d;
        })*
    };
}
view_elements!(f32 => F32, f64 => F64, u16 => F16, i8 => I8, u8 => U8, i32 => I32, i64 => I64, bool => Bool);

impl<'a> TensorView<'a> {
    /// `data` as a tensor of `shape` (as many elements as it has).
    pub fn of<T: ViewElement>(shape: &'a [usize], data: &'a [T]) -> Result<TensorView<'a>, IrError> {
        let n = checked_numel(shape)?;
        if n != data.len() {
            return Err(IrError::Data(format!(
                "shape {shape:?} has {n} elements but {} were given",
                data.len()
            )));
        }
        Ok(TensorView { dtype: T::DTYPE, shape, bytes: bytemuck::cast_slice(data) })
    }
}

impl TensorView<'_> {
    /// A copy as a host tensor (what the reference interpreter takes).
    pub fn to_tensor(&self) -> Tensor {
        decode(self.dtype, self.shape, self.bytes)
    }
}

/// Little-endian elements of `dtype` (bools one byte each) as a host tensor.
fn decode(dtype: DType, shape: &[usize], b: &[u8]) -> Tensor {
    fn chunks<const N: usize, T>(b: &[u8], f: fn([u8; N]) -> T) -> Vec<T> {
        b.chunks_exact(N).map(|c| f(c.try_into().unwrap_or([0; N]))).collect()
    }
    let elems = match dtype {
        DType::F32 => Elems::F32(chunks(b, f32::from_le_bytes)),
        DType::F64 => Elems::F64(chunks(b, f64::from_le_bytes)),
        DType::F16 => Elems::F16(chunks(b, u16::from_le_bytes)),
        DType::BF16 => Elems::BF16(chunks(b, u16::from_le_bytes)),
        DType::I8 => Elems::I8(b.iter().map(|x| *x as i8).collect()),
        DType::U8 => Elems::U8(b.to_vec()),
        DType::I32 => Elems::I32(chunks(b, i32::from_le_bytes)),
        DType::I64 => Elems::I64(chunks(b, i64::from_le_bytes)),
        DType::Bool => Elems::Bool(b.iter().map(|x| *x != 0).collect()),
    };
    Tensor { shape: shape.to_vec(), elems }
}

impl TensorData for TensorView<'_> {
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        self.shape
    }
    fn as_ptr(&self) -> *const u8 {
        self.bytes.as_ptr()
    }
}

impl TensorData for Tensor {
    fn dtype(&self) -> DType {
        Tensor::dtype(self)
    }
    fn shape(&self) -> &[usize] {
        Tensor::shape(self)
    }
    fn as_ptr(&self) -> *const u8 {
        match &self.elems {
            Elems::F32(v) => v.as_ptr() as *const u8,
            Elems::F64(v) => v.as_ptr() as *const u8,
            Elems::F16(v) | Elems::BF16(v) => v.as_ptr() as *const u8,
            Elems::I8(v) => v.as_ptr() as *const u8,
            Elems::U8(v) => v.as_ptr(),
            Elems::I32(v) => v.as_ptr() as *const u8,
            Elems::I64(v) => v.as_ptr() as *const u8,
            Elems::Bool(v) => v.as_ptr() as *const u8,
        }
    }
}

/// A host tensor with a concrete shape: model inputs, outputs and the values the
/// reference interpreter computes.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    shape: Vec<usize>,
    elems: Elems,
}

impl Tensor {
    /// A tensor from its shape and elements; the element count must match.
    pub fn new(shape: Vec<usize>, elems: Elems) -> Result<Tensor, IrError> {
        let n = checked_numel(&shape)?;
        if n != elems.len() {
            return Err(IrError::Data(format!(
                "shape {shape:?} has {n} elements but {} were given",
                elems.len()
            )));
        }
        Ok(Tensor { shape, elems })
    }
    pub fn scalar_f32(v: f32) -> Tensor {
        Tensor { shape: vec![], elems: Elems::F32(vec![v]) }
    }
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    pub fn elems(&self) -> &Elems {
        &self.elems
    }
    pub fn into_elems(self) -> Elems {
        self.elems
    }
    pub fn dtype(&self) -> DType {
        self.elems.dtype()
    }
    pub fn numel(&self) -> usize {
        self.elems.len()
    }
    /// The elements as f64, for comparisons (bool as 0/1; f16 decoded).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        match &self.elems {
            Elems::F32(v) => v.iter().map(|x| *x as f64).collect(),
            Elems::F64(v) => v.clone(),
            Elems::F16(v) => v.iter().map(|x| f16_to_f32(*x) as f64).collect(),
            Elems::BF16(v) => v.iter().map(|x| bf16_to_f32(*x) as f64).collect(),
            Elems::I8(v) => v.iter().map(|x| *x as f64).collect(),
            Elems::U8(v) => v.iter().map(|x| *x as f64).collect(),
            Elems::I32(v) => v.iter().map(|x| *x as f64).collect(),
            Elems::I64(v) => v.iter().map(|x| *x as f64).collect(),
            Elems::Bool(v) => v.iter().map(|x| *x as u8 as f64).collect(),
        }
    }
    /// The elements as i64, for integer tensors and bools; `None` for floats.
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        Some(match &self.elems {
            Elems::I8(v) => v.iter().map(|x| *x as i64).collect(),
            Elems::U8(v) => v.iter().map(|x| *x as i64).collect(),
            Elems::I32(v) => v.iter().map(|x| *x as i64).collect(),
            Elems::I64(v) => v.clone(),
            Elems::Bool(v) => v.iter().map(|x| *x as i64).collect(),
            _ => return None,
        })
    }
}

/// Product of dims with an overflow check (absurd shapes are errors, not crashes).
pub fn checked_numel(shape: &[usize]) -> Result<usize, IrError> {
    shape
        .iter()
        .try_fold(1usize, |a, d| a.checked_mul(*d))
        .ok_or_else(|| IrError::Data(format!("shape {shape:?} has too many elements")))
}

/// Encode `x` as IEEE binary16 bits, rounding to nearest even (overflow → ±inf).
pub fn f64_to_f16(x: f64) -> u16 {
    let sign = if x.is_sign_negative() { 0x8000 } else { 0 };
    let a = x.abs();
    if a.is_nan() {
        return sign | 0x7e00;
    }
    // 65520 is halfway between the largest half (65504) and 2^16; the tie goes to
    // the even neighbour, which is infinity.
    if a >= 65520.0 {
        return sign | 0x7c00;
    }
    if a < f64::powi(2.0, -14) {
        // Subnormal (or zero): a multiple of 2^-24. Rounding up to 1024 yields the
        // smallest normal's bits, which is right.
        return sign | (a * f64::powi(2.0, 24)).round_ties_even() as u16;
    }
    let e = ((a.to_bits() >> 52) & 0x7ff) as i32 - 1023;
    // 10 fraction bits; a carry out of the fraction correctly bumps the exponent.
    let frac = ((a / f64::powi(2.0, e) - 1.0) * 1024.0).round_ties_even() as u16;
    sign | ((((e + 15) as u16) << 10) + frac)
}

/// The bfloat16 nearest `x` (ties to even; a NaN stays a quiet NaN).
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// Decode bfloat16 bits.
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// Decode IEEE binary16 bits.
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = if exp == 0 {
        if man == 0 {
            sign
        } else {
            // Subnormal: normalize.
            let mut e = 127 - 15 + 1;
            let mut m = man;
            while m & 0x400 == 0 {
                m <<= 1;
                e -= 1;
            }
            sign | ((e as u32) << 23) | ((m & 0x3ff) << 13)
        }
    } else if exp == 0x1f {
        sign | 0x7f80_0000 | (man << 13)
    } else {
        sign | ((exp + 127 - 15) << 23) | (man << 13)
    };
    f32::from_bits(bits)
}

/// A read-only file mapping that constants are windows into (the model file,
/// an external-data file). Once a compiler has copied a constant into a form
/// of its own (a packed weight), it can give the pages back: the mapping is
/// read-only, so the OS reads them from the file again if they are touched,
/// and releasing never changes a value. Without it, a model's weights would
/// stay resident twice (the file's pages and the packed copy).
pub trait MappedFile: Send + Sync {
    /// Let the OS drop the resident pages that hold `bytes`, a window into this
    /// mapping (a window outside it is ignored).
    fn release(&self, bytes: &[u8]);
}

/// Constant data in the IR: little-endian bytes that may be a window into a
/// memory-mapped model or external-data file (weights are never copied on load).
#[derive(Clone)]
pub struct ConstData {
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Exactly `numel * dtype.size()` bytes, little-endian; bools are one byte each.
    bytes: Bytes,
    /// The file mapping `bytes` is a window into, if any.
    file: Option<Arc<dyn MappedFile>>,
    /// The quantized weight these f32 values dequantize, if any.
    codes: Option<Arc<WeightCodes>>,
}

/// A 2-D `[k, n]` f32 constant's source, when it is a weight-only quantized
/// weight's dequantization (ONNX's `DequantizeLinear` of constant int4 or
/// int8 codes, blocked along K or one scale per column): element `(r, c)` is
/// `(codes[r, c] − zero_points[r / group, c]) · scales[r / group, c]`. The
/// values stay what every consumer reads; a backend may multiply the codes
/// instead.
#[derive(Clone, Debug)]
pub struct WeightCodes {
    /// `[k, n]`, i8 or u8 (int4 and uint4 held in them).
    pub codes: ConstData,
    /// 4 or 8.
    pub bits: u32,
    /// Rows of K that share a scale.
    pub group: usize,
    /// `[k.div_ceil(group), n]`.
    pub scales: Vec<f32>,
    /// As `scales`, of the codes' type.
    pub zero_points: Option<ConstData>,
}

impl PartialEq for ConstData {
    fn eq(&self, o: &ConstData) -> bool {
        self.dtype == o.dtype && self.shape == o.shape && self.bytes == o.bytes
    }
}

impl ConstData {
    /// Wrap raw bytes; the length must match the shape.
    pub fn from_bytes(dtype: DType, shape: Vec<usize>, bytes: Bytes) -> Result<ConstData, IrError> {
        let n = checked_numel(&shape)?;
        let want = n.checked_mul(dtype.size()).ok_or_else(|| IrError::Data("constant too large".into()))?;
        if bytes.len() != want {
            return Err(IrError::Data(format!(
                "constant {dtype}{shape:?} needs {want} bytes, got {}",
                bytes.len()
            )));
        }
        Ok(ConstData { dtype, shape, bytes, file: None, codes: None })
    }

    /// [`ConstData::from_bytes`] for a window into a read-only file mapping,
    /// whose pages [`ConstData::release_pages`] can give back.
    pub fn from_mapped(
        dtype: DType,
        shape: Vec<usize>,
        bytes: Bytes,
        file: Arc<dyn MappedFile>,
    ) -> Result<ConstData, IrError> {
        let mut c = ConstData::from_bytes(dtype, shape, bytes)?;
        c.file = Some(file);
        Ok(c)
    }

    /// The same data under another shape of as many elements (a reshape's
    /// result: no copy; a file-mapped constant stays mapped).
    pub fn reshaped(&self, shape: Vec<usize>) -> Result<ConstData, IrError> {
        if checked_numel(&shape)? != self.numel() {
            return Err(IrError::Data(format!(
                "{:?} has not the {} elements of {:?}",
                shape,
                self.numel(),
                self.shape
            )));
        }
        // The codes describe the values as `[k, n]`: kept under that shape only.
        let codes = self.codes.clone().filter(|_| shape == self.shape);
        Ok(ConstData { dtype: self.dtype, shape, bytes: self.bytes.clone(), file: self.file.clone(), codes })
    }

    /// These f32 values (`[k, n]`) as the dequantization of `codes`.
    pub fn with_codes(mut self, codes: WeightCodes) -> Result<ConstData, IrError> {
        let [k, n] = self.shape[..] else {
            return Err(IrError::Data(format!("weight codes of a {:?} constant (2-D only)", self.shape)));
        };
        let groups = k.div_ceil(codes.group.max(1));
        let fits =
            |c: &ConstData, rows: usize| matches!(c.dtype, DType::I8 | DType::U8) && c.shape == [rows, n];
        if self.dtype != DType::F32
            || !fits(&codes.codes, k)
            || codes.zero_points.as_ref().is_some_and(|z| !fits(z, groups) || z.dtype != codes.codes.dtype)
            || codes.scales.len() != groups * n
            || !matches!(codes.bits, 4 | 8)
        {
            return Err(IrError::Data(format!(
                "weight codes that do not describe an f32{:?} constant",
                self.shape
            )));
        }
        self.codes = Some(Arc::new(codes));
        Ok(self)
    }

    /// The quantized weight these values dequantize, if known.
    pub fn weight_codes(&self) -> Option<&WeightCodes> {
        self.codes.as_deref()
    }

    /// Whether the bytes are a window into a file mapping.
    pub fn is_mapped(&self) -> bool {
        self.file.is_some()
    }

    /// Give the resident pages of a file-mapped constant back to the OS (see
    /// [`MappedFile`]); the value is unchanged and reads back from the file if
    /// used again. Nothing happens for a constant in memory of its own.
    pub fn release_pages(&self) {
        if let Some(f) = &self.file {
            f.release(&self.bytes);
        }
    }

    /// Encode a host tensor.
    pub fn from_tensor(t: &Tensor) -> ConstData {
        let mut out = Vec::with_capacity(t.numel() * t.dtype().size());
        match t.elems() {
            Elems::F32(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Elems::F64(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Elems::F16(v) | Elems::BF16(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Elems::I8(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Elems::U8(v) => out.extend_from_slice(v),
            Elems::I32(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Elems::I64(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Elems::Bool(v) => v.iter().for_each(|x| out.push(*x as u8)),
        }
        ConstData {
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
            bytes: Bytes::from(out),
            file: None,
            codes: None,
        }
    }

    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Decode into a host tensor (a copy; the interpreter's working form).
    pub fn to_tensor(&self) -> Tensor {
        decode(self.dtype, &self.shape, &self.bytes)
    }

    /// The type of this constant.
    pub fn ty(&self) -> TensorType {
        TensorType::fixed(self.dtype, &self.shape.iter().map(|d| *d as i64).collect::<Vec<_>>())
    }
}

impl fmt::Debug for ConstData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ConstData({}{:?}, {} bytes)", self.dtype, self.shape, self.bytes.len())
    }
}
