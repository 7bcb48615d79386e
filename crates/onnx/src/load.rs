//! Reading a model file: memory-map it, decode the protobuf, and turn tensors
//! (inline, raw, or in external-data files) into `ConstData` without copying raw
//! bytes.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use ir::{ConstData, DType};
use prost::Message;

use crate::proto::{data_type as dt, ModelProto, TensorProto};
use crate::OnnxError;

/// A model or external-data file mapped read-only.
pub struct FileMap(memmap2::Mmap);

/// The owner of a `Bytes` over a whole [`FileMap`] (keeps the mapping alive).
struct WholeFile(Arc<FileMap>);

impl AsRef<[u8]> for WholeFile {
    fn as_ref(&self) -> &[u8] {
        &self.0 .0
    }
}

impl FileMap {
    /// Whether `bytes` lies inside this mapping.
    fn holds(&self, bytes: &[u8]) -> bool {
        let (base, p) = (self.0.as_ptr() as usize, bytes.as_ptr() as usize);
        !bytes.is_empty() && p >= base && p + bytes.len() <= base + self.0.len()
    }
}

impl ir::MappedFile for FileMap {
    fn release(&self, bytes: &[u8]) {
        if !self.holds(bytes) {
            return;
        }
        let offset = bytes.as_ptr() as usize - self.0.as_ptr() as usize;
        // SAFETY: the mapping is read-only (`Mmap`, never `MmapMut`) and private, so
        // no page holds a write that dropping it would lose: after MADV_DONTNEED a
        // touched page is read from the file again, with the same bytes (a file
        // changed under a live mapping is outside the contract, see `map_file`).
        // memmap2 rounds the start down to a page; the neighbours that share the
        // first and last page read back the same way. A failure only means the
        // pages stay resident.
        let _ =
            unsafe { self.0.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, bytes.len()) };
    }
}

/// Memory-map `path`: the whole file as `Bytes` (which keep the mapping alive)
/// and the mapping, whose pages constants may give back once copied.
fn map_file(path: &Path) -> Result<(Bytes, Option<Arc<FileMap>>), OnnxError> {
    let io = |e: std::io::Error| OnnxError::Io { path: path.to_path_buf(), source: Arc::new(e) };
    let file = File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    if len == 0 {
        return Ok((Bytes::new(), None));
    }
    // SAFETY: the map is read-only and owned by the returned `Bytes`, so it lives as
    // long as any window into it. Another process truncating the file while it is
    // mapped would fault; that is the documented contract of memory-mapped model
    // loading (ONNX Runtime and others map the same way), not something Rust code
    // here can cause.
    let map = Arc::new(FileMap(unsafe { memmap2::Mmap::map(&file) }.map_err(io)?));
    Ok((Bytes::from_owner(WholeFile(map.clone())), Some(map)))
}

/// Decode a model file. Weights stay in the mapped file.
pub fn read_model(path: &Path) -> Result<ModelProto, OnnxError> {
    Ok(read_model_mapped(path)?.0)
}

/// [`read_model`], with the file's mapping (for [`ExternalData::with_model_file`]).
pub fn read_model_mapped(path: &Path) -> Result<(ModelProto, Option<Arc<FileMap>>), OnnxError> {
    let (bytes, map) = map_file(path)?;
    Ok((decode_model(bytes)?, map))
}

/// Decode model bytes (from a file map or memory).
pub fn decode_model(bytes: Bytes) -> Result<ModelProto, OnnxError> {
    if bytes.is_empty() {
        return Err(OnnxError::Malformed("the file is empty".into()));
    }
    let model = ModelProto::decode(bytes)
        .map_err(|e| OnnxError::Malformed(format!("protobuf decoding failed: {e}")))?;
    if model.graph.is_none() {
        return Err(OnnxError::Malformed("the model has no graph (is this an ONNX model file?)".into()));
    }
    Ok(model)
}

/// Resolves external-data references relative to the model's folder; each
/// external file is mapped once.
#[derive(Default)]
pub struct ExternalData {
    dir: Option<PathBuf>,
    maps: HashMap<PathBuf, (Bytes, Option<Arc<FileMap>>)>,
    /// The mapping of the model file itself (raw tensor data is a window into it).
    model_file: Option<Arc<FileMap>>,
}

