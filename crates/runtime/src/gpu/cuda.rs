//! The driver's [`Device`]: an NVIDIA GPU through cudarc, which loads
//! libcuda at run time (nothing from CUDA at build time). A machine without
//! the driver, without a device, or with a GPU older than the kernels'
//! architecture gets an error saying which; so does running out of device
//! memory (naming the bytes) and a kernel that faults (the model is then
//! unusable, the process alive).

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys::{self, CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::{result, CudaContext, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;

use plan::gpu::KernelLaunch;

use super::{Device, DevicePtr, KernelArg, KernelCode, Launch, LaunchDims, StreamId};
use crate::RunError;

/// The oldest GPUs the kernels run on (their PTX targets sm_80).
pub const MIN_COMPUTE_CAPABILITY: (i32, i32) = (8, 0);

/// An open GPU: its context, its streams (0 its own, then one per caller),
/// and the kernels loaded.
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    streams: std::sync::Mutex<Vec<Arc<CudaStream>>>,
    funcs: Vec<CudaFunction>,
    /// How each kernel is launched.
    launches: Vec<KernelLaunch>,
    /// Each kernel's name, for errors.
    names: Vec<String>,
    /// Wait for each launch made outside a graph capture, so that a kernel
    /// that faults is named (`ANYSHAPE_GPU_SYNC=1`: a debugging aid that
    /// costs a round trip per launch).
    sync_each: bool,
    _modules: Vec<Arc<CudaModule>>,
    name: String,
    cc: (i32, i32),
}

/// A launch attribute's value with every field zero.
fn zeroed_attribute() -> sys::CUlaunchAttributeValue {
    // SAFETY: a C union of integers, structs of integers and pointers: all
    // zero bytes is a valid value of each.
    unsafe { std::mem::zeroed() }
}

fn driver(what: &str) -> impl Fn(result::DriverError) -> RunError + '_ {
    move |e| RunError::Device(format!("{what}: {e:?}"))
}

impl CudaDevice {
    /// GPU `ordinal`, with `kernels` (in index order) loaded: a kernel's cubin
    /// where it has one (the caller checked that it is for this GPU), else its
    /// PTX (the driver assembles it), each allowed the dynamic shared memory
    /// it asks for.
    pub fn open(ordinal: usize, kernels: &[KernelCode]) -> Result<CudaDevice, RunError> {
        // SAFETY: only asks the dynamic loader whether libcuda can be opened.
        if !unsafe { sys::is_culib_present() } {
            return Err(RunError::Device(
                "no NVIDIA driver: libcuda.so could not be loaded (install the NVIDIA driver, or run on a machine that has one)"
                    .into(),
            ));
        }
        let ctx = CudaContext::new(ordinal).map_err(driver(&format!("no CUDA device {ordinal}")))?;
        let name = ctx.name().map_err(driver("the device's name"))?;
        let attr = |a: CUdevice_attribute| ctx.attribute(a).map_err(driver("a device attribute"));
        let cc = (
            attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        if cc < MIN_COMPUTE_CAPABILITY {
            return Err(RunError::Device(format!(
                "{name} is sm_{}{}: the kernels need sm_{}{} or newer",
                cc.0, cc.1, MIN_COMPUTE_CAPABILITY.0, MIN_COMPUTE_CAPABILITY.1
            )));
        }
        if let Some(k) = kernels.iter().find(|k| k.launch == KernelLaunch::Dependent) {
            if cc.0 < 9 {
                return Err(RunError::Device(format!(
                    "{name} is sm_{}{}: kernel {} is built for dependent launches, which need sm_90 or newer",
                    cc.0, cc.1, k.name
                )));
            }
        }
        // SAFETY: every copy and launch goes on the one stream, so cudarc's
        // per-buffer events (which order uses across streams) order nothing here.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(driver("a stream"))?;
        let mut modules = Vec::with_capacity(kernels.len());
        let mut funcs = Vec::with_capacity(kernels.len());
        // Cubins the driver refused (one newer than it): their PTX is assembled
        // instead, and the device's name says how many.
        let mut refused = Vec::new();
        for k in kernels {
            let m = match k.cubin.as_ref().map(|c| ctx.load_module(Ptx::from_binary(c.clone()))) {
                Some(Ok(m)) => m,
                cubin => {
                    if let Some(Err(e)) = cubin {
                        refused.push(format!("{}: {e:?}", k.name));
                    }
                    ctx.load_module(Ptx::from_src(k.text.as_str())).map_err(driver(&k.name))?
                }
            };
            let f = m.load_function(&k.name).map_err(driver(&k.name))?;
            if k.smem > 0 {
                let bytes = i32::try_from(k.smem).unwrap_or(i32::MAX);
                f.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes)
                    .map_err(driver(&format!("{}: {} bytes of shared memory", k.name, k.smem)))?;
            }
            funcs.push(f);
            modules.push(m);
        }
        Ok(CudaDevice {
            ctx,
            streams: std::sync::Mutex::new(vec![stream]),
            funcs,
            launches: kernels.iter().map(|k| k.launch).collect(),
            names: kernels.iter().map(|k| k.name.clone()).collect(),
            sync_each: std::env::var_os("ANYSHAPE_GPU_SYNC").is_some_and(|v| v != "0"),
            _modules: modules,
            name: match refused.first() {
                None => format!("{name} (sm_{}{})", cc.0, cc.1),
                Some(first) => format!(
                    "{name} (sm_{}{}; the driver refused {} cubins, their PTX assembled instead: {first})",
                    cc.0,
                    cc.1,
                    refused.len()
                ),
            },
            cc,
        })
    }

