//! For tests that need something this machine may lack (an instruction set, a
//! tool): they run, or say why they skip; and where the environment says the
//! machine has it (`scripts/test.sh` sets `ANYSHAPE_REQUIRE_AVX2`,
//! `ANYSHAPE_REQUIRE_BF16`, `ANYSHAPE_REQUIRE_VNNI`, `ANYSHAPE_REQUIRE_AMX`, `ANYSHAPE_REQUIRE_F16C` from the CPU's flags and
//! `ANYSHAPE_REQUIRE_PTXAS` once it installed ptxas), a skip is a failure: a
//! test cannot pass without checking anything on a machine that could run it.

/// Whether a test needing `what` may run: `available`, or else a printed skip,
/// or a panic when the environment variable `require` is set.
pub fn require(require: &str, available: bool, what: &str) -> bool {
    if available {
        return true;
    }
    if std::env::var_os(require).is_some() {
        panic!("{require} is set, but this test finds no {what}");
    }
    eprintln!("skipped: this machine has no {what} (set {require} to make that a failure)");
    false
}

/// AVX2 and FMA, the generated CPU code's baseline.
pub fn avx2() -> bool {
    require("ANYSHAPE_REQUIRE_AVX2", crate::Target::detect().supported(), "AVX2 + FMA")
}

/// AVX-512 BF16, for the bf16 contraction family.
pub fn bf16() -> bool {
    require(
        "ANYSHAPE_REQUIRE_BF16",
        crate::Target::detect().check_elem(crate::ElemType::Bf16).is_ok(),
        "AVX-512 BF16",
    )
}

/// VNNI (`vpdpbusd`), for the u8s8 contraction family.
pub fn vnni() -> bool {
    require(
        "ANYSHAPE_REQUIRE_VNNI",
        crate::Target::detect().check_elem(crate::ElemType::U8S8).is_ok(),
        "VNNI (AVX512-VNNI or AVX-VNNI)",
    )
}

/// AMX-INT8 and AMX-BF16 with the OS's leave to use the tiles, for the u8s8
/// and bf16 families' AMX kernels.
pub fn amx() -> bool {
    let isa = crate::Target::detect().isa;
    require("ANYSHAPE_REQUIRE_AMX", isa.amx_int8 && isa.amx_bf16, "AMX-INT8 and AMX-BF16 (usable tiles)")
}
