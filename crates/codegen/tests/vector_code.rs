//! The instructions the vector math and the max reduction compile to, per ISA:
//! `exp` scales by `2^n` with one `vscalefps` where AVX-512 has it (and in two
//! integer-built steps on AVX2, where it does not), and a Softmax's row maximum
//! needs no per-lane sign test of zeros (`llvm.maximum`'s `vpmovd2m` and blends).
//! The values themselves are checked against the interpreter in
//! `anyshape/tests/vector_math.rs` and `programs.rs`.

use anyshape_codegen::compile_programs;
use kernels::Target;

const SOFTMAX: &str = r#"graph {
  sym n param 1..
  sym m param 1..
  input %x: f32[n, m]
  %mx: f32[n, 1] = reduce_max[axes=[1], keep_dims=true] %x
  %mxb: f32[n, m] = broadcast %mx
  %sh: f32[n, m] = sub %x, %mxb
  %ex: f32[n, m] = exp %sh
  %sm: f32[n, 1] = reduce_sum[axes=[1], keep_dims=true] %ex
  %smb: f32[n, m] = broadcast %sm
  %y: f32[n, m] = div %ex, %smb
  output %y
}
"#;

fn asm(t: &Target) -> String {
    let g = ir::parse_graph(SOFTMAX, &|_| None).expect("parses");
    let plan = lower::lower(&g, &passes::fuse(&g)).expect("lowers");
    compile_programs(t, &plan.programs, "t", 1).expect("compiles").asm()
}

#[test]
fn exp_scales_with_vscalefps_where_avx512_has_it() {
    let host = Target::detect();
    if !host.supported() {
        return;
    }
    if host.isa.avx512f {
        let code = asm(&host);
        assert!(code.contains("vscalefps"), "AVX-512 exp without vscalefps:\n{code}");
        assert!(!code.contains("vpmovd2m"), "a row maximum orders zeros by sign:\n{code}");
    }
    if let Some(t) = host.avx2_only() {
        let code = asm(&t);
        assert!(!code.contains("vscalefps") && !code.contains("zmm"), "AVX2 code uses AVX-512:\n{code}");
        assert!(code.contains("vpslld"), "AVX2 exp builds 2^n from its bits:\n{code}");
        assert!(!code.contains("call"), "exp calls out:\n{code}");
    }
}

/// A row's tail of a few lanes or more runs as one vector whose lanes past the
/// row are masked off (a masked store: AVX-512's `{%k}`, AVX2's `vmaskmovps`),
/// not a point at a time; and a maximum taken per lane (a column's, as a
/// window's over its taps) steps with `maxps`, its NaN rule off the chain.
#[test]
fn a_rows_tail_is_a_masked_vector_and_maxima_step_with_maxps() {
    let host = Target::detect();
    if !host.supported() {
        return;
    }
    let text = r#"graph {
  sym n param 1..
  sym m param 1..
  input %x: f32[n, m]
  %r: f32[n, m] = sqrt %x
  %c: f32[m] = reduce_max[axes=[0], keep_dims=false] %x
  output %r, %c
}
"#;
    let g = ir::parse_graph(text, &|_| None).expect("parses");
    let plan = lower::lower(&g, &passes::fuse(&g)).expect("lowers");
    let code = |t: &Target| compile_programs(t, &plan.programs, "t", 1).expect("compiles").asm();
    if host.isa.avx512f {
        let c = code(&host);
        assert!(c.contains("vmovups\t%zmm") && c.contains("{%k"), "no masked store:\n{c}");
        assert!(c.contains("vmaxps\t%zmm"), "no maxps:\n{c}");
    }
    if let Some(t) = host.avx2_only() {
        let c = code(&t);
        assert!(c.contains("vmaskmovps"), "no masked store:\n{c}");
        assert!(c.contains("vmaxps\t%ymm"), "no maxps:\n{c}");
    }
}
