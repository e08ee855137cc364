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

/// The top-level module a file of `src/` belongs to (`train` for `src/train/run.rs`).
fn top_module(src: &Path, file: &Path) -> Option<String> {
    let first = file.strip_prefix(src).ok()?.components().next()?;
    let name = first.as_os_str().to_str()?.trim_end_matches(".rs");
    (!matches!(name, "lib" | "main")).then(|| name.to_string())
}

/// The names `lib.rs` re-exports at the crate root, each with its module (`Preset` → `preset`
/// for `pub use preset::Preset;`), so that `crate::Preset` counts as an import of `preset`.
fn root_reexports(src: &Path) -> std::collections::BTreeMap<String, String> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    // Statements, comments dropped, so a group may span lines.
    let code: Vec<&str> = lib.lines().map(|l| l.split("//").next().unwrap()).collect();
    let mut names = std::collections::BTreeMap::new();
    for statement in code.join(" ").split(';') {
        let Some(at) = statement.find("pub use ") else {
            continue;
        };
        let path = statement[at + "pub use ".len()..].trim();
        let path = path
            .trim_start_matches("crate::")
            .trim_start_matches("self::");
        let Some((module, items)) = path.split_once("::") else {
            continue;
        };
        for item in items.trim().trim_matches(['{', '}']).split(',') {
            // `A`, `x::A` or `A as B`: the last word is the name at the root.
            let name = item.trim().rsplit([' ', ':']).next().unwrap_or_default();
            if !name.is_empty() && name != "*" {
                names.insert(name.to_string(), module.trim().to_string());
            }
        }
    }
    names
}

/// Which top-level modules each module refers to (`crate::x` paths and `use crate::{x, …}`
/// groups, outside comments, a root re-export counting as its module), with a file that does
/// so for each edge.
fn module_graph() -> std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>
{
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: Vec<String> = files.iter().filter_map(|f| top_module(&src, f)).collect();
    let reexports = root_reexports(&src);
    let mut graph = std::collections::BTreeMap::<String, std::collections::BTreeMap<_, _>>::new();
    for file in &files {
        let Some(from) = top_module(&src, file) else {
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap();
        let code: Vec<&str> = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect();
        let code = code.join("\n");
        let mut named = Vec::new();
        for (i, _) in code.match_indices("crate::") {
            let rest = &code[i + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                named.extend(
                    group
                        .split(',')
                        .filter_map(|item| item.trim().split("::").next().map(str::to_string)),
                );
            } else {
                let end = rest
                    .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                named.push(rest[..end].to_string());
            }
        }
        let edges = graph.entry(from.clone()).or_default();
        for name in named {
            let to = reexports.get(&name).cloned().unwrap_or(name);
            if to != from && modules.contains(&to) {
                edges
                    .entry(to)
                    .or_insert_with(|| file.display().to_string());
            }
        }
    }
    graph
}

/// A path of modules that leads from `start` back to it, if there is one.
fn cycle_through(
    graph: &std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>,
    start: &str,
) -> Option<Vec<String>> {
    let mut stack = vec![vec![start.to_string()]];
    let mut seen = std::collections::BTreeSet::new();
    while let Some(path) = stack.pop() {
        let last = path.last().unwrap();
        for next in graph.get(last).into_iter().flat_map(|e| e.keys()) {
            if next == start {
                let mut cycle = path.clone();
                cycle.push(next.clone());
                return Some(cycle);
            }
            if seen.insert(next.clone()) {
                let mut longer = path.clone();
                longer.push(next.clone());
                stack.push(longer);
            }
        }
    }
    None
}

#[test]
fn the_module_graph_has_no_cycle() {
    let graph = module_graph();
    assert!(graph.len() > 12, "{graph:?}");
    // The reader of this test can see it is able to fail: it finds the known one-way edges.
    assert!(graph["train"].contains_key("model"), "{:?}", graph["train"]);
    assert!(graph["cli"].contains_key("sweep"), "{:?}", graph["cli"]);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let reexports = root_reexports(&src);
    assert_eq!(reexports["Preset"], "preset", "{reexports:?}");
    assert_eq!(reexports["Result"], "error", "{reexports:?}");
    for module in graph.keys() {
        if let Some(cycle) = cycle_through(&graph, module) {
            let evidence: Vec<String> = cycle
                .windows(2)
                .map(|w| format!("{} -> {} ({})", w[0], w[1], graph[&w[0]][&w[1]]))
                .collect();
            panic!("import cycle: {}", evidence.join(", "));
        }
    }
}

#[test]
fn renderers_and_the_core_import_no_analysis_or_front_end() {
    let graph = module_graph();
    let above = ["analysis", "extrapolation", "sweep", "train", "app", "cli"];
    for low in [
        "figures",
        "ops",
        "params",
        "encodings",
        "attention",
        "model",
        "preset",
    ] {
        for high in above {
            assert!(
                !graph[low].contains_key(high),
                "{low} imports {high} ({})",
                graph[low][high]
            );
        }
    }
}
