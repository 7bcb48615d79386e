//! The runner binary without a GPU: a clear error, never a crash (CI has no GPU; on
//! a GPU machine `info` prints the device instead). Built with `--features cuda`.
#![cfg(feature = "cuda")]

use std::process::Command;

#[test]
fn without_a_driver_the_runner_says_so() {
    let out = Command::new(env!("CARGO_BIN_EXE_anyshape-gpu")).arg("info").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        // A machine with the driver: the device and its limits.
        assert!(String::from_utf8_lossy(&out.stdout).contains("sms:"));
    } else {
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("no NVIDIA driver") || err.contains("CUDA:"), "{err}");
    }
}

#[test]
fn a_missing_kernel_folder_is_an_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_anyshape-gpu"))
        .args(["check", "--dir", "/nonexistent/anyshape-kernels"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no NVIDIA driver") || err.contains("manifest.json"), "{err}");
}
