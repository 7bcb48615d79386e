//! The measured dispatch's cache: a class measured for another kernel family
//! (the tiles measured again since, with other kernels kept) is measured again,
//! not handed to the dispatcher, which would refuse it and fail the compile.

use anyshape_codegen::refine::{refine, WeightClass};
use anyshape_codegen::Contraction;
use kernels::{Epilogue, Target, ThreadPool};

#[test]
fn classes_of_another_family_are_measured_again() {
    let t = Target::detect();
    if !t.supported() {
        eprintln!("skipped: this machine has no AVX2 + FMA");
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

    // Every cached kernel renamed to a tile no family has.
    let file = std::fs::read_dir(&dir)
        .expect("cache folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.file_name().is_some_and(|f| f.to_string_lossy().starts_with("refined-v2")))
        .expect("the measured dispatch's file");
    let mut json: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let mut renamed = 0;
    for entry in json["entries"].as_array_mut().expect("entries") {
        for mk in entry[1]["kernels"].as_array_mut().expect("kernels") {
            mk["mr"] = serde_json::json!(97);
            renamed += 1;
        }
    }
    assert!(renamed > 0, "no cached kernel to rename");
    std::fs::write(&file, serde_json::to_vec(&json).unwrap()).unwrap();

    let again = refine(&c, &pool, Epilogue::default(), &w, Some(&dir)).expect("measured again");
    again.check(&c).expect("usable after measuring again");
    let stored: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let kept = stored["entries"].as_array().unwrap();
    assert_eq!(kept.len(), 1, "the stale entry is replaced, not kept beside the new one");
    assert!(kept[0][1]["kernels"].as_array().unwrap().iter().all(|mk| mk["mr"] != 97));
    let _ = std::fs::remove_dir_all(&dir);
}
