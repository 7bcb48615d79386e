//! The runner: loads a compiled family (cubins, or PTX for the driver to assemble)
//! with cudarc and launches its kernels. cudarc loads libcuda at run time
//! (`dynamic-loading`), so this builds on machines without CUDA, and a machine
//! without the driver gets [`GpuError::NoDriver`], not a crash.

use crate::kernel::{BLayout, ElemType, Epilogue, GemmKernel, Problem, ReduceKernel, BK_WGMMA};
use crate::manifest::Manifest;
use crate::wave::DeviceLimits;
use cudarc::driver::sys::{
    self, CUdevice_attribute, CUevent_flags, CUfunction_attribute, CUgraphInstantiate_flags,
    CUstreamCaptureMode, CUtensorMapDataType, CUtensorMapFloatOOBfill, CUtensorMapInterleave,
    CUtensorMapL2promotion, CUtensorMapSwizzle,
};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DeviceRepr,
    LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use std::path::Path;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("no NVIDIA driver: libcuda.so could not be loaded (install the NVIDIA driver, or run on a machine that has one)")]
    NoDriver,
    #[error("CUDA: {0}")]
    Driver(String),
    #[error("{0}")]
    Plan(String),
}

fn drv<E: std::fmt::Debug>(e: E) -> GpuError {
    GpuError::Driver(format!("{e:?}"))
}

/// Replays [`Gpu::time`] makes at least.
pub const MIN_REPS: usize = 3;
/// Device seconds of replays after which [`Gpu::time`] makes no more.
pub const TIME_BUDGET_S: f64 = 4e-3;

/// An open device: its context, one stream, and the limits the wave model needs.
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub name: String,
    pub limits: DeviceLimits,
    /// Compute capability (major, minor).
    pub cc: (i32, i32),
}

/// A kernel of the family, loaded.
pub struct Loaded {
    pub kernel: GemmKernel,
    pub func: CudaFunction,
    pub regs: usize,
}

/// The f32 workspace of split-K launches: the shares' partial products.
pub type Workspace = CudaSlice<f32>;

/// A split-K reduction, loaded.
pub struct LoadedReducer {
    pub kernel: ReduceKernel,
    pub func: CudaFunction,
}

/// A product's operands on the device: 16-bit bits, with the row strides and the
/// batch strides the kernel is launched with. `c_off` is where C starts inside
/// its buffer (the elements before it are a canary margin).
pub struct DeviceOperands {
    pub a: CudaSlice<u16>,
    pub b: CudaSlice<u16>,
    pub c: CudaSlice<u16>,
    pub bias: CudaSlice<u16>,
    pub residual: CudaSlice<u16>,
    pub c_off: usize,
    pub lda: usize,
    pub ldb: usize,
    pub ldc: usize,
    pub sa: usize,
    pub sb: usize,
    pub sc: usize,
    /// The tensor maps of TMA launches on these operands (A's and B's), built on a
    /// tile shape's first launch and kept.
    pub maps: Vec<(MapKey, [TensorMap; 2])>,
}

/// The operands a launch passes: A, C (past its offset) and the residual from a
/// first row on, B and the bias whole.
struct AtRow<'a> {
    a: CudaView<'a, u16>,
    b: &'a CudaSlice<u16>,
    c: CudaViewMut<'a, u16>,
    bias: &'a CudaSlice<u16>,
    residual: CudaView<'a, u16>,
}

impl DeviceOperands {
    /// The operands from row `first_row` on: where a launch of a cover's piece reads
    /// and writes. Call after the launch's checks, which bound the offsets of what
    /// it reads by the buffers; what it does not read (A in a reduction, a residual
    /// the epilogue does not read) may be shorter, and is passed whole.
    fn at_row(&mut self, first_row: usize) -> AtRow<'_> {
        let (ra, rc) = (first_row * self.lda, first_row * self.ldc);
        AtRow {
            a: self.a.try_slice(ra..).unwrap_or_else(|| self.a.slice(..)),
            b: &self.b,
            c: self.c.slice_mut(self.c_off + rc..),
            bias: &self.bias,
            residual: self.residual.try_slice(rc..).unwrap_or_else(|| self.residual.slice(..)),
        }
    }
}