    /// GPU `ordinal`'s compute capability (major, minor), before any kernel
    /// is built for it; the same errors as [`CudaDevice::open`] where there
    /// is no driver or no such device.
    pub fn compute_capability(ordinal: usize) -> Result<(i32, i32), RunError> {
        Ok(CudaDevice::open(ordinal, &[])?.cc)
    }

    /// With `sync_each`, the launch just made on `s` waited for, unless `s`
    /// is capturing a graph (where waiting is not allowed and nothing ran).
    fn waited(&self, s: &CudaStream, kernel: usize) -> Result<(), RunError> {
        if !self.sync_each {
            return Ok(());
        }
        // SAFETY: `s` is a live stream of this context.
        let capturing = unsafe { result::stream::is_capturing(s.cu_stream()) }
            .map_err(driver("asking whether a stream captures"))?;
        if capturing != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return Ok(());
        }
        s.synchronize().map_err(|e| driver(&format!("kernel {} failed", self.kernel_name(kernel)))(e))
    }

    fn bind(&self) -> Result<(), RunError> {
        self.ctx.bind_to_thread().map_err(driver("binding the context"))
    }

    /// Stream `id`, bound to this thread.
    fn stream(&self, id: StreamId) -> Result<Arc<CudaStream>, RunError> {
        self.bind()?;
        let streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        streams.get(id).cloned().ok_or_else(|| RunError::Internal(format!("no stream {id}")))
    }

    /// A timing mark (a CUDA event) on this device's context.
    fn event(&self) -> Result<cudarc::driver::CudaEvent, RunError> {
        self.ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)).map_err(driver("an event"))
    }
}

