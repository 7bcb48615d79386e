//! Plain-Rust micro-kernels of the generated kernels' ABI, for driver tests
//! that run without LLVM.

/// `C (+)= A·B` for packed `MR × NR` panels; odd tile sizes are on purpose.
#[macro_export]
macro_rules! rust_kernel {
    ($name:ident, $mr:expr, $nr:expr) => {
        unsafe extern "C" fn $name(
            kc: i64,
            a: *const f32,
            b: *const f32,
            c: *mut f32,
            ldc: i64,
            flags: i64,
            _bias: *const f32,
            _res: *const f32,
            _ldr: i64,
        ) {
            const MR: usize = $mr;
            const NR: usize = $nr;
            let acc = flags & anyshape_kernels::ACCUMULATE;
            let (a, b) = (
                std::slice::from_raw_parts(a, kc as usize * MR),
                std::slice::from_raw_parts(b, kc as usize * NR),
            );
            for i in 0..MR {
                for j in 0..NR {
                    let s: f32 = (0..kc as usize).map(|k| a[k * MR + i] * b[k * NR + j]).sum();
                    let p = c.add(i * ldc as usize + j);
                    *p = if acc != 0 { *p + s } else { s };
                }
            }
        }
    };
}

/// `C (+)= A·B` of the direct ABI: A and B read in place, columns masked past
/// `ncols`; no epilogue.
#[macro_export]
macro_rules! rust_direct_kernel {
    ($name:ident, $mr:expr, $nr:expr) => {
        unsafe extern "C" fn $name(
            kc: i64,
            a: *const f32,
            lda: i64,
            b: *const f32,
            ldb: i64,
            c: *mut f32,
            ldc: i64,
            ncols: i64,
            flags: i64,
            _bias: *const f32,
            _res: *const f32,
            _ldr: i64,
        ) {
            const MR: usize = $mr;
            const NR: usize = $nr;
            let acc = flags & anyshape_kernels::ACCUMULATE;
            let (kc, lda, ldb, ldc) = (kc as usize, lda as usize, ldb as usize, ldc as usize);
            for i in 0..MR {
                for j in 0..NR.min(ncols as usize) {
                    let s: f32 = (0..kc).map(|k| *a.add(i * lda + k) * *b.add(k * ldb + j)).sum();
                    let p = c.add(i * ldc + j);
                    *p = if acc != 0 { *p + s } else { s };
                }
            }
        }
    };
}
