//! The executable ABI: the C signature of every generated function the
//! runtime calls, whatever built it (the JIT, or an artifact's objects), and
//! the one place where an address becomes such a function ([`EntryFn`]).

/// The calling convention of a generated loop program: `bufs[i]` is parameter
/// `i`'s data, `dims` the model's dim table evaluated for the call, and the
/// program runs rows `begin..end` of its nest (a row: one value of all loop
/// variables but the innermost). Buffers are addressed with wrapping
/// arithmetic from their pointers (no in-bounds assumption), so a caller that
/// runs a few rows may pass a tile holding only those rows, its pointer shifted
/// back by the rows before them (fused attention does). Returns 0, or the first error code a `Check`
/// recorded (its message is the program's `checks[code - 1]`).
pub type LoopFn = unsafe extern "C" fn(bufs: *const *mut u8, dims: *const i64, begin: i64, end: i64) -> i64;

/// The partial entry of a program with a [`SplitReduction`]: for point `point`
/// of its nest, its reduction over `lo..hi` of the split variable only, stored
/// at `out` (its dtype, in an 8-byte slot). Returns 0 or an error code.
pub type PartFn = unsafe extern "C" fn(
    bufs: *const *mut u8,
    dims: *const i64,
    point: i64,
    lo: i64,
    hi: i64,
    out: *mut u64,
) -> i64;

/// The finishing entry of a program with a [`SplitReduction`]: the stores of
/// point `point`, the reduction being the combination of the `n` partials at
/// `parts` ([`PartFn`]'s slots). Returns 0 or an error code.
pub type FinishFn = unsafe extern "C" fn(
    bufs: *const *mut u8,
    dims: *const i64,
    point: i64,
    parts: *const u64,
    n: i64,
) -> i64;

/// The micro-kernel ABI: `C[0..MR, 0..NR] (+)= Ã · B̃` over `kc` depths, where `a`
/// is a packed panel of words (`a[w·MR + i]`, each word `k_group` depths of row `i`
/// in the kernel's element type), `b` a packed panel (`b[w·NR + j]`), `c` a row-major f32 tile with
/// row stride `ldc`. `flags`: bit 0 adds to C instead of overwriting it, bit 1
/// applies the kernel's [`crate::Epilogue`] to the tile before storing it (the last K
/// block), reading `bias[0..NR]` and the residual tile `res` (row stride `ldr`)
/// when the epilogue has them; otherwise those pointers are not read.
///
/// One call covers `tiles` (at least 1) tiles stacked down C: tile `t` reads the
/// A panel `words(kc)·MR·t` words on, and writes C (and reads the residual) `MR·t`
/// rows down; the row loop runs in the kernel, not in the driver. `next_b`, when
/// not null, is the B panel the next call will read (`words(kc)·NR` words): the
/// kernel asks for its cache lines in L2, a share per tile, spread over the
/// tile's K loop at the rate it reads B (a burst at the tile's start stalls on
/// the miss buffers), so that the next call's first tile does not wait on L3 or
/// DRAM (a hint: it is never read). `column_scale`: `NR` values, read by an
/// epilogue with column scales (like the bias; otherwise not read). `params`:
/// the values of the epilogue program's parameters (read only by a program
/// that has some).
pub type MicroKernelFn = unsafe extern "C" fn(
    kc: i64,
    a: *const u32,
    b: *const u32,
    c: *mut f32,
    ldc: i64,
    flags: i64,
    bias: *const f32,
    res: *const f32,
    ldr: i64,
    tiles: i64,
    next_b: *const u32,
    column_scale: *const f32,
    params: *const f32,
);

