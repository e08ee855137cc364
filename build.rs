//! Compiles attnlab's CUDA kernels (`src/ops/kernels.cu`) to PTX, with `--features cuda` only:
//! a CPU build never looks for nvcc.
//!
//! nvcc is taken from `$CUDA_HOME/bin` (or `$CUDA_PATH/bin`), else from `PATH`, as candle's own
//! kernels are; the target is `sm_$CUDA_COMPUTE_CAP` (default 90, H100/H200), the variable
//! `scripts/build-cuda.sh` and candle-kernels read.

use std::path::PathBuf;
use std::process::Command;

const KERNELS: &str = "src/ops/kernels.cu";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed={KERNELS}");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let ptx = out.join("attnlab_kernels.ptx");
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".into());
    let cap: String = cap.chars().filter(char::is_ascii_digit).collect();
    let status = Command::new(nvcc())
        .args(["--ptx", "-O3", "-std=c++17", "-lineinfo"])
        .arg(format!("-arch=sm_{cap}"))
        .arg("-o")
        .arg(&ptx)
        .arg(KERNELS)
        .status();
    match status {
        Ok(status) if status.success() => {}
        Ok(status) => panic!("nvcc failed on {KERNELS} ({status})"),
        Err(e) => panic!(
            "cannot run nvcc ({e}): --features cuda needs the CUDA toolkit (set CUDA_HOME), \
             or build with scripts/build-cuda.sh"
        ),
    }
}

/// nvcc of `$CUDA_HOME` or `$CUDA_PATH` when set, else the one on `PATH`.
fn nvcc() -> PathBuf {
    ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(std::env::var_os)
        .map(|root| PathBuf::from(root).join("bin").join("nvcc"))
        .find(|path| path.exists())
        .unwrap_or_else(|| PathBuf::from("nvcc"))
}
