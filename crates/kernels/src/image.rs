//! Machine code loaded from a relocatable ELF object (`.o`, x86-64), without
//! LLVM and without a system linker: the form in which `codegen` caches its
//! kernels on disk and in which a compiled artifact carries them, so that
//! code compiled once runs where only the runtime is.
//!
//! Loading lays the object's allocated sections out in one anonymous mapping,
//! resolves its symbols (its own definitions, and the C library functions
//! that LLVM may call: `memcpy`, `memset`, libm's `powf`, `sinf`, ...), applies the x86-64
//! relocations a small-code-model object uses (absolute 64-bit, PC-relative
//! 32/64-bit, PLT calls, GOT loads: the GOT slots and call stubs for far
//! symbols live in the same mapping), and only then makes the mapping
//! executable (never writable and executable at once). Anything else, such as
//! another architecture, a writable or thread-local section or an unknown
//! relocation, is an error that names it.

use std::collections::HashMap;

use object::elf;
use object::{
    Object, ObjectSection, ObjectSymbol, RelocationFlags, RelocationTarget, SectionFlags, SectionIndex,
    SectionKind, SymbolIndex, SymbolSection,
};
use plan::EntryFn;

/// The most bytes an object's loaded sections may take (a kernel module takes
/// kilobytes; more is a damaged object).
const MAX_IMAGE: usize = 1 << 30;

/// Why an object could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("not a loadable object: {0}")]
    Format(String),
    #[error("the object needs `{0}`, which is neither defined in it nor one of the C functions provided")]
    Undefined(String),
    #[error("relocation {r_type} at {section}+{offset:#x} is not supported")]
    Relocation { r_type: u32, section: String, offset: u64 },
    #[error("relocation at {section}+{offset:#x}: the target is out of reach of a 32-bit displacement")]
    OutOfRange { section: String, offset: u64 },
    #[error("no {kind} `{name}` in the image")]
    Missing { kind: &'static str, name: String },
    #[error("mapping the code: {0}")]
    Map(#[from] std::io::Error),
}

/// A loaded object's code and constants, mapped read + execute. Function
/// addresses stay valid while the image lives.
pub struct CodeImage {
    map: memmap2::Mmap,
    /// The object it was loaded from (what a compiled artifact stores).
    object: Vec<u8>,
    /// Defined functions: name → (offset in `map`, size in bytes).
    functions: HashMap<String, (usize, u64)>,
}

impl std::fmt::Debug for CodeImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CodeImage")
            .field("bytes", &self.map.len())
            .field("functions", &self.functions.len())
            .finish()
    }
}

/// Declares the C library functions generated code may call, and maps their
/// names to their addresses. The declarations only take addresses (never called
/// from Rust), so they carry no signature.
macro_rules! c_functions {
    ($($name:ident)*) => {
        /// The address of the C library function `name`, if it is one generated
        /// code may call: LLVM turns copy and fill loops into `memcpy` and
        /// `memset`, and scalar `pow`, `exp`, `sin`, `frem`, ... (and the vector
        /// forms it scalarizes) into libm calls.
        fn c_function(name: &str) -> Option<usize> {
            extern "C" {
                $(fn $name();)*
            }
            match name {
                $(stringify!($name) => Some($name as *const () as usize),)*
                _ => None,
            }
        }
    };
}

c_functions! {
    memcpy memmove memset
    powf expf exp2f exp10f expm1f logf log2f log10f log1pf sinf cosf tanf sincosf
    asinf acosf atanf atan2f sinhf coshf tanhf erff erfcf cbrtf fmodf remainderf ldexpf
    floorf ceilf truncf roundf rintf nearbyintf sqrtf fmaf fminf fmaxf
    pow exp exp2 exp10 expm1 log log2 log10 log1p sin cos tan sincos
    asin acos atan atan2 sinh cosh tanh erf erfc cbrt fmod remainder ldexp
    floor ceil trunc round rint nearbyint sqrt fma fmin fmax
}

fn format<E: std::fmt::Display>(e: E) -> ImageError {
    ImageError::Format(e.to_string())
}

/// What a symbol resolves to while loading.
#[derive(Clone, Copy)]
enum Resolved {
    /// An offset in the mapping.
    Local(usize),
    /// An absolute address outside it (a C library function).
    Far(usize),
}