/// The direct micro-kernel ABI: `C[0..MR, 0..ncols] (+)= A · B` where A's element
/// `(i, k)` is `a[i·lda + k]` and B's `(k, j)` is `b[k·ldb + j]`; C is row-major
/// with row stride `ldc`. Lanes at or past `ncols` (`1 ≤ ncols`) are neither read
/// nor written: B's loads, C's loads and stores, the column scales, the bias and
/// the residual are masked. `flags`, `bias`, `res`, `ldr`, `column_scale` and
/// `params` are as in [`MicroKernelFn`].
///
/// K is `runs ≥ 1` runs of `kc` steps, summed in registers: run `r` reads A at
/// `a + r·a_run` and B at `b + r·b_run` (elements), the layout above from there. A
/// convolution's kernel rows are its runs (each row's taps contiguous in the image,
/// the rows an image row apart), so a tile's C is written once, not once a row.
///
/// `next` and `lines`: cache lines (16 floats each) from `next` on that the
/// kernel asks into L2, spread over its K loop at the rate it reads B (a
/// weight's next panel while this one computes); none when `lines` is 0. Only
/// asked for, never read: any address will do.
///
/// A u8s8 kernel's elements of A and B are 4-byte words (four depths' 8-bit
/// codes of a row of A; four signed bytes of a column of a packed weight),
/// `kc`, `lda`, `ldb`, `a_run` and `b_run` counting words; where its epilogue
/// stores codes, C holds a byte an element (`ldc` in bytes).
pub type DirectKernelFn = unsafe extern "C" fn(
    kc: i64,
    a: *const f32,
    lda: i64,
    b: *const f32,
    ldb: i64,
    c: *mut f32,
    ldc: i64,
    ncols: i64,
    flags: i64,
    bias: *const f32,
    res: *const f32,
    ldr: i64,
    runs: i64,
    a_run: i64,
    b_run: i64,
    next: *const f32,
    lines: i64,
    column_scale: *const f32,
    params: *const f32,
);

/// The generated packing ABI: interleave `rows ≤ width` rows of an f32 source
/// whose row `i` starts at `src + i·ld` and runs `kc` elements along K into
/// `dst[g·width + i]`, the word of depths `g·k_group ..` of row `i`
/// (`words(kc) · width` words in all), zero for the rows at or past `rows`.
/// Nothing past a source row's `kc` elements is read.
pub type PackFn = unsafe extern "C" fn(src: *const f32, ld: i64, rows: i64, kc: i64, dst: *mut u32);

/// The generated packing ABI over rows given by address: interleave `kc`
/// elements from each of `width` rows, row `i` starting at `rows[i]` (null:
/// a row of zeros), into `dst` as [`PackFn`] does.
pub type RowsPackFn = unsafe extern "C" fn(rows: *const *const f32, kc: i64, dst: *mut u32);

/// The generated dequantizing ABI (a weight-only quantized weight's panel,
/// one group of rows at a time): `rows` rows of `width` unsigned codes from
/// `codes` (8 bits: a byte each; 4 bits: byte `p` of a row holds column `p`
/// in its low half and column `p + width/2` in its high half), each column
/// `j`'s value `code · scale[j] + offset[j]`, into `out` (`rows × width`
/// f32, row after row).
pub type DequantFn =
    unsafe extern "C" fn(codes: *const u8, scale: *const f32, offset: *const f32, rows: i64, out: *mut f32);

/// The generated ABI that multiplies one row of A by codes (a weight-only
/// quantized weight's panel, one group of rows at a time, codes laid out as
/// [`DequantFn`] reads them): `acc[j] += Σ_r a[r] · code[r][j]` over `rows`
/// rows, `j < width`, the codes as unsigned integers; the group's scales and
/// offsets are the caller's to apply.
pub type CodeDotFn = unsafe extern "C" fn(codes: *const u8, a: *const f32, rows: i64, acc: *mut f32);

/// A generated function's type: one signature of this ABI. Every function
/// pointer the runtime calls is made from an address by
/// [`EntryFn::from_address`], for the JIT and the artifact loader alike.
pub trait EntryFn: Copy + private::Sealed {
    /// What the entry is, for errors.
    const KIND: &'static str;

    /// The function at `addr`.
    ///
    /// # Safety
    /// `addr` is the entry of a function generated with exactly this signature
    /// and the C calling convention, and the result is called only while the
    /// code that holds it stays mapped.
    unsafe fn from_address(addr: usize) -> Self;
}

mod private {
    pub trait Sealed {}
}

macro_rules! entry_fns {
    ($($t:ty => $kind:literal),* $(,)?) => {$(
        impl private::Sealed for $t {}
        impl EntryFn for $t {
            const KIND: &'static str = $kind;
            unsafe fn from_address(addr: usize) -> Self {
                // SAFETY: the caller's contract: `addr` is a function of this type.
                unsafe { std::mem::transmute::<usize, $t>(addr) }
            }
        }
    )*};
}

entry_fns!(
    LoopFn => "loop program",
    PartFn => "split reduction's partial entry",
    FinishFn => "split reduction's finishing entry",
    MicroKernelFn => "micro-kernel",
    DirectKernelFn => "direct kernel",
    PackFn => "packer",
    RowsPackFn => "rows packer",
    DequantFn => "dequantizer",
    CodeDotFn => "code dot",
);