/// A tensor map (the driver's opaque 128-byte `CUtensorMap`), passed to a TMA
/// kernel by value: the kernel reads it in the parameter space (`grid_constant`).
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
pub struct TensorMap([u64; 16]);

// SAFETY: plain bytes with the layout and alignment of the kernel's
// `.param .align 64 .b8 [128]` parameter.
unsafe impl DeviceRepr for TensorMap {}

/// What a pair of tensor maps (A's and B's) describes: the element type, the box
/// (a stage's tiles), the product, the operands' addresses and strides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapKey {
    elem: ElemType,
    bm: usize,
    bn: usize,
    p: Problem,
    addrs: [u64; 2],
    strides: [usize; 4],
}

/// One operand's tensor map: `[batch, rows, cols]` 16-bit elements (cols
/// contiguous, row stride `ld`, batch stride `stride`), read in boxes of `box_rows`
/// rows × 64 columns (128 bytes: one row of a 128-byte swizzle atom, the layout the
/// wgmma descriptors name). What lies past the operand reads as zeros.
struct MapSpec {
    rows: usize,
    cols: usize,
    ld: usize,
    batch: usize,
    stride: usize,
    box_rows: usize,
}

fn encode_map(elem: ElemType, ptr: u64, s: &MapSpec) -> Result<TensorMap, GpuError> {
    let dtype = match elem {
        ElemType::Bf16 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        ElemType::F16 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        ElemType::F32 | ElemType::U8S8 | ElemType::I16 | ElemType::I16S8 => {
            return Err(GpuError::Plan(format!("TMA maps of {elem} operands: the family's are 16-bit")))
        }
    };
    // One batch entry: its stride is never read; any multiple of 16 bytes past the rows.
    let stride = if s.batch > 1 { s.stride } else { (s.rows * s.ld).div_ceil(8) * 8 };
    let dims = [s.cols as u64, s.rows as u64, s.batch as u64];
    let strides = [2 * s.ld as u64, 2 * stride as u64];
    let boxes = [BK_WGMMA as u32, s.box_rows as u32, 1];
    let unit = [1u32; 3];
    let mut map = sys::CUtensorMap { opaque: [0; 16] };
    // SAFETY: every array holds the rank's (3) entries (strides: rank - 1) and lives
    // across the call; the driver writes only `map`. The address is the operand's
    // device allocation, whose extent the caller has checked against these dims.
    unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            dtype,
            3,
            ptr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            unit.as_ptr(),
            CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    }
    .result()
    .map_err(|e| GpuError::Driver(format!("tensor map {dims:?} strides {strides:?} box {boxes:?}: {e:?}")))?;
    Ok(TensorMap(map.opaque))
}

/// That `what` (`len` elements) holds what a launch of `who` on `p` touches of it:
/// `rows` rows of `cols` elements, `ld` apart, in each of `p.batch` entries `stride`
/// apart.
fn holds(
    who: &str,
    p: &Problem,
    what: &str,
    len: usize,
    (rows, ld, cols, stride): (usize, usize, usize, usize),
) -> Result<(), GpuError> {
    let last = (p.batch - 1) * stride + (rows - 1) * ld + cols;
    if last > len {
        return Err(GpuError::Plan(format!(
            "{who} on {p}: {what} holds {len} elements, the launch reads {last}"
        )));
    }
    Ok(())
}