impl ExternalData {
    pub fn new(model_dir: Option<PathBuf>) -> ExternalData {
        ExternalData { dir: model_dir, maps: HashMap::new(), model_file: None }
    }

    /// Tensors whose raw data lies in `map` (the model file's) are marked as
    /// file-mapped, so that their pages can be given back once copied.
    pub fn with_model_file(mut self, map: Option<Arc<FileMap>>) -> ExternalData {
        self.model_file = map;
        self
    }

    /// The mapping that holds `bytes`, if one does.
    fn mapping_of(&self, bytes: &[u8]) -> Option<Arc<dyn ir::MappedFile>> {
        let m = self.model_file.iter().chain(self.maps.values().filter_map(|(_, m)| m.as_ref()));
        m.into_iter().find(|m| m.holds(bytes)).map(|m| m.clone() as Arc<dyn ir::MappedFile>)
    }

    fn window(&mut self, t: &TensorProto, name: &str) -> Result<Bytes, OnnxError> {
        let bad = |msg: String| OnnxError::Malformed(format!("tensor '{name}': {msg}"));
        let mut location = None;
        let (mut offset, mut length) = (0u64, None);
        for e in &t.external_data {
            let v = e.value.clone().unwrap_or_default();
            match e.key.as_deref() {
                Some("location") => location = Some(v),
                Some("offset") => {
                    offset = v.parse().map_err(|_| bad(format!("bad external offset `{v}`")))?
                }
                Some("length") => {
                    length = Some(v.parse::<u64>().map_err(|_| bad(format!("bad external length `{v}`")))?)
                }
                _ => {}
            }
        }
        let location = location.ok_or_else(|| bad("external data without a location".into()))?;
        let rel = Path::new(&location);
        if rel.is_absolute() || rel.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
            return Err(bad(format!(
                "external data location `{location}` must be a relative path inside the model's folder"
            )));
        }
        let dir = self
            .dir
            .clone()
            .ok_or_else(|| bad("external data needs the model to be loaded from a file".into()))?;
        let path = dir.join(rel);
        if !self.maps.contains_key(&path) {
            let m = map_file(&path)?;
            self.maps.insert(path.clone(), m);
        }
        let file = &self.maps[&path].0;
        let end = match length {
            Some(l) => offset.checked_add(l),
            None => Some(file.len() as u64),
        };
        match end {
            Some(end) if offset <= end && end <= file.len() as u64 => {
                Ok(file.slice(offset as usize..end as usize))
            }
            _ => Err(bad(format!(
                "external range {offset}..{} is outside `{location}` ({} bytes)",
                end.map_or("overflow".to_string(), |e| e.to_string()),
                file.len()
            ))),
        }
    }
}

/// The IR dtype of an ONNX element type.
pub fn dtype_of(code: i32) -> Option<DType> {
    Some(match code {
        dt::FLOAT => DType::F32,
        dt::DOUBLE => DType::F64,
        dt::FLOAT16 => DType::F16,
        dt::INT8 => DType::I8,
        dt::UINT8 => DType::U8,
        dt::INT32 => DType::I32,
        dt::INT64 => DType::I64,
        dt::BOOL => DType::Bool,
        _ => return None,
    })
}

/// An ONNX integer type narrower than the IR's, whose values anyshape holds
/// in a wider type: int16 and uint16 in i32; int4, uint4, int2 and uint2
/// unpacked, a value a byte, in i8 or u8. Only the quantization operators
/// and data movement take such values (the importer checks), so no
/// arithmetic can leave the narrow type's range unnoticed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Narrow {
    I16,
    U16,
    I4,
    U4,
    I2,
    U2,
}

impl Narrow {
    /// The narrow type of ONNX element type `code`, if it is one.
    pub fn of(code: i32) -> Option<Narrow> {
        Some(match code {
            dt::INT16 => Narrow::I16,
            dt::UINT16 => Narrow::U16,
            dt::INT4 => Narrow::I4,
            dt::UINT4 => Narrow::U4,
            dt::INT2 => Narrow::I2,
            dt::UINT2 => Narrow::U2,
            _ => return None,
        })
    }

