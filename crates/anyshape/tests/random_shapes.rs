//! The bundled text models at random shapes drawn from the symbols' ranges
//! (including 1, primes and the range's last value): the interpreter checks every
//! value's shape against its symbolic type, and a batch's rows are independent —
//! row `b` of a batch run equals running row `b` alone.

use std::path::PathBuf;

use anyshape::{Elems, LoadOptions, Model, Tensor};
use proptest::prelude::*;

fn load(name: &str) -> Model {
    let p =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(name).join("model.onnx");
    Model::load(p, &LoadOptions::new()).expect("fixture loads")
}

fn ids(batch: usize, seq: usize, seed: u64) -> Vec<i64> {
    (0..batch * seq).map(|i| ((i as u64 * 2654435761 + seed) % 97 + 1) as i64).collect()
}

/// Run with `batch` rows; returns the first output, flattened per row.
fn run(model: &Model, batch: usize, seq: usize, ids: &[i64]) -> Vec<Vec<f32>> {
    let mut inputs = Vec::new();
    for info in model.inputs() {
        let v = match info.name.as_str() {
            "input_ids" => ids.to_vec(),
            "attention_mask" => vec![1; batch * seq],
            _ => vec![0; batch * seq],
        };
        inputs.push((info.name, Tensor::new(vec![batch, seq], Elems::I64(v)).expect("tensor")));
    }
    let named: Vec<(&str, Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let out = model.interpret(&named).unwrap_or_else(|e| panic!("batch {batch} seq {seq}: {e}"));
    let t = &out[0].1;
    assert_eq!(t.shape()[..2], [batch, seq]);
    let Elems::F32(v) = t.elems() else { panic!("f32 output") };
    v.chunks(v.len() / batch).map(|c| c.to_vec()).collect()
}

fn seqs() -> impl Strategy<Value = usize> {
    // 1, primes, and the last position the fixtures' tables allow.
    prop_oneof![Just(1usize), Just(2), Just(13), Just(31), Just(63), Just(64), 1usize..=64]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn rows_are_independent(model_name in prop_oneof![Just("bert"), Just("gpt2"), Just("albert")], batch in 1usize..=3, seq in seqs(), seed in 0u64..1000) {
        let model = load(model_name);
        let all = ids(batch, seq, seed);
        let together = run(&model, batch, seq, &all);
        for b in 0..batch {
            let alone = run(&model, 1, seq, &all[b * seq..(b + 1) * seq]);
            let max = together[b].iter().zip(&alone[0]).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            prop_assert!(max < 1e-5, "{model_name} batch {batch} seq {seq} row {b}: differs by {max}");
        }
    }
}

#[test]
fn sequence_past_the_position_table_is_a_clear_error() {
    let model = load("bert");
    let t = |v: i64| Tensor::new(vec![1, 65], Elems::I64(vec![v; 65])).expect("tensor");
    let err = model
        .interpret(&[("input_ids", t(1)), ("attention_mask", t(1)), ("token_type_ids", t(0))])
        .expect_err("too long");
    assert!(err.to_string().contains("seq = 65") && err.to_string().contains("1..64"), "{err}");
}