impl CudaDevice {
    /// `launches` captured on `stream` (thread-local: other callers' streams
    /// go on meanwhile), the capture ended by `end` whatever happened, so
    /// that the stream is usable again; a launch's error first.
    ///
    /// # Safety
    /// As [`Device::capture`] for each launch.
    unsafe fn captured<R>(
        &self,
        stream: StreamId,
        launches: &[Launch],
        end: impl FnOnce(&Arc<CudaStream>) -> Result<R, result::DriverError>,
    ) -> Result<Result<R, result::DriverError>, RunError> {
        let s = self.stream(stream)?;
        s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(driver("capturing a graph"))?;
        let mut failed = None;
        for l in launches {
            // SAFETY: the caller's contract (each launch's arguments are what its
            // kernel's ABI asks, whenever the graph runs); capturing runs nothing.
            if let Err(e) = unsafe { self.launch(stream, l.kernel, l.dims, &l.args) } {
                failed = Some(e);
                break;
            }
        }
        let ended = end(&s);
        match failed {
            Some(e) => Err(e),
            None => Ok(ended),
        }
    }
}

/// A captured graph not instantiated (what an exec update reads),
/// destroyed when dropped.
struct RawGraph(sys::CUgraph);

impl Drop for RawGraph {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: a graph a capture made, owned here, destroyed once.
            let _ = unsafe { result::graph::destroy(self.0) };
        }
    }
}

/// A call's launches captured as a CUDA graph (instantiated), run on the
/// stream it was captured on.
pub struct CudaGraphExec(cudarc::driver::CudaGraph);

// SAFETY: the graph's handles are driver objects that any thread may use
// with the context bound (cudarc's `launch` binds it first); a graph is run
// by one call at a time (its slot's).
unsafe impl Send for CudaGraphExec {}

impl Device for CudaDevice {
    type Graph = CudaGraphExec;

    unsafe fn capture(
        &self,
        stream: StreamId,
        launches: &[Launch],
    ) -> Result<Option<CudaGraphExec>, RunError> {
        // SAFETY: the caller's contract, passed on.
        let graph = unsafe {
            self.captured(stream, launches, |s| s.end_capture(sys::CUgraphInstantiate_flags_enum(0)))
        }?;
        Ok(graph.map_err(driver("instantiating a graph"))?.map(CudaGraphExec))
    }

    unsafe fn launch_graph(&self, stream: StreamId, graph: &CudaGraphExec) -> Result<(), RunError> {
        // The graph runs on the stream it was captured on: the caller's.
        let _ = self.stream(stream)?;
        graph.0.launch().map_err(driver("launching a graph"))
    }

    unsafe fn update_graph(
        &self,
        stream: StreamId,
        graph: &mut CudaGraphExec,
        launches: &[Launch],
    ) -> Result<bool, RunError> {
        // SAFETY: the stream is capturing when `end` runs (it ends the capture
        // begun by `captured`); the graph it makes is this function's, destroyed
        // when `RawGraph` drops.
        let end = |s: &Arc<CudaStream>| unsafe { result::stream::end_capture(s.cu_stream()) }.map(RawGraph);
        // SAFETY: the caller's contract, passed on.
        let g = match unsafe { self.captured(stream, launches, end) }? {
            Err(e) => return Err(driver("capturing a graph")(e)),
            Ok(g) if g.0.is_null() => return Ok(false),
            Ok(g) => g,
        };
        // SAFETY: the exec is the graph's own (live while `graph` is); `g` is
        // the captured graph, which the update reads; `info` is plain data the
        // driver writes.
        let updated = unsafe {
            let mut info: sys::CUgraphExecUpdateResultInfo = std::mem::zeroed();
            sys::cuGraphExecUpdate_v2(graph.0.cu_graph_exec(), g.0, &mut info)
        };
        match updated {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            // The update was refused (not performed); the caller drops the graph.
            sys::CUresult::CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE => Ok(false),
            e => Err(driver("updating a graph")(result::DriverError(e))),
        }
    }

    fn name(&self) -> String {
        self.name.clone()
    }

    fn kernel_name(&self, kernel: usize) -> String {
        self.names.get(kernel).cloned().unwrap_or_else(|| format!("#{kernel}"))
    }