    /// The IR type its values are held in.
    pub fn held(self) -> DType {
        match self {
            Narrow::I16 | Narrow::U16 => DType::I32,
            Narrow::I4 | Narrow::I2 => DType::I8,
            Narrow::U4 | Narrow::U2 => DType::U8,
        }
    }

    /// Its values' range (a quantization saturates to it).
    pub fn range(self) -> (i64, i64) {
        match self {
            Narrow::I16 => (i16::MIN as i64, i16::MAX as i64),
            Narrow::U16 => (0, u16::MAX as i64),
            Narrow::I4 => (-8, 7),
            Narrow::U4 => (0, 15),
            Narrow::I2 => (-2, 1),
            Narrow::U2 => (0, 3),
        }
    }

    /// Bits a value takes in a tensor's bytes.
    fn bits(self) -> usize {
        match self {
            Narrow::I16 | Narrow::U16 => 16,
            Narrow::I4 | Narrow::U4 => 4,
            Narrow::I2 | Narrow::U2 => 2,
        }
    }

    fn signed(self) -> bool {
        matches!(self, Narrow::I16 | Narrow::I4 | Narrow::I2)
    }

    /// ONNX's name of it.
    pub fn name(self) -> &'static str {
        match self {
            Narrow::I16 => "INT16",
            Narrow::U16 => "UINT16",
            Narrow::I4 => "INT4",
            Narrow::U4 => "UINT4",
            Narrow::I2 => "INT2",
            Narrow::U2 => "UINT2",
        }
    }

    /// Element `i` of `bytes` (ONNX's packing: little-endian 16-bit words;
    /// 4- and 2-bit values packed into bytes from the least significant bits).
    fn value(self, bytes: &[u8], i: usize) -> i64 {
        let bits = self.bits();
        let raw = if bits == 16 {
            u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]) as i64
        } else {
            let per = 8 / bits;
            ((bytes[i / per] >> ((i % per) * bits)) & ((1u8 << bits) - 1)) as i64
        };
        if self.signed() && raw >= 1 << (bits - 1) {
            raw - (1 << bits)
        } else {
            raw
        }
    }

    /// `n` values packed as ONNX packs them in `bytes`, held in [`Narrow::held`]'s bytes.
    fn unpack(self, bytes: &[u8], n: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(n * self.held().size());
        for i in 0..n {
            let v = self.value(bytes, i);
            match self.held() {
                DType::I32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
                _ => out.push(v as u8),
            }
        }
        out
    }

    /// Bytes `n` packed values take.
    fn packed_len(self, n: usize) -> usize {
        (n * self.bits()).div_ceil(8)
    }
}

/// The IR type an ONNX element type's values are held in: its own, or a
/// narrow integer type's wider one ([`Narrow`]).
pub fn held_dtype_of(code: i32) -> Option<DType> {
    dtype_of(code).or_else(|| Narrow::of(code).map(Narrow::held))
}

/// Name of an ONNX element type, for messages.
pub fn dtype_name(code: i32) -> String {
    match code {
        0 => "UNDEFINED",
        1 => "FLOAT",
        2 => "UINT8",
        3 => "INT8",
        4 => "UINT16",
        5 => "INT16",
        6 => "INT32",
        7 => "INT64",
        8 => "STRING",
        9 => "BOOL",
        10 => "FLOAT16",
        11 => "DOUBLE",
        12 => "UINT32",
        13 => "UINT64",
        14 => "COMPLEX64",
        15 => "COMPLEX128",
        16 => "BFLOAT16",
        17 => "FLOAT8E4M3FN",
        18 => "FLOAT8E4M3FNUZ",
        19 => "FLOAT8E5M2",
        20 => "FLOAT8E5M2FNUZ",
        21 => "UINT4",
        22 => "INT4",
        23 => "FLOAT4E2M1",
        24 => "FLOAT8E8M0",
        25 => "UINT2",
        26 => "INT2",
        _ => return format!("code {code}"),
    }
    .to_string()
}

