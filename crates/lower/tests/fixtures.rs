//! Every fixture model lowers: every group to steps, no op without a lowering.

use std::path::Path;

fn fixture(name: &str) -> ir::Graph {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(name).join("model.onnx");
    let mut g = onnx::import_file(&path, &onnx::ImportOptions::default()).expect("import");
    passes::Pipeline::standard().run(&mut g).expect("rewrites");
    g
}

#[test]
fn every_fixture_lowers() {
    for name in ["bert", "bert_dynamo", "albert", "gpt2", "vit", "resnet"] {
        let g = fixture(name);
        let fusion = passes::fuse(&g);
        let plan = lower::lower(&g, &fusion).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(plan.groups.len(), fusion.groups.len(), "{name}");
        if std::env::var("PRINT_PLAN").is_ok_and(|v| v == name) {
            println!("{}", plan::print_plan(&plan));
        }
    }
}