    unsafe fn time_launches(&self, stream: StreamId, launches: &[Launch]) -> Result<Vec<f64>, RunError> {
        let s = self.stream(stream)?;
        let mut marks = vec![self.event()?];
        marks[0].record(&s).map_err(driver("recording an event"))?;
        for l in launches {
            // SAFETY: the caller's contract, passed on.
            unsafe { self.launch(stream, l.kernel, l.dims, &l.args)? };
            let e = self.event()?;
            e.record(&s).map_err(driver("recording an event"))?;
            marks.push(e);
        }
        s.synchronize().map_err(driver("a kernel on the GPU"))?;
        marks
            .windows(2)
            .map(|w| w[0].elapsed_ms(&w[1]).map(|ms| f64::from(ms) / 1e3).map_err(driver("timing a launch")))
            .collect()
    }

    unsafe fn time_graph(&self, stream: StreamId, graph: &CudaGraphExec) -> Result<f64, RunError> {
        let s = self.stream(stream)?;
        let (start, end) = (self.event()?, self.event()?);
        start.record(&s).map_err(driver("recording an event"))?;
        graph.0.launch().map_err(driver("launching a graph"))?;
        end.record(&s).map_err(driver("recording an event"))?;
        s.synchronize().map_err(driver("a kernel on the GPU"))?;
        start.elapsed_ms(&end).map(|ms| f64::from(ms) / 1e3).map_err(driver("timing a graph"))
    }

    fn alloc(&self, bytes: usize) -> Result<DevicePtr, RunError> {
        self.bind()?;
        // SAFETY: a plain allocation on the bound context (cuMemAlloc aligns to
        // at least 256 bytes).
        unsafe { result::malloc_sync(bytes.max(1)) }.map_err(|e| {
            RunError::Device(format!(
                "out of device memory on {}: {bytes} bytes asked for ({e:?})",
                self.name
            ))
        })
    }

    unsafe fn free(&self, p: DevicePtr) {
        if self.bind().is_ok() {
            // Whatever stream used it, its work is complete first.
            let _ = self.ctx.synchronize();
            // SAFETY: the caller's contract (from `alloc`, freed once, unused).
            let _ = unsafe { result::free_sync(p) };
        }
    }

    fn new_stream(&self) -> Result<StreamId, RunError> {
        self.bind()?;
        let s = self.ctx.new_stream().map_err(driver("a stream"))?;
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        streams.push(s);
        Ok(streams.len() - 1)
    }

    unsafe fn upload(&self, stream: StreamId, dst: DevicePtr, src: &[u8]) -> Result<(), RunError> {
        if src.is_empty() {
            return Ok(());
        }
        let s = self.stream(stream)?;
        // SAFETY: the caller's contract (the bytes lie in one live allocation);
        // `src` outlives the copy, which completes before this returns.
        unsafe { result::memcpy_htod_async(dst, src, s.cu_stream()) }.map_err(driver("a copy to the GPU"))?;
        s.synchronize().map_err(driver("a copy to the GPU"))
    }