/// Decode a tensor proto into constant data; raw and external bytes are windows.
pub fn tensor_data(t: &TensorProto, ext: &mut ExternalData) -> Result<ConstData, OnnxError> {
    let name = t.name.clone().unwrap_or_default();
    let code = t.data_type.unwrap_or(0);
    if let Some(narrow) = Narrow::of(code) {
        return narrow_data(t, ext, narrow);
    }
    let dtype = dtype_of(code).ok_or_else(|| OnnxError::UnsupportedDType {
        what: format!("tensor '{name}'"),
        dtype: dtype_name(code),
    })?;
    let (shape, n) = shape_of(t, &name)?;
    let data_err = |e: ir::IrError| OnnxError::Malformed(format!("tensor '{name}': {e}"));
    let window = match (t.data_location, &t.raw_data) {
        (Some(1), _) => Some(ext.window(t, &name)?),
        (_, Some(raw)) => Some(raw.clone()),
        _ => None,
    };
    if let Some(bytes) = window {
        return match ext.mapping_of(&bytes) {
            Some(file) => ConstData::from_mapped(dtype, shape, bytes, file),
            None => ConstData::from_bytes(dtype, shape, bytes),
        }
        .map_err(data_err);
    }
    // Typed repeated fields (small tensors, constants written by hand).
    let mut out: Vec<u8> = Vec::new();
    let count = match dtype {
        DType::F32 => {
            t.float_data.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
            t.float_data.len()
        }
        DType::F64 => {
            t.double_data.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
            t.double_data.len()
        }
        DType::I64 => {
            t.int64_data.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
            t.int64_data.len()
        }
        // int32_data carries every element type of 32 bits or less.
        DType::I32 => {
            t.int32_data.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
            t.int32_data.len()
        }
        DType::F16 | DType::BF16 => {
            t.int32_data.iter().for_each(|v| out.extend_from_slice(&(*v as u16).to_le_bytes()));
            t.int32_data.len()
        }
        DType::I8 | DType::U8 | DType::Bool => {
            out.extend(t.int32_data.iter().map(|v| *v as u8));
            t.int32_data.len()
        }
    };
    if count != n {
        return Err(OnnxError::Malformed(format!(
            "tensor '{name}' has shape {shape:?} ({n} elements) but {count} values"
        )));
    }
    ConstData::from_bytes(dtype, shape, Bytes::from(out)).map_err(data_err)
}

/// A tensor proto's shape and element count, checked.
fn shape_of(t: &TensorProto, name: &str) -> Result<(Vec<usize>, usize), OnnxError> {
    let mut shape = Vec::with_capacity(t.dims.len());
    for d in &t.dims {
        let d = usize::try_from(*d)
            .map_err(|_| OnnxError::Malformed(format!("tensor '{name}' has a negative dim {d}")))?;
        shape.push(d);
    }
    let n = ir::checked_numel(&shape).map_err(|e| OnnxError::Malformed(format!("tensor '{name}': {e}")))?;
    Ok((shape, n))
}

/// A tensor of a narrow integer type ([`Narrow`]) decoded into the type that
/// holds it: raw (or external) bytes packed as ONNX packs them, or
/// `int32_data` (a value an entry for 16 bits; a packed byte an entry for 4
/// and 2 bits).
fn narrow_data(t: &TensorProto, ext: &mut ExternalData, narrow: Narrow) -> Result<ConstData, OnnxError> {
    let name = t.name.clone().unwrap_or_default();
    let (shape, n) = shape_of(t, &name)?;
    let packed: Vec<u8> = match (t.data_location, &t.raw_data) {
        (Some(1), _) => ext.window(t, &name)?.to_vec(),
        (_, Some(raw)) => raw.to_vec(),
        _ if narrow.bits() == 16 => t.int32_data.iter().flat_map(|v| (*v as u16).to_le_bytes()).collect(),
        _ => t.int32_data.iter().map(|v| *v as u8).collect(),
    };
    let want = narrow.packed_len(n);
    if packed.len() != want {
        return Err(OnnxError::Malformed(format!(
            "tensor '{name}' ({}) has shape {shape:?} ({n} elements, {want} bytes packed) but {} bytes",
            narrow.name(),
            packed.len()
        )));
    }
    ConstData::from_bytes(narrow.held(), shape, Bytes::from(narrow.unpack(&packed, n)))
        .map_err(|e| OnnxError::Malformed(format!("tensor '{name}': {e}")))
}
