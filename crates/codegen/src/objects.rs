//! The on-disk object cache: every module compiled to an object file is kept
//! under `<cache>/objects/`, named by a hash of what determines its machine
//! code (the module's IR before optimization, the CPU and features, LLVM's
//! version, the pass pipeline and [`FORMAT`]). A second compile of the same
//! model builds its IR again (cheap), finds every object and skips LLVM's
//! optimization and instruction selection, which are nearly all of a cold
//! compile.
//!
//! A file holds the BLAKE3 hash of the object followed by the object; one that
//! is truncated or altered fails the check and is compiled and written again.
//! Files are written to a temporary name and renamed, so that concurrent
//! compiles never read a half-written object.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The layout of a cached object and of what it is keyed by; a change here
/// (or in how objects are emitted) bumps it, so old files are never read.
pub const FORMAT: u32 = 1;

/// The LLVM pass pipeline every module is optimized with.
pub(crate) const PIPELINE: &str = "default<O3>";

/// Where compiled objects are kept (or nowhere), with counts of the modules
/// found and compiled, for reports and tests.
#[derive(Debug, Default)]
pub struct ObjectCache {
    dir: Option<PathBuf>,
    hits: AtomicUsize,
    misses: AtomicUsize,
}

impl ObjectCache {
    /// No cache: every module is compiled.
    pub fn none() -> ObjectCache {
        ObjectCache::default()
    }

    /// Objects under `<dir>/objects` (`dir`: the tuning cache folder).
    pub fn in_dir(dir: impl Into<PathBuf>) -> ObjectCache {
        ObjectCache { dir: Some(dir.into().join("objects")), ..ObjectCache::default() }
    }

    /// The folder the objects are in, if any.
    pub fn dir(&self) -> Option<&std::path::Path> {
        self.dir.as_deref()
    }

