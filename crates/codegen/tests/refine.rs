//! The measured dispatch's cache: a class measured for another kernel family
//! (the tiles measured again since, with other kernels kept) is measured again,
//! not handed to the dispatcher, which would refuse it and fail the compile.

use anyshape_codegen::refine::{refine, WeightClass};
use anyshape_codegen::Contraction;
use kernels::{Target, ThreadPool};
use plan::Epilogue;

#[test]
fn classes_of_another_family_are_measured_again() {
    let t = Target::detect();
    if !kernels::testing::require("ANYSHAPE_REQUIRE_AVX2", t.supported(), "AVX2 + FMA") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("anyshape-refine-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let pool = ThreadPool::new(2);
    let c = Contraction::builder(&t, &pool).cache(Some(&dir)).build().expect("compile");
    let (k, n) = (64, 96);
    let layout = c.weight_layout(k, n, &[1, 16, 128]).expect("layout");
    let w = [WeightClass { k, n, layout }];
    let first = refine(&c, &pool, Epilogue::default(), &w, Some(&dir)).expect("measured");
    first.check(&c).expect("usable");
    let file = anyshape_codegen::refine::path(&dir, kernels::ElemType::F32, 2);
    assert!(file.exists(), "the measured dispatch's file {}", file.display());

    // A kernel of a tile no family has, picked at the table's first row (a
    // measured class may hold no kernel at all: the model's pick won every row).
    let mut json: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let entries = json["entries"].as_array_mut().expect("entries");
    assert!(!entries.is_empty(), "no cached class");
    for entry in entries {
        let class = &mut entry[1];
        let kernels = class["kernels"].as_array_mut().expect("kernels");
        kernels.push(serde_json::json!({
            "operands": "Direct", "mr": 97, "nr": 16, "kc": 64, "mc": 97, "order": "KOuter", "threads": 1
        }));
        let stale = kernels.len() - 1;
        class["table"][0]["pick"] = serde_json::json!(stale);
    }
    std::fs::write(&file, serde_json::to_vec(&json).unwrap()).unwrap();

    let again = refine(&c, &pool, Epilogue::default(), &w, Some(&dir)).expect("measured again");
    again.check(&c).expect("usable after measuring again");
    let stored: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let kept = stored["entries"].as_array().unwrap();
    assert_eq!(kept.len(), 1, "the stale entry is replaced, not kept beside the new one");
    assert!(kept[0][1]["kernels"].as_array().unwrap().iter().all(|mk| mk["mr"] != 97));
    let _ = std::fs::remove_dir_all(&dir);
}
