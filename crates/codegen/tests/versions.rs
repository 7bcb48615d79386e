//! Multi-versioned loop programs (BladeDISC §5.2.1): a broadcast along the
//! vectorized axis whose dim may be 1 at run time is not read with per-lane
//! gathers: the program is compiled in two versions, a contiguous vector load
//! where the dim is not 1 and a scalar load splat where it is.

use anyshape_codegen::compile_programs;
use kernels::Target;

const MAYBE_BROADCAST: &str = r#"graph {
  sym n param 1..
  sym m param 1..
  sym j param 1..
  assert j broadcasts to m
  input %x: f32[n, m]
  input %z: f32[n, j]
  %zb: f32[n, m] = broadcast %z
  %b: f32[n, m] = mul %x, %zb
  output %b
}
"#;

fn compiled(text: &str) -> (String, Vec<plan::LoopProgram>) {
    let g = ir::parse_graph(text, &|_| None).expect("parses");
    let plan = lower::lower(&g, &passes::fuse(&g)).expect("lowers");
    let code = compile_programs(&Target::detect(), &plan.programs, "t", 1).expect("compiles");
    (code.asm(), plan.programs)
}

#[test]
fn a_broadcast_that_may_be_one_is_versioned_not_gathered() {
    let (asm, programs) = compiled(MAYBE_BROADCAST);
    assert_eq!(programs.len(), 1);
    assert_eq!(programs[0].schedules.guards.len(), 1, "one guard: j == 1");
    assert!(!asm.contains("gather"), "a version gathers:\n{asm}");
    // Without the declaration's freedom (j is m), the same program has no guard.
    let fixed = MAYBE_BROADCAST
        .replace("input %z: f32[n, j]", "input %z: f32[n, m]")
        .replace("  assert j broadcasts to m\n", "");
    let (_, programs) = compiled(&fixed);
    assert!(programs[0].schedules.guards.is_empty());
}