    /// Modules whose object was found.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::Relaxed)
    }

    /// Modules compiled (and stored, where there is a folder).
    pub fn misses(&self) -> usize {
        self.misses.load(Ordering::Relaxed)
    }

    /// The key of a module: a hex hash of everything its object depends on.
    pub(crate) fn key(source: &str, cpu: &str, features: &str) -> String {
        let (major, minor, patch) = inkwell::support::get_llvm_version();
        let mut h = blake3::Hasher::new();
        for part in [
            &format!("anyshape-object {FORMAT} llvm {major}.{minor}.{patch} {PIPELINE}"),
            cpu,
            features,
            source,
        ] {
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        h.finalize().to_hex().to_string()
    }

    /// The stored object of `key`, if there is an intact one. Counts a hit or a
    /// miss.
    pub(crate) fn get(&self, key: &str) -> Option<Vec<u8>> {
        let found = self.dir.as_ref().and_then(|dir| {
            let path = dir.join(format!("{key}.o"));
            let bytes = std::fs::read(&path).ok()?;
            match bytes.split_at_checked(32) {
                Some((hash, object)) if blake3::hash(object).as_bytes() == hash => Some(object.to_vec()),
                _ => {
                    tracing::warn!("{}: damaged; compiling it again", path.display());
                    None
                }
            }
        });
        let counter = if found.is_some() { &self.hits } else { &self.misses };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// Store `object` under `key` (a warning, not an error, when the folder is
    /// not writable: the compile goes on without the cache).
    pub(crate) fn put(&self, key: &str, object: &[u8]) {
        let Some(dir) = &self.dir else { return };
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(dir)?;
            let tmp =
                dir.join(format!("{key}.o.{}.{:?}.tmp", std::process::id(), std::thread::current().id()));
            let mut bytes = Vec::with_capacity(32 + object.len());
            bytes.extend_from_slice(blake3::hash(object).as_bytes());
            bytes.extend_from_slice(object);
            std::fs::write(&tmp, &bytes)?;
            std::fs::rename(&tmp, dir.join(format!("{key}.o"))).inspect_err(|_| {
                let _ = std::fs::remove_file(&tmp);
            })
        };
        if let Err(e) = write() {
            tracing::warn!("cannot store a compiled object in {}: {e}", dir.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use inkwell::values::BasicValue;
    use inkwell::AddressSpace;
    use kernels::Target;

    use super::ObjectCache;
    use crate::{jit_module, llvm, CodegenError};

    /// A module whose object needs the loader's harder cases: `copy(d, s, n)`
    /// calls `memcpy` and `power(x, y)` calls libm's `powf` (far symbols,
    /// through stubs), `pick()` returns the address of `add1` (a GOT load under
    /// PIC) and `scaled(x)` multiplies by a constant vector (a constant pool,
    /// PC-relative).
    fn build(
        ctx: &'static inkwell::context::Context,
        module: &inkwell::module::Module<'static>,
    ) -> Result<(), CodegenError> {
        let (i64t, f32t, ptr) = (ctx.i64_type(), ctx.f32_type(), ctx.ptr_type(AddressSpace::default()));
        let b = ctx.create_builder();
        // copy(d, s, n): an opaque-length memcpy.
        let copy = module.add_function(
            "copy",
            ctx.void_type().fn_type(&[ptr.into(), ptr.into(), i64t.into()], false),
            None,
        );
        b.position_at_end(ctx.append_basic_block(copy, "entry"));
        let p = |i| copy.get_nth_param(i).ok_or_else(|| llvm("param"));
        let (d, s, n) = (p(0)?.into_pointer_value(), p(1)?.into_pointer_value(), p(2)?.into_int_value());
        b.build_memcpy(d, 4, s, 4, n).map_err(llvm)?;
        b.build_return(None).map_err(llvm)?;
        // add1(x) = x + 1; pick() = &add1.
        let add1 = module.add_function("add1", i64t.fn_type(&[i64t.into()], false), None);
        b.position_at_end(ctx.append_basic_block(add1, "entry"));
        let x = add1.get_nth_param(0).ok_or_else(|| llvm("param"))?.into_int_value();
        let y = b.build_int_add(x, i64t.const_int(1, false), "y").map_err(llvm)?;
        b.build_return(Some(&y)).map_err(llvm)?;
        let pick = module.add_function("pick", ptr.fn_type(&[], false), None);
        b.position_at_end(ctx.append_basic_block(pick, "entry"));
        let addr = add1.as_global_value().as_pointer_value();
        b.build_return(Some(&addr.as_basic_value_enum())).map_err(llvm)?;
        // scaled(v: ptr to 8 floats): v[i] *= 1 + i.
        let scaled = module.add_function("scaled", ctx.void_type().fn_type(&[ptr.into()], false), None);
        b.position_at_end(ctx.append_basic_block(scaled, "entry"));
        let v = scaled.get_nth_param(0).ok_or_else(|| llvm("param"))?.into_pointer_value();
        let vt = f32t.vec_type(8);
        let k = inkwell::types::VectorType::const_vector(
            &(0..8).map(|i| f32t.const_float(1.0 + f64::from(i))).collect::<Vec<_>>(),
        );
        let loaded = b.build_load(vt, v, "v").map_err(llvm)?;
        loaded.as_instruction_value().ok_or_else(|| llvm("load"))?.set_alignment(4).map_err(llvm)?;
        let prod = b.build_float_mul(loaded.into_vector_value(), k, "p").map_err(llvm)?;
        b.build_store(v, prod).map_err(llvm)?.set_alignment(4).map_err(llvm)?;
        b.build_return(None).map_err(llvm)?;
        // power(x, y) = x^y: a libm call (`powf`).
        let power = module.add_function("power", f32t.fn_type(&[f32t.into(), f32t.into()], false), None);
        b.position_at_end(ctx.append_basic_block(power, "entry"));
        let pow = inkwell::intrinsics::Intrinsic::find("llvm.pow").ok_or_else(|| llvm("llvm.pow"))?;
        let pow = pow.get_declaration(module, &[f32t.into()]).ok_or_else(|| llvm("llvm.pow.f32"))?;
        let args: Vec<_> = power.get_param_iter().map(Into::into).collect();
        let inkwell::values::ValueKind::Basic(r) =
            b.build_call(pow, &args, "r").map_err(llvm)?.try_as_basic_value()
        else {
            return Err(llvm("pow returns nothing"));
        };
        b.build_return(Some(&r)).map_err(llvm)?;
        Ok(())
    }

    fn check(image: &kernels::CodeImage) {
        let f = |n: &str| image.function(n).unwrap_or_else(|| panic!("no {n}"));
        // SAFETY: each address is the entry of the function of that name built
        // above, with the C signature it is transmuted to; `image` outlives the calls.
        unsafe {
            let copy: extern "C" fn(*mut f32, *const f32, i64) = std::mem::transmute(f("copy"));
            let src: Vec<f32> = (0..1000).map(|i| i as f32).collect();
            let mut dst = vec![0f32; 1000];
            copy(dst.as_mut_ptr(), src.as_ptr(), 4000);
            assert_eq!(dst, src);
            let pick: extern "C" fn() -> usize = std::mem::transmute(f("pick"));
            assert_eq!(pick(), f("add1"), "the GOT slot holds add1's address");
            let add1: extern "C" fn(i64) -> i64 = std::mem::transmute(pick());
            assert_eq!(add1(41), 42);
            let scaled: extern "C" fn(*mut f32) = std::mem::transmute(f("scaled"));
            let mut v = [2f32; 8];
            scaled(v.as_mut_ptr());
            assert_eq!(v, [2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0, 16.0]);
            let power: extern "C" fn(f32, f32) -> f32 = std::mem::transmute(f("power"));
            assert_eq!(power(2.0, 10.0), 1024.0);
            assert!((power(2.0, 0.5) - std::f32::consts::SQRT_2).abs() < 1e-6);
        }
    }

    #[test]
    fn objects_load_run_and_come_back_from_the_cache() {
        let t = Target::detect();
        if !t.supported() {
            eprintln!("skipped: no AVX2 and FMA on this machine");
            return;
        }
        let dir = std::env::temp_dir().join(format!("anyshape-objects-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let cache = ObjectCache::in_dir(&dir);
        let compile =
            |cache: &ObjectCache| jit_module(&t, "loader_test", cache, |c, m, _, _| build(c, m)).unwrap();

        let (image, ir) = compile(&cache);
        check(&image);
        assert_eq!((cache.hits(), cache.misses()), (0, 1));
        assert!(ir.text().contains("define"), "the optimized IR is made again on demand");

        // Compiled again: the object comes from the cache and runs the same.
        let (image, _) = compile(&cache);
        check(&image);
        assert_eq!((cache.hits(), cache.misses()), (1, 1));

        // A damaged file (one byte changed, then cut short) is compiled again and replaced.
        let file = std::fs::read_dir(cache.dir().unwrap()).unwrap().next().unwrap().unwrap().path();
        let mut bytes = std::fs::read(&file).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x40;
        std::fs::write(&file, &bytes).unwrap();
        check(&compile(&cache).0);
        assert_eq!((cache.hits(), cache.misses()), (1, 2));
        std::fs::write(&file, &bytes[..100]).unwrap();
        check(&compile(&cache).0);
        assert_eq!((cache.hits(), cache.misses()), (1, 3));
        check(&compile(&cache).0);
        assert_eq!((cache.hits(), cache.misses()), (2, 3), "the replaced file is intact");

        // Without a folder, nothing is stored.
        let none = ObjectCache::none();
        check(&compile(&none).0);
        check(&compile(&none).0);
        assert_eq!((none.hits(), none.misses()), (0, 2));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn keys_depend_on_everything_that_shapes_the_code() {
        let k = ObjectCache::key("define void @f() { ret void }", "znver4", "+avx2");
        assert_eq!(k, ObjectCache::key("define void @f() { ret void }", "znver4", "+avx2"));
        assert_ne!(k, ObjectCache::key("define void @g() { ret void }", "znver4", "+avx2"));
        assert_ne!(k, ObjectCache::key("define void @f() { ret void }", "znver5", "+avx2"));
        assert_ne!(k, ObjectCache::key("define void @f() { ret void }", "znver4", "+avx2,+avx512f"));
        // Parts are length-prefixed: moving text from one part to the next changes the key.
        assert_ne!(ObjectCache::key("ab", "c", ""), ObjectCache::key("a", "bc", ""));
    }
}