impl CodeImage {
    /// Load `object` (an x86-64 relocatable ELF file, as LLVM emits it).
    pub fn load(object: &[u8]) -> Result<CodeImage, ImageError> {
        let file = object::File::parse(object).map_err(format)?;
        if file.kind() != object::ObjectKind::Relocatable
            || file.architecture() != object::Architecture::X86_64
        {
            return Err(ImageError::Format(format!(
                "a {:?} {:?} file, not an x86-64 relocatable object",
                file.architecture(),
                file.kind()
            )));
        }
        if !cfg!(target_arch = "x86_64") {
            return Err(ImageError::Format("x86-64 code on another architecture".into()));
        }

        // 1. Lay the allocated sections out.
        let mut base: HashMap<SectionIndex, usize> = HashMap::new();
        let mut size = 0usize;
        for s in file.sections() {
            let SectionFlags::Elf { sh_flags } = s.flags() else { return Err(format("not ELF")) };
            if sh_flags & u64::from(elf::SHF_ALLOC) == 0 || s.size() == 0 {
                continue;
            }
            let name = s.name().unwrap_or("?");
            // Unwind tables: nothing unwinds through generated code (it calls no
            // Rust and never panics), so they are not loaded.
            if name == ".eh_frame" {
                continue;
            }
            if sh_flags & u64::from(elf::SHF_WRITE) != 0 || sh_flags & u64::from(elf::SHF_TLS) != 0 {
                return Err(ImageError::Format(format!("section {name} is writable or thread-local")));
            }
            match s.kind() {
                SectionKind::Text
                | SectionKind::ReadOnlyData
                | SectionKind::ReadOnlyString
                | SectionKind::ReadOnlyDataWithRel => {}
                k => return Err(ImageError::Format(format!("section {name} of kind {k:?}"))),
            }
            let align = usize::try_from(s.align().max(1)).map_err(format)?;
            if !align.is_power_of_two() || align > 4096 {
                return Err(ImageError::Format(format!("section {name} aligned to {align}")));
            }
            size = size.next_multiple_of(align);
            base.insert(s.index(), size);
            size =
                size.checked_add(usize::try_from(s.size()).map_err(format)?).ok_or_else(|| format("size"))?;
            if size > MAX_IMAGE {
                return Err(ImageError::Format(format!("sections of more than {MAX_IMAGE} bytes")));
            }
        }

        // 2. Resolve symbols; far ones get a GOT slot and a call stub after the sections.
        let mut resolved: HashMap<SymbolIndex, Resolved> = HashMap::new();
        let mut functions = HashMap::new();
        for sym in file.symbols() {
            let r = match sym.section() {
                SymbolSection::Section(i) => {
                    let Some(&b) = base.get(&i) else { continue };
                    let within = file.section_by_index(i).map(|s| s.size()).map_err(format)?;
                    if sym.address() > within {
                        return Err(format("a symbol past the end of its section"));
                    }
                    let at = b + usize::try_from(sym.address()).map_err(format)?;
                    if sym.kind() == object::SymbolKind::Text && sym.is_definition() {
                        functions.insert(sym.name().map_err(format)?.to_string(), (at, sym.size()));
                    }
                    Resolved::Local(at)
                }
                SymbolSection::Undefined => {
                    let name = sym.name().map_err(format)?;
                    Resolved::Far(c_function(name).ok_or_else(|| ImageError::Undefined(name.to_string()))?)
                }
                SymbolSection::Absolute => Resolved::Far(usize::try_from(sym.address()).map_err(format)?),
                _ => continue,
            };
            resolved.insert(sym.index(), r);
        }
        // A GOT slot (8 bytes) and a stub (`jmp *slot(%rip)`, 6 bytes, padded to 8) per far symbol.
        let far: Vec<(SymbolIndex, usize)> = {
            let mut v: Vec<_> =
                resolved.iter().filter_map(|(&i, r)| matches!(r, Resolved::Far(_)).then_some(i)).collect();
            v.sort_by_key(|i| i.0);
            v.into_iter().enumerate().map(|(k, i)| (i, k)).collect()
        };
        let far_slot: HashMap<SymbolIndex, usize> = far.iter().copied().collect();
        let got = size.next_multiple_of(8);
        let stubs = got + 8 * far.len();
        // GOT slots for local symbols that GOT-relative relocations name, allocated as met.
        let mut local_got: HashMap<SymbolIndex, usize> = HashMap::new();
        let mut local_slots = 0usize;
        for s in file.sections() {
            if !base.contains_key(&s.index()) {
                continue;
            }
            for (_, r) in s.relocations() {
                if let (RelocationFlags::Elf { r_type }, RelocationTarget::Symbol(i)) =
                    (r.flags(), r.target())
                {
                    let got_rel = matches!(
                        r_type,
                        elf::R_X86_64_GOTPCREL | elf::R_X86_64_GOTPCRELX | elf::R_X86_64_REX_GOTPCRELX
                    );
                    if got_rel && !far_slot.contains_key(&i) && !local_got.contains_key(&i) {
                        local_got.insert(i, local_slots);
                        local_slots += 1;
                    }
                }
            }
        }
        let local_got_at = stubs + 8 * far.len();
        let total = (local_got_at + 8 * local_slots).max(1);

        // 3. Copy the sections into a fresh mapping and write the GOT and stubs.
        let mut map = memmap2::MmapMut::map_anon(total)?;
        for s in file.sections() {
            let Some(&b) = base.get(&s.index()) else { continue };
            let data = s.data().map_err(format)?;
            if data.len() as u64 > s.size() {
                return Err(format("a section with more data than its size"));
            }
            map[b..b + data.len()].copy_from_slice(data);
        }
        let origin = map.as_ptr() as usize;
        let addr = |r: Resolved| match r {
            Resolved::Local(off) => origin + off,
            Resolved::Far(a) => a,
        };
        for &(i, k) in &far {
            map[got + 8 * k..got + 8 * k + 8].copy_from_slice(&(addr(resolved[&i]) as u64).to_le_bytes());
            // jmp *disp32(%rip), disp32 from the end of the 6-byte instruction to the slot.
            let at = stubs + 8 * k;
            let disp = (got + 8 * k) as i64 - (at + 6) as i64;
            map[at..at + 2].copy_from_slice(&[0xff, 0x25]);
            map[at + 2..at + 6].copy_from_slice(&(disp as i32).to_le_bytes());
            map[at + 6..at + 8].copy_from_slice(&[0xcc, 0xcc]);
        }
        for (&i, &k) in &local_got {
            let target = match resolved.get(&i) {
                Some(&r) => addr(r) as u64,
                None => return Err(format("a GOT entry for an unresolved symbol")),
            };
            let at = local_got_at + 8 * k;
            map[at..at + 8].copy_from_slice(&target.to_le_bytes());
        }

        // 4. Relocate.
        for s in file.sections() {
            let Some(&b) = base.get(&s.index()) else { continue };
            let section = s.name().unwrap_or("?").to_string();
            let len = usize::try_from(s.size()).map_err(format)?;
            for (offset, r) in s.relocations() {
                let RelocationFlags::Elf { r_type } = r.flags() else { return Err(format("not ELF")) };
                if r.has_implicit_addend() {
                    return Err(ImageError::Relocation { r_type, section, offset });
                }
                let (sym, s_addr) = match r.target() {
                    RelocationTarget::Symbol(i) => {
                        let res = *resolved.get(&i).ok_or_else(|| {
                            let name = file.symbol_by_index(i).and_then(|s| s.name().map(str::to_string));
                            ImageError::Undefined(name.unwrap_or_else(|_| format!("symbol {}", i.0)))
                        })?;
                        (Some(i), addr(res) as i64)
                    }
                    RelocationTarget::Section(i) => {
                        let &sb =
                            base.get(&i).ok_or_else(|| format("a relocation against an unloaded section"))?;
                        (None, (origin + sb) as i64)
                    }
                    _ => return Err(ImageError::Relocation { r_type, section, offset }),
                };
                let off = usize::try_from(offset).map_err(format)?;
                let width = match r_type {
                    elf::R_X86_64_64 | elf::R_X86_64_PC64 => 8,
                    _ => 4,
                };
                if off.checked_add(width).is_none_or(|end| end > len) {
                    return Err(ImageError::Format(format!(
                        "relocation at {section}+{offset:#x} past the section"
                    )));
                }
                let p = (origin + b + off) as i64;
                let a = r.addend();
                let pc32 = |v: i64| -> Result<[u8; 4], ImageError> {
                    i32::try_from(v)
                        .map(i32::to_le_bytes)
                        .map_err(|_| ImageError::OutOfRange { section: section.clone(), offset })
                };
                let at = b + off;
                // 64-bit fields wrap (the ELF formulas are modulo 2⁶⁴); a 32-bit
                // displacement that does not fit is an error.
                match r_type {
                    elf::R_X86_64_64 => {
                        map[at..at + 8].copy_from_slice(&s_addr.wrapping_add(a).to_le_bytes())
                    }
                    elf::R_X86_64_PC64 => {
                        map[at..at + 8].copy_from_slice(&s_addr.wrapping_add(a).wrapping_sub(p).to_le_bytes())
                    }
                    elf::R_X86_64_PC32 | elf::R_X86_64_PLT32 => {
                        // A far symbol is called through its stub.
                        let target = match sym.and_then(|i| far_slot.get(&i)) {
                            Some(&k) if r_type == elf::R_X86_64_PLT32 => (origin + stubs + 8 * k) as i64,
                            _ => s_addr,
                        };
                        map[at..at + 4].copy_from_slice(&pc32(target.wrapping_add(a).wrapping_sub(p))?);
                    }
                    elf::R_X86_64_GOTPCREL | elf::R_X86_64_GOTPCRELX | elf::R_X86_64_REX_GOTPCRELX => {
                        let i =
                            sym.ok_or(ImageError::Relocation { r_type, section: section.clone(), offset })?;
                        let slot = match (far_slot.get(&i), local_got.get(&i)) {
                            (Some(&k), _) => got + 8 * k,
                            (None, Some(&k)) => local_got_at + 8 * k,
                            (None, None) => return Err(format("a GOT relocation without a slot")),
                        };
                        map[at..at + 4].copy_from_slice(&pc32(
                            ((origin + slot) as i64).wrapping_add(a).wrapping_sub(p),
                        )?);
                    }
                    _ => return Err(ImageError::Relocation { r_type, section, offset }),
                }
            }
        }
        let map = map.make_exec()?;
        Ok(CodeImage { map, object: object.to_vec(), functions })
    }