/// C (past its offset), the bias and the residual as a launch of `who` with
/// `epilogue` touches them on `p`, whose rows start `first_row` rows into C and the
/// residual: the same rules for a GEMM kernel and a reduction.
fn check_outputs(
    who: &str,
    p: &Problem,
    first_row: usize,
    o: &DeviceOperands,
    epilogue: Epilogue,
) -> Result<(), GpuError> {
    let rc = row_offset(who, p, first_row, o.ldc)?;
    holds(who, p, "C", o.c.len().saturating_sub(o.c_off.saturating_add(rc)), (p.m, o.ldc, p.n, o.sc))?;
    if epilogue.bias && o.bias.len() < p.n {
        return Err(GpuError::Plan(format!("{who} on {p}: bias holds {} elements, not N", o.bias.len())));
    }
    if epilogue.residual {
        holds(who, p, "residual", o.residual.len().saturating_sub(rc), (p.m, o.ldc, p.n, o.sc))?;
    }
    Ok(())
}

/// Elements from an operand's start to row `first_row` (`ld` apart), where a piece of
/// a two-size cover starts ([`crate::Piece`]).
fn row_offset(who: &str, p: &Problem, first_row: usize, ld: usize) -> Result<usize, GpuError> {
    first_row
        .checked_mul(ld)
        .ok_or_else(|| GpuError::Plan(format!("{who} on {p}: row {first_row} lies past any buffer")))
}

