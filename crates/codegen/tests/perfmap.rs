//! `ANYSHAPE_PERF_MAP`: every compiled function is named in perf's map for this
//! process (`/tmp/perf-<pid>.map`), at the address the JIT gave it, with its size.
//! Alone in its test binary: the variable is set for the whole process.

use anyshape_codegen::{compile_microkernel, compile_packers};
use kernels::{ElemType, Target};

/// `(start, size)` of `name`'s line in the map.
fn entry(map: &str, name: &str) -> Option<(usize, usize)> {
    map.lines().find_map(|l| {
        let mut f = l.splitn(3, ' ');
        let (start, size, n) = (f.next()?, f.next()?, f.next()?);
        (n == name)
            .then(|| Some((usize::from_str_radix(start, 16).ok()?, usize::from_str_radix(size, 16).ok()?)))?
    })
}

#[test]
fn compiled_functions_are_named_in_the_perf_map() {
    let t = Target::detect();
    if !kernels::testing::require("ANYSHAPE_REQUIRE_AVX2", t.supported(), "AVX2 + FMA") {
        return;
    }
    std::env::set_var("ANYSHAPE_PERF_MAP", "1");
    let path = format!("/tmp/perf-{}.map", std::process::id());
    let _ = std::fs::remove_file(&path);
    let nr = 2 * t.f32_lanes;
    let uk = compile_microkernel(&t, 4, nr).unwrap();
    let packers = compile_packers(&t, ElemType::F32, &[4, nr], &[]).unwrap();
    let map = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);

    let (start, size) = entry(&map, &format!("anyshape::ukernel_f32_4x{nr}")).expect("the kernel's line");
    assert_eq!(start, uk.kernel().func as usize, "the map's address is the kernel's entry");
    // Four rows of two vectors: at least the FMAs of one K step, and far from a page.
    assert!((64..16384).contains(&size), "kernel size {size}");
    for p in packers.packers() {
        let (start, size) =
            entry(&map, &format!("anyshape::pack_f32_w{}", p.width)).expect("a packer's line");
        assert_eq!(start, p.func as usize);
        assert!((16..65536).contains(&size), "packer size {size}");
    }
    // Functions do not overlap.
    let mut spans: Vec<(usize, usize)> = map
        .lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            Some((usize::from_str_radix(f.next()?, 16).ok()?, usize::from_str_radix(f.next()?, 16).ok()?))
        })
        .collect();
    spans.sort_unstable();
    assert!(spans.len() >= 3);
    assert!(spans.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0), "{spans:x?}");
}
