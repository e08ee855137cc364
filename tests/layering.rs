//! The library stays usable without a GUI: only `src/app` may use egui, eframe, egui_plot or
//! rfd (the style guide's layering rule, checked on the sources).

#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

use std::path::Path;

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn only_the_app_module_uses_gui_crates() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let app = src.join("app");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 20);
    for file in files.iter().filter(|f| !f.starts_with(&app)) {
        let text = std::fs::read_to_string(file).unwrap();
        for krate in ["egui", "eframe", "egui_plot", "rfd"] {
            let used = text
                .lines()
                .any(|l| l.contains(&format!("{krate}::")) && !l.trim_start().starts_with("//"));
            assert!(!used, "{} uses {krate}", file.display());
        }
    }
}

/// The crates a build without the `gui` feature links, one name per line (`cargo tree`).
fn headless_dependencies() -> Vec<String> {
    let output = std::process::Command::new(env!("CARGO"))
        .args(["tree", "--offline", "--locked", "--no-default-features"])
        .args(["--edges", "normal", "--prefix", "none", "--format", "{p}"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
        .collect()
}

#[test]
fn a_build_without_the_gui_feature_links_no_gui_crate() {
    let crates = headless_dependencies();
    assert!(crates.iter().any(|c| c == "candle-core"), "{crates:?}");
    for gui in ["eframe", "egui", "egui_plot", "rfd", "winit", "glow"] {
        assert!(
            !crates.iter().any(|c| c == gui),
            "{gui} is linked without the gui feature"
        );
    }
}