impl Gpu {
    /// Opens device 0. `bandwidth` (bytes/s) is the memory floor the wave model uses.
    pub fn open(bandwidth: f64) -> Result<Gpu, GpuError> {
        // SAFETY: only asks the dynamic loader whether libcuda can be opened.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(GpuError::NoDriver);
        }
        let ctx = CudaContext::new(0).map_err(drv)?;
        // SAFETY: the runner uses one stream for every copy and launch, so cudarc's
        // per-buffer events (which order uses across streams, and which a stream
        // capture must not record) order nothing here.
        unsafe { ctx.disable_event_tracking() };
        // A stream of its own: the legacy default stream cannot be captured into a graph.
        let stream = ctx.new_stream().map_err(drv)?;
        let attr = |a: CUdevice_attribute| ctx.attribute(a).map(|v| v.max(0) as usize).map_err(drv);
        let limits = DeviceLimits {
            sms: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            regs_per_sm: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR)?,
            smem_per_sm: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)?,
            threads_per_sm: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)?,
            blocks_per_sm: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR)?,
            bandwidth,
            launch: 1e-6,
            l2_bytes: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?,
        };
        let cc = (
            attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)? as i32,
            attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)? as i32,
        );
        let name = ctx.name().map_err(drv)?;
        Ok(Gpu { ctx, stream, name, limits, cc })
    }

    /// Loads one kernel: its cubin where there is one for this device's
    /// architecture, else its PTX (which the driver assembles).
    fn load_one(
        &self,
        dir: &Path,
        cubin: Option<&str>,
        ptx: &str,
        name: &str,
    ) -> Result<CudaFunction, GpuError> {
        let ptx = match cubin {
            Some(c) => {
                let bytes =
                    std::fs::read(dir.join(c)).map_err(|err| GpuError::Plan(format!("{c}: {err}")))?;
                Ptx::from_binary(bytes)
            }
            None => {
                let src = std::fs::read_to_string(dir.join(ptx))
                    .map_err(|err| GpuError::Plan(format!("{ptx}: {err}")))?;
                Ptx::from_src(src)
            }
        };
        let module = self.ctx.load_module(ptx).map_err(|err| GpuError::Driver(format!("{name}: {err:?}")))?;
        module.load_function(name).map_err(|err| GpuError::Driver(format!("{name}: {err:?}")))
    }

    /// Loads every kernel of the manifest in `dir`, and its split-K reductions.
    pub fn load(&self, dir: &Path, m: &Manifest) -> Result<(Vec<Loaded>, Vec<LoadedReducer>), GpuError> {
        let arch = format!("sm_{}{}", self.cc.0, self.cc.1);
        let cubin_fits = m.cubin_arch.as_deref().is_some_and(|a| a.trim_end_matches('a') == arch);
        fn pick(c: &Option<String>, fits: bool) -> Option<&str> {
            c.as_deref().filter(|_| fits)
        }
        let mut out = Vec::new();
        for e in &m.entries {
            let func = self.load_one(dir, pick(&e.cubin, cubin_fits), &e.ptx, &e.name)?;
            func.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                e.kernel.smem_bytes() as i32,
            )
            .map_err(|err| {
                GpuError::Driver(format!("{}: shared memory {}: {err:?}", e.name, e.kernel.smem_bytes()))
            })?;
            let regs = func.num_regs().map_err(drv)?.max(0) as usize;
            out.push(Loaded { kernel: e.kernel, func, regs });
        }
        let mut reducers = Vec::new();
        for r in &m.reducers {
            let func = self.load_one(dir, pick(&r.cubin, cubin_fits), &r.ptx, &r.name)?;
            reducers.push(LoadedReducer { kernel: r.kernel, func });
        }
        Ok((out, reducers))
    }

    /// What every launch of `k` on `p` needs of its operands, so that no element it
    /// can touch lies outside a buffer (the launches' `unsafe` rests on this): the
    /// shape rules, 16-byte aligned rows and batch strides of A and B, and A, B, C
    /// and what `epilogue` reads covering the product with its strides and batch.
    fn check_operands(
        &self,
        k: &GemmKernel,
        p: &Problem,
        first_row: usize,
        o: &DeviceOperands,
        epilogue: Epilogue,
    ) -> Result<(), GpuError> {
        k.accepts(p).map_err(|e| GpuError::Plan(format!("{k} on {p}: {e}")))?;
        // The 16-byte copies' alignment (a SIMT kernel reads element by element).
        let aligned = [o.lda, o.ldb, o.sa, o.sb].iter().all(|x| x.is_multiple_of(8));
        if !k.is_cover() && !aligned {
            return Err(GpuError::Plan(format!(
                "{k} on {p}: lda, ldb and A's and B's batch strides must be multiples of 8"
            )));
        }
        let who = k.to_string();
        let (brows, bcols) = k.b.extent(p);
        let ra = row_offset(&who, p, first_row, o.lda)?;
        holds(&who, p, "A", o.a.len().saturating_sub(ra), (p.m, o.lda, p.k, o.sa))?;
        holds(&who, p, "B", o.b.len(), (brows, o.ldb, bcols, o.sb))?;
        check_outputs(&who, p, first_row, o, epilogue)
    }

    /// The buffers a reduction's launch on `p` touches: C's `M` rows of `ldc ≥ N`
    /// past `c_off`, the bias and the residual as its epilogue reads them.
    fn check_reduce_operands(
        &self,
        r: &LoadedReducer,
        p: &Problem,
        first_row: usize,
        o: &DeviceOperands,
    ) -> Result<(), GpuError> {
        let bad = |what: String| Err(GpuError::Plan(format!("{} on {p}: {what}", r.kernel)));
        if p.batch != 1 || p.m == 0 || p.n == 0 || o.ldc < p.n {
            return bad(format!("a reduction takes one product with M, N ≥ 1 and ldc ≥ N (ldc {})", o.ldc));
        }
        if p.m.checked_mul(o.ldc).is_none_or(|x| x > i32::MAX as usize) {
            return bad("M·ldc exceeds the kernel's 32-bit indices".into());
        }
        check_outputs(&r.kernel.to_string(), p, first_row, o, r.kernel.epilogue)
    }

    /// A's and B's tensor maps for TMA kernel `k` on `p` (A from row `first_row`),
    /// built on the first launch of this tile shape on `o`. A batch's operands must
    /// not overlap (TMA walks a batch as a third dimension).
    fn tensor_maps(
        &self,
        k: &GemmKernel,
        p: &Problem,
        first_row: usize,
        o: &mut DeviceOperands,
    ) -> Result<[TensorMap; 2], GpuError> {
        let (pa, _ga) = o.a.device_ptr(&self.stream);
        // 16-byte aligned, as TMA needs: lda is a multiple of 8 (checked).
        let pa = pa + 2 * (first_row * o.lda) as u64;
        let (pb, _gb) = o.b.device_ptr(&self.stream);
        let key = MapKey {
            elem: k.elem,
            bm: k.bm,
            bn: k.bn,
            p: *p,
            addrs: [pa, pb],
            strides: [o.lda, o.ldb, o.sa, o.sb],
        };
        if let Some((_, maps)) = o.maps.iter().find(|(kk, _)| *kk == key) {
            return Ok(*maps);
        }
        // B's rows: N of K columns (K-major), or K of N columns (N-major: boxes
        // of a step's K rows by 64 columns, one a 64-column block of the tile).
        let (b_rows, b_cols, b_box) = match k.b {
            BLayout::NMajor => (p.k, p.n, BK_WGMMA),
            _ => (p.n, p.k, k.bn),
        };
        if p.batch > 1 && (o.sa < p.m * o.lda || o.sb < b_rows * o.ldb) {
            return Err(GpuError::Plan(format!(
                "{k} on {p}: a TMA kernel needs batch strides past the operands' rows (A {}, B {})",
                o.sa, o.sb
            )));
        }
        let a = MapSpec { rows: p.m, cols: p.k, ld: o.lda, batch: p.batch, stride: o.sa, box_rows: k.bm };
        let b =
            MapSpec { rows: b_rows, cols: b_cols, ld: o.ldb, batch: p.batch, stride: o.sb, box_rows: b_box };
        let maps = [encode_map(k.elem, pa, &a)?, encode_map(k.elem, pb, &b)?];
        o.maps.push((key, maps));
        Ok(maps)
    }

    /// Launches `l` on `p` (asynchronously, on the device's stream), whose rows
    /// start `first_row` rows into A, C and the residual (0: the whole product; a
    /// piece of a two-size cover otherwise).
    pub fn launch(
        &self,
        l: &Loaded,
        (p, first_row): (&Problem, usize),
        o: &mut DeviceOperands,
    ) -> Result<(), GpuError> {
        let k = &l.kernel;
        if k.split_k {
            return Err(GpuError::Plan(format!("{k} is a split-K kernel: launch_split runs it")));
        }
        self.check_operands(k, p, first_row, o, k.epilogue)?;
        let maps = if k.tma { Some(self.tensor_maps(k, p, first_row, o)?) } else { None };
        // A persistent kernel: a block an SM at most, walking the tiles.
        let grid = if k.persistent {
            (k.blocks(p).min(self.limits.sms) as u32, 1, 1)
        } else {
            (p.n.div_ceil(k.bn) as u32, p.m.div_ceil(k.bm) as u32, p.batch as u32)
        };
        self.launch_words(l, (p, first_row), o, grid, None, maps.as_ref())
    }

    /// A launch of `l`'s grid `grid` with the ABI's words (`kernel::ABI`): the
    /// five pointers, six i32 and three i64 batch strides, a folding kernel's
    /// `kper`, workspace and counters (`fold`), a persistent kernel's batch,
    /// and a TMA kernel's two tensor maps, in that order. The callers have
    /// checked that every element the launch can touch lies inside the
    /// buffers.
    fn launch_words(
        &self,
        l: &Loaded,
        (p, first_row): (&Problem, usize),
        o: &mut DeviceOperands,
        grid: (u32, u32, u32),
        fold: Option<(i32, &mut CudaSlice<f32>, &mut CudaSlice<i64>)>,
        maps: Option<&[TensorMap; 2]>,
    ) -> Result<(), GpuError> {
        let k = &l.kernel;
        let cfg = LaunchConfig {
            grid_dim: grid,
            block_dim: (k.threads() as u32, 1, 1),
            shared_mem_bytes: k.smem_bytes() as u32,
        };
        let (m, n, kk, batch) = (p.m as i32, p.n as i32, p.k as i32, p.batch as i32);
        let (lda, ldb, ldc) = (o.lda as i32, o.ldb as i32, o.ldc as i32);
        let (sa, sb, sc) = (o.sa as i64, o.sb as i64, o.sc as i64);
        let mut x = o.at_row(first_row);
        let mut b = self.stream.launch_builder(&l.func);
        b.arg(&x.a).arg(x.b).arg(&mut x.c).arg(x.bias).arg(&x.residual);
        b.arg(&m).arg(&n).arg(&kk).arg(&lda).arg(&ldb).arg(&ldc).arg(&sa).arg(&sb).arg(&sc);
        let kper = fold.as_ref().map(|f| f.0);
        if let (Some(kper), Some((_, w, cnt))) = (&kper, fold) {
            b.arg(kper).arg(w).arg(cnt);
        }
        if k.persistent {
            b.arg(&batch);
        }
        if let Some([ta, tb]) = maps {
            b.arg(ta).arg(tb);
        }
        // SAFETY: the arguments match the kernel's ABI (`kernel::ABI`: five global
        // pointers, six i32, three i64, in that order, a folding kernel's `kper`,
        // workspace and counters, a persistent kernel's batch, and a TMA
        // kernel's two tensor maps), and every element the launch can touch lies
        // inside the buffers (checked by the callers against M, N, K, the
        // strides, the batch and the first row, and a fold's workspace and
        // counters against `fold_space`; a tensor map reads only inside the
        // extents it was built with, and zero-fills the rest; a persistent
        // grid's blocks take only tiles below the product's count, a Stream-K
        // grid's only steps below the product's); the dynamic shared memory is
        // what the kernel was built for and was allowed on load.
        unsafe { b.launch(cfg) }.map_err(|e| GpuError::Driver(format!("{k} on {p}: {e:?}")))?;
        Ok(())
    }

    /// Launches split-K kernel `l` on `p` in `splits` shares of K (fewer where the
    /// last would have no work: the number run is returned) into the f32 workspace
    /// `w` (at least `splits · M · N`), then `r`, which sums the shares into C with
    /// the epilogue. Without `r` only the shares are computed (the wave model's
    /// calibration measures the kernel alone; the model adds the reduction).
    pub fn launch_split(
        &self,
        l: &Loaded,
        r: Option<&LoadedReducer>,
        (p, first_row): (&Problem, usize),
        splits: usize,
        o: &mut DeviceOperands,
        w: &mut CudaSlice<f32>,
    ) -> Result<usize, GpuError> {
        let k = &l.kernel;
        if !k.split_k || k.fold {
            return Err(GpuError::Plan(format!("{k} is not a split-K kernel with a reduction")));
        }
        if let Some(r) = r.filter(|r| r.kernel.elem != k.elem) {
            return Err(GpuError::Plan(format!("{} does not reduce {k}'s element type", r.kernel)));
        }
        self.check_operands(k, p, first_row, o, r.map_or(Epilogue::NONE, |r| r.kernel.epilogue))?;
        let (per, splits) = k.split_plan(p.k, splits);
        let maps = if k.tma { Some(self.tensor_maps(k, p, first_row, o)?) } else { None };
        let mn = p.m * p.n;
        if w.len() < splits * mn {
            return Err(GpuError::Plan(format!(
                "{k} on {p}: a workspace of {} floats, {} needed",
                w.len(),
                splits * mn
            )));
        }
        let cfg = LaunchConfig {
            grid_dim: (p.n.div_ceil(k.bn) as u32, p.m.div_ceil(k.bm) as u32, splits as u32),
            block_dim: (k.threads() as u32, 1, 1),
            shared_mem_bytes: k.smem_bytes() as u32,
        };
        let (m, n, kk) = (p.m as i32, p.n as i32, p.k as i32);
        let (lda, ldb, ldw) = (o.lda as i32, o.ldb as i32, p.n as i32);
        let (zero, sw, kper) = (0i64, mn as i64, per as i32);
        let x = o.at_row(first_row);
        let mut b = self.stream.launch_builder(&l.func);
        b.arg(&x.a).arg(x.b).arg(&mut *w).arg(x.bias).arg(&x.residual);
        b.arg(&m).arg(&n).arg(&kk).arg(&lda).arg(&ldb).arg(&ldw).arg(&zero).arg(&zero).arg(&sw).arg(&kper);
        if let Some([ta, tb]) = &maps {
            b.arg(ta).arg(tb);
        }
        // SAFETY: the split-K ABI (`kernel::ABI`, a trailing i32 `kper`, and a TMA
        // kernel's two tensor maps, built for this product): split `z`
        // reads A and B within M, N and K (checked above) and writes its `[M, N]` f32
        // slice at `z · M · N` of the workspace, which holds all `splits` slices.
        unsafe { b.launch(cfg) }.map_err(|e| GpuError::Driver(format!("{k} on {p}: {e:?}")))?;
        drop(b);
        if let Some(r) = r {
            self.launch_reduce(r, (p, first_row), splits, o, w)?;
        }
        Ok(splits)
    }

    /// Launches Stream-K kernel `l` on `p` in `blocks` blocks, each an even
    /// share of all the tiles' K steps (`GemmKernel::stream_k`), folding the
    /// tiles it shares into the f32 workspace `w` (`GemmKernel::fold_space` at
    /// `stream_slots` shares a tile) through the tiles' counters `cnt` (zero,
    /// and zero again after the launch).
    pub fn launch_stream_k(
        &self,
        l: &Loaded,
        (p, first_row): (&Problem, usize),
        blocks: usize,
        o: &mut DeviceOperands,
        (w, cnt): (&mut CudaSlice<f32>, &mut CudaSlice<i64>),
    ) -> Result<(), GpuError> {
        let k = &l.kernel;
        if !k.stream_k {
            return Err(GpuError::Plan(format!("{k} is not a Stream-K kernel")));
        }
        self.check_operands(k, p, first_row, o, k.epilogue)?;
        let slots = k.stream_slots(p, blocks);
        if slots == 0 {
            return Err(GpuError::Plan(format!(
                "{k} on {p}: {blocks} blocks, more than the product's K steps"
            )));
        }
        let (floats, tiles) = k.fold_space(p, slots);
        let maps = if k.tma { Some(self.tensor_maps(k, p, first_row, o)?) } else { None };
        if w.len() < floats || cnt.len() < tiles {
            return Err(GpuError::Plan(format!(
                "{k} on {p}: a workspace of {} floats and {} counters, {floats} and {tiles} needed",
                w.len(),
                cnt.len()
            )));
        }
        let fold = Some((slots as i32, w, cnt));
        self.launch_words(l, (p, first_row), o, (blocks as u32, 1, 1), fold, maps.as_ref())
    }

    /// The second launch of a split-K product alone: `r` sums the `splits` f32
    /// shares `[M, N]` of `w` into C (through its epilogue). The bench times it
    /// alone for the wave model ([`crate::ReduceRate`]).
    pub fn launch_reduce(
        &self,
        r: &LoadedReducer,
        (p, first_row): (&Problem, usize),
        splits: usize,
        o: &mut DeviceOperands,
        w: &CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        self.check_reduce_operands(r, p, first_row, o)?;
        let mn = p.m * p.n;
        if splits == 0 || splits.checked_mul(mn).is_none_or(|x| w.len() < x) {
            return Err(GpuError::Plan(format!(
                "{} on {p}: a workspace of {} floats for {splits} splits",
                r.kernel,
                w.len()
            )));
        }
        let (m, n, sw) = (p.m as i32, p.n as i32, mn as i64);
        let rcfg = LaunchConfig {
            grid_dim: (mn.div_ceil(ReduceKernel::THREADS) as u32, 1, 1),
            block_dim: (ReduceKernel::THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (ldc, nsplits) = (o.ldc as i32, splits as i32);
        let mut x = o.at_row(first_row);
        let mut rb = self.stream.launch_builder(&r.func);
        rb.arg(w).arg(&mut x.c).arg(x.bias).arg(&x.residual);
        rb.arg(&m).arg(&n).arg(&ldc).arg(&nsplits).arg(&sw);
        // SAFETY: the reduction's ABI (`ReduceKernel`): thread `i < M·N` reads the
        // `splits` slices of the workspace at `i`, the bias at `n < N`, the residual
        // and C at `m·ldc + n`, all inside the buffers checked above.
        unsafe { rb.launch(rcfg) }.map_err(|e| GpuError::Driver(format!("{} on {p}: {e:?}", r.kernel)))?;
        Ok(())
    }

    pub fn alloc_f32(&self, n: usize) -> Result<CudaSlice<f32>, GpuError> {
        self.stream.alloc_zeros::<f32>(n.max(1)).map_err(drv)
    }

    /// Zeroed counters (a Stream-K launch's, one a tile).
    pub fn alloc_counters(&self, n: usize) -> Result<CudaSlice<i64>, GpuError> {
        self.stream.alloc_zeros::<i64>(n.max(1)).map_err(drv)
    }

    /// Device seconds per call of `f`: `per_graph` calls captured into a CUDA graph,
    /// the graph replayed up to `reps` times between two events, the median replay
    /// over `per_graph` (so that the host's launch cost, which the graph removes, is
    /// not counted; the same method times cuBLAS in bench/gpu/cublas.py). Replays
    /// stop early once [`MIN_REPS`] of them have taken [`TIME_BUDGET_S`] of device
    /// time: a long product's replays vary little, and the sweep's hundreds of
    /// choices fit a device call only so. Where the capture fails, back-to-back
    /// launches between the events instead; the second value says which (`true`:
    /// the graph).
    pub fn time(
        &self,
        reps: usize,
        per_graph: usize,
        mut f: impl FnMut() -> Result<(), GpuError>,
    ) -> Result<(f64, bool), GpuError> {
        // Warm: the first launches load the module's code onto the device.
        for _ in 0..2 {
            f()?;
        }
        self.sync()?;
        let per_graph = per_graph.max(1);
        let graph = match self.stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        {
            Ok(()) => {
                let mut ok = true;
                for _ in 0..per_graph {
                    if f().is_err() {
                        ok = false;
                        break;
                    }
                }
                let g = self.stream.end_capture(CUgraphInstantiate_flags(0));
                match (ok, g) {
                    (true, Ok(Some(g))) => Some(g),
                    _ => None,
                }
            }
            Err(_) => None,
        };
        let used_graph = graph.is_some();
        let mut run = || -> Result<(), GpuError> {
            match &graph {
                Some(g) => g.launch().map_err(drv),
                None => (0..per_graph).try_for_each(|_| f()),
            }
        };
        run()?;
        let mut times = Vec::with_capacity(reps);
        let mut spent = 0.0;
        for _ in 0..reps.max(1) {
            let start = self.stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(drv)?;
            run()?;
            let end = self.stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(drv)?;
            end.synchronize().map_err(drv)?;
            let replay = start.elapsed_ms(&end).map_err(drv)? as f64 * 1e-3;
            times.push(replay / per_graph as f64);
            spent += replay;
            if times.len() >= MIN_REPS && spent >= TIME_BUDGET_S {
                break;
            }
        }
        times.sort_by(f64::total_cmp);
        Ok((times[times.len() / 2], used_graph))
    }

    pub fn sync(&self) -> Result<(), GpuError> {
        self.stream.synchronize().map_err(drv)
    }

    pub fn upload(&self, x: &[u16]) -> Result<CudaSlice<u16>, GpuError> {
        self.stream.clone_htod(x).map_err(drv)
    }

    pub fn download(&self, x: &CudaSlice<u16>) -> Result<Vec<u16>, GpuError> {
        self.stream.clone_dtoh(x).map_err(drv)
    }
}
