//! `.npy` files in and out, through `npyz`.

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::Path;

use npyz::WriterBuilder;

use ir::{Elems, Tensor};

/// A `.npy` file that cannot be read or written, with the path and the reason.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct NpyError(pub String);

type Error = NpyError;

fn err(path: &Path, what: impl std::fmt::Display) -> Error {
    NpyError(format!("{}: {what}", path.display()))
}

/// Read a `.npy` file (f32, f64, f16, i8, u8, i32, i64, bool; little-endian, C order).
pub fn read(path: &Path) -> Result<Tensor, Error> {
    let file = File::open(path).map_err(|e| err(path, e))?;
    let npy = npyz::NpyFile::new(BufReader::new(file))
        .map_err(|e| err(path, format!("not a valid .npy file: {e}")))?;
    if npy.order() != npyz::Order::C {
        return Err(err(path, "Fortran-order arrays are not supported; save with C order"));
    }
    let shape: Vec<usize> = npy
        .shape()
        .iter()
        .map(|d| usize::try_from(*d).map_err(|_| err(path, "dim too large")))
        .collect::<Result<_, _>>()?;
    let n = ir::checked_numel(&shape).map_err(|e| err(path, e))?;
    // Refuse headers that promise more data than the file could hold.
    let file_len = std::fs::metadata(path).map_err(|e| err(path, e))?.len() as usize;
    let descr = match npy.dtype() {
        npyz::DType::Plain(ts) => ts.to_string(),
        other => {
            return Err(err(path, format!("unsupported record or array element type `{}`", other.descr())))
        }
    };
    let elem = npy.dtype().num_bytes().unwrap_or(1).max(1);
    if n.checked_mul(elem).is_none_or(|b| b > file_len) {
        return Err(err(
            path,
            format!("header says {shape:?} of `{descr}` but the file has only {file_len} bytes"),
        ));
    }
    let bad = |e: std::io::Error| err(path, format!("bad data: {e}"));
    let elems = match descr.as_str() {
        "<f4" => Elems::F32(npy.into_vec().map_err(bad)?),
        "<f8" => Elems::F64(npy.into_vec().map_err(bad)?),
        "<f2" => Elems::F16(npy.into_vec::<u16>().map_err(bad)?),
        "|i1" => Elems::I8(npy.into_vec().map_err(bad)?),
        "|u1" => Elems::U8(npy.into_vec().map_err(bad)?),
        "<i4" => Elems::I32(npy.into_vec().map_err(bad)?),
        "<i8" => Elems::I64(npy.into_vec().map_err(bad)?),
        "|b1" => Elems::Bool(npy.into_vec::<bool>().map_err(bad)?),
        other => return Err(err(path, format!("unsupported element type `{other}`"))),
    };
    Tensor::new(shape, elems).map_err(|e| err(path, e))
}

/// Write a tensor as `.npy`.
pub fn write(path: &Path, t: &Tensor) -> Result<(), Error> {
    let file = File::create(path).map_err(|e| err(path, e))?;
    let shape: Vec<u64> = t.shape().iter().map(|d| *d as u64).collect();
    let w = BufWriter::new(file);
    macro_rules! put {
        ($v:expr, $ty:ty) => {{
            let mut out = npyz::WriteOptions::new()
                .default_dtype()
                .shape(&shape)
                .writer(w)
                .begin_nd()
                .map_err(|e| err(path, e))?;
            out.extend($v.iter().copied()).map_err(|e| err(path, e))?;
            out.finish().map_err(|e| err(path, e))?;
        }};
    }
    match t.elems() {
        Elems::F32(v) => put!(v, f32),
        Elems::F64(v) => put!(v, f64),
        Elems::F16(v) => {
            let dtype = npyz::DType::Plain("<f2".parse().map_err(|_| err(path, "f16 dtype"))?);
            let mut out = npyz::WriteOptions::<u16>::new()
                .dtype(dtype)
                .shape(&shape)
                .writer(w)
                .begin_nd()
                .map_err(|e| err(path, e))?;
            out.extend(v.iter().copied()).map_err(|e| err(path, e))?;
            out.finish().map_err(|e| err(path, e))?;
        }
        // numpy has no bfloat16: written as the f32 values they are.
        Elems::BF16(v) => {
            let f: Vec<f32> = v.iter().map(|x| ir::bf16_to_f32(*x)).collect();
            put!(f, f32)
        }
        Elems::I8(v) => put!(v, i8),
        Elems::U8(v) => put!(v, u8),
        Elems::I32(v) => put!(v, i32),
        Elems::I64(v) => put!(v, i64),
        Elems::Bool(v) => put!(v, bool),
    }
    Ok(())
}