    /// The address of the function `name` defined in the object.
    pub fn function(&self, name: &str) -> Option<usize> {
        self.functions.get(name).map(|&(off, _)| self.map.as_ptr() as usize + off)
    }

    /// The function `name` as an entry of the executable ABI.
    ///
    /// # Safety
    /// `name` was generated with `F`'s signature and the C calling convention
    /// (the code generator's naming, or an artifact's metadata whose hash
    /// matched), and the result is called only while this image lives.
    pub unsafe fn entry<F: EntryFn>(&self, name: &str) -> Result<F, ImageError> {
        let addr =
            self.function(name).ok_or_else(|| ImageError::Missing { kind: F::KIND, name: name.into() })?;
        // SAFETY: the caller's contract; `addr` is the function's entry in this image.
        Ok(unsafe { F::from_address(addr) })
    }

    /// Every defined function: name, address and size in bytes.
    pub fn functions(&self) -> impl Iterator<Item = (&str, usize, u64)> + '_ {
        let origin = self.map.as_ptr() as usize;
        self.functions.iter().map(move |(n, &(off, size))| (n.as_str(), origin + off, size))
    }

    /// The relocatable object this image was loaded from.
    pub fn object(&self) -> &[u8] {
        &self.object
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_what_is_not_an_object() {
        assert!(matches!(CodeImage::load(b"not an object"), Err(ImageError::Format(_))));
        assert!(matches!(CodeImage::load(&[]), Err(ImageError::Format(_))));
        // An ELF header cut short.
        let mut h = vec![0x7f, b'E', b'L', b'F', 2, 1, 1, 0];
        h.resize(20, 0);
        assert!(matches!(CodeImage::load(&h), Err(ImageError::Format(_))));
    }
}
