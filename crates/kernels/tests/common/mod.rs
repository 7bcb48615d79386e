//! Plain-Rust micro-kernels of the generated kernels' ABI, for driver tests
//! that run without LLVM.

/// `C (+)= A·B` for packed `MR × NR` panels of f32 words, or (with `bf16`) of
/// bf16 pair words; odd tile sizes are on purpose.
#[macro_export]
macro_rules! rust_kernel {
    ($name:ident, $mr:expr, $nr:expr) => {
        $crate::rust_kernel!($name, $mr, $nr, 1, |w: u32| [f32::from_bits(w), 0.0]);
    };
    ($name:ident, $mr:expr, $nr:expr, bf16) => {
        $crate::rust_kernel!($name, $mr, $nr, 2, |w: u32| [
            f32::from_bits(w << 16),
            f32::from_bits(w & 0xffff_0000)
        ]);
    };
    ($name:ident, $mr:expr, $nr:expr, $g:expr, $unpack:expr) => {
        unsafe extern "C" fn $name(
            kc: i64,
            a: *const u32,
            b: *const u32,
            c: *mut f32,
            ldc: i64,
            flags: i64,
            _bias: *const f32,
            _res: *const f32,
            _ldr: i64,
            tiles: i64,
            _next_b: *const u32,
            _column_scale: *const f32,
            _params: *const f32,
        ) {
            const MR: usize = $mr;
            const NR: usize = $nr;
            let kw = (kc as usize).div_ceil($g);
            let acc = flags & anyshape_kernels::ACCUMULATE;
            let tiles = (tiles as usize).max(1);
            let (a, b) =
                (std::slice::from_raw_parts(a, kw * MR * tiles), std::slice::from_raw_parts(b, kw * NR));
            for t in 0..tiles {
                let a = &a[t * kw * MR..];
                for i in 0..MR {
                    for j in 0..NR {
                        let mut s = 0.0f32;
                        for k in 0..kw {
                            let (x, y) = ($unpack(a[k * MR + i]), $unpack(b[k * NR + j]));
                            s += x[0] * y[0] + x[1] * y[1];
                        }
                        let p = c.add((t * MR + i) * ldc as usize + j);
                        *p = if acc != 0 { *p + s } else { s };
                    }
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
            runs: i64,
            a_run: i64,
            b_run: i64,
            _next: *const f32,
            _lines: i64,
            _column_scale: *const f32,
            _params: *const f32,
        ) {
            const MR: usize = $mr;
            const NR: usize = $nr;
            let acc = flags & anyshape_kernels::ACCUMULATE;
            let (kc, lda, ldb, ldc) = (kc as usize, lda as usize, ldb as usize, ldc as usize);
            for i in 0..MR {
                for j in 0..NR.min(ncols as usize) {
                    let s: f32 = (0..runs as isize)
                        .flat_map(|r| (0..kc).map(move |k| (r, k)))
                        .map(|(r, k)| {
                            let (a, b) = (a.offset(r * a_run as isize), b.offset(r * b_run as isize));
                            *a.add(i * lda + k) * *b.add(k * ldb + j)
                        })
                        .sum();
                    let p = c.add(i * ldc + j);
                    *p = if acc != 0 { *p + s } else { s };
                }
            }
        }
    };
}

rust_kernel!(k1x4, 1, 4);
rust_kernel!(k2x4, 2, 4);
rust_kernel!(k5x4, 5, 4);
rust_kernel!(k1x8, 1, 8);
rust_kernel!(k3x8, 3, 8);
rust_direct_kernel!(d1x4, 1, 4);
rust_direct_kernel!(d3x4, 3, 4);
rust_direct_kernel!(d1x8, 1, 8);
rust_direct_kernel!(d2x8, 2, 8);
rust_direct_kernel!(d4x8, 4, 8);

/// An `mr × nr` f32 kernel `func` of the made-up rate `gflops`.
#[allow(dead_code)]
pub fn variant(
    mr: usize,
    nr: usize,
    func: anyshape_kernels::MicroKernelFn,
    gflops: f64,
) -> anyshape_kernels::KernelVariant {
    use anyshape_kernels::{KernelVariant, MicroKernel};
    KernelVariant {
        kernel: MicroKernel {
            mr,
            nr,
            elem: Default::default(),
            func,
            epilogue: Default::default(),
            packers: Default::default(),
            amx: false,
        },
        gflops,
    }
}

/// Two widths, packed and direct, odd heights; the rates are made up (only the
/// ranking uses them).
#[allow(dead_code)]
pub fn test_family() -> anyshape_kernels::KernelFamily {
    use anyshape_kernels::{DirectKernel, DirectVariant, KernelFamily};
    let v = variant;
    let d = |mr, nr, func, gflops| DirectVariant {
        kernel: DirectKernel {
            mr,
            nr,
            elem: anyshape_kernels::ElemType::F32,
            func,
            epilogue: Default::default(),
            packers: Default::default(),
        },
        gflops,
    };
    KernelFamily::new(vec![
        v(1, 4, k1x4 as anyshape_kernels::MicroKernelFn, 10.0),
        v(2, 4, k2x4, 20.0),
        v(5, 4, k5x4, 40.0),
        v(1, 8, k1x8, 15.0),
        v(3, 8, k3x8, 45.0),
    ])
    .and_then(|f| {
        f.with_direct(vec![
            d(1, 4, d1x4 as anyshape_kernels::DirectKernelFn, 9.0),
            d(3, 4, d3x4, 30.0),
            d(1, 8, d1x8, 14.0),
            d(2, 8, d2x8, 25.0),
            d(4, 8, d4x8, 44.0),
        ])
    })
    .expect("family")
}

/// A small target, so that the blocks split even tiny shapes.
#[allow(dead_code)]
pub fn small_target() -> anyshape_kernels::Target {
    anyshape_kernels::Target { l1d: 2 << 10, l2: 8 << 10, l3: 64 << 10, ..anyshape_kernels::Target::detect() }
}

/// A machine model of [`small_target`] with fixed figures (not measured), so that
/// choices made with it are the same on every machine and in every phase of a
/// shared one.
#[allow(dead_code)]
pub fn fixed_machine(threads: usize) -> anyshape_kernels::MachineModel {
    let target = small_target();
    anyshape_kernels::MachineModel {
        threads,
        l1d: target.l1d,
        l2: target.l2,
        l3: target.l3,
        dram_bw: 20e9,
        l3_bw: 30e9,
        l2_bw: 60e9,
        pack_a_bw: 12e9,
        pack_b_bw: 10e9,
        pack_bt_bw: 8e9,
        fork_join: 1.5e-6,
        peak_gflops: 0.0,
    }
}

/// A dispatcher over [`test_family`] on [`small_target`] with [`fixed_machine`].
#[allow(dead_code)]
pub fn fixed_dispatcher(threads: usize) -> anyshape_kernels::Dispatcher {
    anyshape_kernels::Dispatcher::new(
        small_target(),
        test_family(),
        fixed_machine(threads),
        anyshape_kernels::CostModel::Hierarchical,
    )
}