    unsafe fn copy(
        &self,
        stream: StreamId,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<(), RunError> {
        if bytes == 0 {
            return Ok(());
        }
        let s = self.stream(stream)?;
        // SAFETY: the caller's contract (both ranges in device memory, apart).
        unsafe { result::memcpy_dtod_async(dst, src, bytes, s.cu_stream()) }
            .map_err(driver("a copy on the GPU (or a kernel before it failed)"))?;
        s.synchronize().map_err(driver("a kernel or a copy on the GPU"))
    }

    fn check_foreign(&self, what: &str, ptr: DevicePtr, bytes: usize) -> Result<(), RunError> {
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        let mut ordinal: i32 = -1;
        // SAFETY: the attribute is an `int`, written to `ordinal`; the driver
        // only looks the address up (an unknown one is an error, not a fault).
        let asked = unsafe {
            sys::cuPointerGetAttribute(
                (&mut ordinal as *mut i32).cast::<c_void>(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                ptr,
            )
        }
        .result();
        match asked {
            Ok(()) if ordinal == self.ctx.ordinal() as i32 => Ok(()),
            Ok(()) => Err(RunError::Shape(format!(
                "{what} is in the memory of GPU {ordinal}; this session runs on GPU {}",
                self.ctx.ordinal()
            ))),
            Err(_) => Err(RunError::Shape(format!("{what} is not in GPU memory (address {ptr:#x})"))),
        }
    }

    unsafe fn wait_foreign(&self, stream: u64) -> Result<(), RunError> {
        self.bind()?;
        // SAFETY: the caller's contract: a live stream of this context, or the
        // driver's handles of the default streams.
        unsafe { result::stream::synchronize(stream as sys::CUstream) }
            .map_err(driver("waiting for the caller's stream"))
    }

    unsafe fn download(&self, stream: StreamId, src: DevicePtr, dst: &mut [u8]) -> Result<(), RunError> {
        if dst.is_empty() {
            return Ok(());
        }
        let s = self.stream(stream)?;
        // SAFETY: the caller's contract; `dst` outlives the copy, which completes
        // (after every launch before it on the stream) before this returns.
        unsafe { result::memcpy_dtoh_async(dst, src, s.cu_stream()) }
            .map_err(driver("a copy from the GPU (or a kernel before it failed)"))?;
        s.synchronize().map_err(driver("a kernel or a copy from the GPU"))
    }

    unsafe fn launch(
        &self,
        stream: StreamId,
        kernel: usize,
        dims: LaunchDims,
        args: &[KernelArg],
    ) -> Result<(), RunError> {
        let s = self.stream(stream)?;
        let f = self.funcs.get(kernel).ok_or_else(|| RunError::Internal(format!("no kernel {kernel}")))?;
        // Each value in its own 8 bytes; the driver reads a parameter's size from
        // its address (an i32 is the low 4 bytes: x86-64 and aarch64 are little-endian).
        let mut vals: Vec<u64> = args.iter().map(KernelArg::word).collect();
        let mut params: Vec<*mut c_void> = vals.iter_mut().map(|v| v as *mut u64 as *mut c_void).collect();
        if self.launches.get(kernel) == Some(&KernelLaunch::Dependent) {
            // A programmatic dependent: launched while the kernel before it
            // runs; its code waits for that kernel before touching memory.
            let mut value: sys::CUlaunchAttributeValue = zeroed_attribute();
            value.programmaticStreamSerializationAllowed = 1;
            let mut attr = sys::CUlaunchAttribute {
                id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                pad: [0; 4],
                value,
            };
            let config = sys::CUlaunchConfig {
                gridDimX: dims.grid[0],
                gridDimY: dims.grid[1],
                gridDimZ: dims.grid[2],
                blockDimX: dims.threads,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: dims.smem,
                hStream: s.cu_stream(),
                attrs: &mut attr,
                numAttrs: 1,
            };
            // SAFETY: as for the plain launch below; `config` and its attribute
            // live until the call returns (the driver copies them).
            return unsafe {
                sys::cuLaunchKernelEx(&config, f.cu_function(), params.as_mut_ptr(), std::ptr::null_mut())
            }
            .result()
            .map_err(|e| driver(&format!("launching kernel {} (dependent)", self.kernel_name(kernel)))(e))
            .and_then(|()| self.waited(&s, kernel));
        }
        // SAFETY: the caller's contract (the kernel's ABI: device pointers into live
        // allocations, integers of the declared types); the parameter values are
        // copied by the driver when the launch is enqueued.
        unsafe {
            result::launch_kernel(
                f.cu_function(),
                (dims.grid[0], dims.grid[1], dims.grid[2]),
                (dims.threads, 1, 1),
                dims.smem,
                s.cu_stream(),
                &mut params,
            )
        }
        // The message is made only on an error: launches are the run path.
        .map_err(|e| driver(&format!("launching kernel {}", self.kernel_name(kernel)))(e))?;
        self.waited(&s, kernel)
    }
}
