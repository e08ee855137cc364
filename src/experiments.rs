//! The shipped presets, compiled into the binary, and the catalogue of experiments the
//! workbench is for: which paper's claim each checks, which presets it trains, where to look
//! when it ends and how long it takes.
//!
//! The presets are compiled in so the window finds them from any folder (a relative
//! `presets/` path only works from a checkout). The catalogue is data, here rather than in the
//! window, so the CLI and tests can read it without egui.

use std::path::{Path, PathBuf};

use crate::{Error, Preset, Result};

/// A preset file shipped with attnlab.
#[derive(Debug)]
pub struct Shipped {
    /// The file's stem (`lm_alibi`).
    pub name: &'static str,
    /// Its path in a checkout, for messages and CLI commands.
    pub file: &'static str,
    pub text: &'static str,
}

impl Shipped {
    /// The preset with `overrides` (`key=value`) applied, validated.
    pub fn preset(&self, overrides: &[String]) -> Result<Preset> {
        Preset::parse(self.text, overrides, Path::new(self.file))
    }
}

/// The shipped files `$name` of folder `$dir`, compiled in.
macro_rules! shipped {
    ($dir:literal: $($name:literal),* $(,)?) => {
        &[$(Shipped {
            name: $name,
            file: concat!($dir, "/", $name, ".toml"),
            text: include_str!(concat!("../", $dir, "/", $name, ".toml")),
        }),*]
    };
}

/// Every file of `presets/`, in name order.
pub const PRESETS: &[Shipped] = shipped!["presets":
    "bench_mqar",
    "iou_based",
    "iou_rebased",
    "iou_softmax",
    "lm_alibi",
    "lm_inv_n",
    "lm_inv_n_log_n",
    "lm_kerple_log",
    "lm_learned",
    "lm_rope",
    "lm_sandwich",
    "lm_sinusoidal",
    "lm_t5",
    "lm_type1",
    "lm_type2",
    "mad_in_context_recall",
    "mqar_based",
    "mqar_deltanet",
    "mqar_gated_deltanet",
    "mqar_gla",
    "mqar_linear",
    "mqar_linformer",
    "mqar_mamba2",
    "mqar_rebased",
    "mqar_rebased_paper",
    "mqar_retention",
    "mqar_softmax",
    "mqar_softmax_kerple_log",
    "mqar_softmax_rope",
];

/// Every file of `sweeps/`: their `base` presets are read relative to the sweep file, so
/// [`shipped_sweeps`] writes them out beside the presets.
pub const SWEEPS: &[Shipped] = shipped!["sweeps":
    "mad_full",
    "mad_lite",
    "mad_lite_mechanisms",
    "mad_lite_mixers",
    "mad_lite_quick",
    "mqar_fig1_paper",
    "mqar_fig1_small",
    "mqar_frontier_mixers",
    "mqar_frontier_paper",
    "mqar_frontier_small",
];

/// The preset file at `path`, or, where there is no such file, the shipped preset it names
/// (`mqar_softmax`, `mqar_softmax.toml` or `presets/mqar_softmax.toml`): shipped presets work
/// by name from any folder, as "Copy as CLI command" writes them.
pub fn load_preset(path: &Path, overrides: &[String]) -> Result<Preset> {
    match named(PRESETS, path) {
        Some(shipped) if !path.exists() => shipped.preset(overrides),
        // A bare name that is neither a file here nor shipped: say which names are.
        None if !path.exists() && path.parent() == Some(Path::new("")) => Err(Error::Unknown {
            what: "preset (no such file here, nor a shipped preset of that name)",
            name: path.display().to_string(),
            expected: PRESETS
                .iter()
                .map(|s| s.name)
                .collect::<Vec<_>>()
                .join(", "),
        }),
        _ => Preset::load(path, overrides),
    }
}

/// The sweep file at `path`, or, where there is no such file, the shipped sweep it names
/// (`mad_lite`, `sweeps/mad_lite.toml`), written out with its presets ([`shipped_sweeps`]
/// into the system's temporary folder) so that it runs from any folder.
pub fn sweep_file(path: &Path) -> Result<PathBuf> {
    match named(SWEEPS, path) {
        Some(shipped) if !path.exists() => {
            let files = shipped_sweeps(&shipped_dir())?;
            let index = SWEEPS.iter().position(|s| s.name == shipped.name);
            Ok(index.map_or_else(|| path.to_path_buf(), |i| files[i].clone()))
        }
        _ => Ok(path.to_path_buf()),
    }
}

/// Where shipped sweeps and their presets are written out outside a checkout: one folder per
/// user, so users of a shared machine do not write into each other's.
pub fn shipped_dir() -> PathBuf {
    let user = std::env::var("USER").unwrap_or_default();
    let user: String = user.chars().filter(char::is_ascii_alphanumeric).collect();
    std::env::temp_dir().join(format!(
        "attnlab-{}-shipped-{user}",
        env!("CARGO_PKG_VERSION")
    ))
}

/// The shipped preset's name when `path` is its copy in [`shipped_dir`]: what a plan of
/// commands for other machines (whose temporary folders hold no copy) should name instead.
pub fn shipped_preset_name(path: &Path) -> Option<&'static str> {
    let shipped = shipped_dir().join("presets");
    let inside = path.parent()?.canonicalize().ok()? == shipped.canonicalize().ok()?;
    let stem = path.file_stem()?.to_string_lossy();
    inside.then(|| PRESETS.iter().find(|s| s.name == stem).map(|s| s.name))?
}

/// Whether `path` names a shipped preset and is not a file here ([`load_preset`] reads it).
pub fn is_shipped_preset(path: &Path) -> bool {
    !path.exists() && named(PRESETS, path).is_some()
}

/// The entry of `list` that `path` names: its name, its name with `.toml`, or its file.
fn named(list: &'static [Shipped], path: &Path) -> Option<&'static Shipped> {
    let text = path.to_string_lossy();
    list.iter()
        .find(|s| text == s.name || text == s.file || text.strip_suffix(".toml") == Some(s.name))
}

/// The shipped sweep files, readable from any working folder: those of `sweeps/` when the
/// program runs from a checkout, else the compiled-in ones written with the presets they
/// name into `dir` (`dir/sweeps/…`, `dir/presets/…`).
pub fn shipped_sweeps(dir: &Path) -> Result<Vec<PathBuf>> {
    sweeps_from(Path::new(""), dir)
}

/// [`shipped_sweeps`] with the working folder `checkout`.
fn sweeps_from(checkout: &Path, dir: &Path) -> Result<Vec<PathBuf>> {
    let here: Vec<PathBuf> = SWEEPS.iter().map(|s| checkout.join(s.file)).collect();
    if here.iter().all(|p| p.is_file()) {
        return Ok(here);
    }
    for file in SWEEPS.iter().chain(PRESETS) {
        let path = dir.join(file.file);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| Error::io("cannot create folder", parent, e))?;
        }
        crate::io::write_bytes(&path, file.text.as_bytes())?;
    }
    Ok(SWEEPS.iter().map(|s| dir.join(s.file)).collect())
}

/// The shipped preset file named `name` (its stem).
pub fn shipped(name: &str) -> Result<&'static Shipped> {
    PRESETS
        .iter()
        .find(|s| s.name == name)
        .ok_or_else(|| Error::Unknown {
            what: "shipped preset",
            name: name.into(),
            expected: PRESETS
                .iter()
                .map(|s| s.name)
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// The view of the window an experiment's result is read in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Analysis {
    /// Bias, TRF and convergence of encodings (needs no trained run; the run adds its ERF).
    Encodings,
    /// Perplexity against length of the trained language models.
    Extrapolation,
    /// IoU of the trained models' attention with the MQAR ground truth.
    Iou,
    /// Singular-value spectra of the trained models' attention.
    Spectra,
    /// The summary of the shipped sweep of this name (its frontier and accuracy figures): the
    /// experiment runs the sweep in the Sweep view instead of training runs of its own.
    Sweep(&'static str),
}

impl Analysis {
    /// Whether the analysis runs on finished runs (so it starts when the experiment's runs end).
    pub fn needs_finished_runs(self) -> bool {
        !matches!(self, Analysis::Encodings | Analysis::Sweep(_))
    }
}

/// One shipped preset of an experiment, with settings changed for it.
#[derive(Debug)]
pub struct Run {
    pub preset: &'static str,
    pub set: &'static [&'static str],
}

impl Run {
    pub fn load(&self) -> Result<Preset> {
        let set: Vec<String> = self.set.iter().map(|s| s.to_string()).collect();
        shipped(self.preset)?.preset(&set)
    }
}

/// An experiment of the welcome page.
#[derive(Debug)]
pub struct Experiment {
    /// What is compared, and against what.
    pub title: &'static str,
    /// The paper and the table or figure it reproduces.
    pub source: &'static str,
    /// Trained side by side when the experiment starts; the first goes in the editor.
    pub runs: &'static [Run],
    pub analysis: Analysis,
    /// Encodings drawn beside the editor's in the Encodings view.
    pub overlay: &'static [&'static str],
    /// Wall time to the result on the 2-core development machine, measured with the release
    /// CLI (`attnlab train`, `extrapolate`, `iou`, `spectrum`) on 2026-11-23 while other
    /// builds shared it (load average 8–10; idle, training took about half as long), unless
    /// the text names another day and load.
    pub expected: &'static str,
    /// Where to look when it ends.
    pub look_at: &'static str,
    /// The paper's claim the result checks.
    pub claim: &'static str,
}

impl Experiment {
    /// The presets to train, in order.
    pub fn presets(&self) -> Result<Vec<Preset>> {
        self.runs.iter().map(Run::load).collect()
    }
}

const fn run(preset: &'static str) -> Run {
    Run { preset, set: &[] }
}

/// The experiments the tool is for.
pub const EXPERIMENTS: &[Experiment] = &[
    Experiment {
        title: "ALiBi vs sinusoidal: perplexity against length",
        source: "Exploring Transformer Extrapolation, Tables 4–6",
        runs: &[run("lm_alibi"), run("lm_sinusoidal")],
        analysis: Analysis::Extrapolation,
        overlay: &[],
        expected: "about 2 minutes: training 28 s and 37 s, then perplexity at 7 lengths \
                   41 s",
        look_at: "Extrapolation view: ALiBi's curve stays flat beyond the training length L = 64 \
                  while sinusoidal's climbs (measured: 7.56 to 7.39 against 8.03 to 34.3 at \
                  4096 tokens, on the text corpus = \"auto\" found on the development machine, \
                  the cargo registry's Rust sources; the run panel names a run's text, and \
                  other text gives other numbers); in the table ALiBi passes Definition 0.1 (every δ below 0.1) \
                  and its bias converges (Theorem 0.4).",
        claim: "A relative bias whose exp(bias) series converges (ALiBi) extrapolates: perplexity \
                at lengths far beyond L stays close to perplexity at L. Absolute sinusoidal \
                positions do not.",
    },
    Experiment {
        title: "ReBased vs Based vs attention on MQAR, with IoU against the ground truth",
        source: "ReBased, Fig. 1 and Table 5",
        runs: &[run("iou_softmax"), run("iou_rebased"), run("iou_based")],
        analysis: Analysis::Iou,
        overlay: &[],
        expected: "about 4.5 minutes: the three models train to 99 % test accuracy in 65 s, \
                   97 s and 103 s; IoU over 10,000 test rows takes under 2 s each",
        look_at: "IoU view: soft IoU orders softmax far above ReBased, ReBased above Based (0.992, 0.182, \
                  0.139); the curve of hard IoU against its threshold τ shows that the hard \
                  ranking rests on τ (all near 1 at τ = 0.1; Based above ReBased at 0.05, \
                  ReBased level with softmax at 0.2); each run's accuracy curve in Training \
                  (all three recall).",
        claim: "ReBased's attention puts more of its weight on the ground-truth positions than \
                Based's, and softmax attention nearly all of it (Table 5's order, by soft IoU); \
                the kernel mechanisms' largest weight is on the target but most of their weight \
                is spread over the context. ReBased recalls better than Based at the same width \
                (Fig. 1).",
    },
    Experiment {
        title: "TRF of every relative encoding",
        source: "Exploring Transformer Extrapolation, TRF figures",
        runs: &[run("lm_alibi")],
        analysis: Analysis::Encodings,
        overlay: &[
            "alibi",
            "kerple-log",
            "sandwich",
            "type1",
            "type2",
            "inv-n",
            "inv-n-log-n",
        ],
        expected: "the curves in about a second; the ALiBi run that adds its ERF trains in \
                   28 s (its first evaluation, with the ERF, a third of the way)",
        look_at: "Encodings view: the TRF panel (receptive field / m against ε) and the verdict \
                  table. Raise the length m: convergent encodings' curves fall toward 0, \
                  divergent ones (1/n, 1/(n ln n)) keep spanning the length. The trained run's \
                  ERF joins the panel at its first evaluation.",
        claim: "An encoding extrapolates when the sum of exp(bias) over distances converges \
                (Theorem 0.4): its theoretical receptive field is then a vanishing fraction of \
                a growing length.",
    },
    Experiment {
        title: "ReRoPE on a RoPE model",
        source: "the ReRoPE post",
        runs: &[run("lm_rope")],
        analysis: Analysis::Extrapolation,
        overlay: &[],
        expected: "about 4 minutes: training 37 s, then RoPE and its inference-time variants \
                   (PI, NTK, three ReRoPE settings, Leaky ReRoPE) at 7 lengths 191 s",
        look_at: "Extrapolation view: the dashed ReRoPE and Leaky ReRoPE curves stay near the \
                  perplexity at L while plain RoPE (solid) and PI climb; NTK holds only to a \
                  few L.",
        claim: "Capping RoPE's relative position at a window w at inference (ReRoPE), without \
                retraining, keeps perplexity nearly flat far beyond the training length.",
    },
    Experiment {
        title: "Linformer's attention spectrum",
        source: "Linformer, Fig. 1",
        runs: &[run("mqar_softmax")],
        analysis: Analysis::Spectra,
        overlay: &[],
        expected: "about 1.5 minutes: the model trains to 99 % test accuracy in 90 s (9 \
                   epochs), its spectra take 2 s",
        look_at: "Spectra view: the normalised cumulative singular values pass 0.95 by index \
                  16 of 64 (measured: 0.97 to 0.99 per head); the heatmap gives that value per \
                  layer and head.",
        claim: "Self-attention is low rank: most of a trained attention matrix's spectrum lies \
                in its first few singular values, so keys and values can be projected to \
                k much smaller than n positions.",
    },
    Experiment {
        title: "The hidden attention of RetNet, GLA and DeltaNet against softmax's on MQAR",
        source: "RetNet, GLA and DeltaNet (flash-linear-attention); ReBased's IoU, Table 5",
        runs: &[
            run("mqar_softmax"),
            run("mqar_retention"),
            run("mqar_gla"),
            run("mqar_deltanet"),
        ],
        analysis: Analysis::Iou,
        overlay: &[],
        expected: "about 5 minutes: alone, the four train to 99 % test accuracy in about 75 s, \
                   65 s, 102 s and 23 s, then IoU over 10,000 test rows takes 3 s to 13 s each \
                   (GLA's matrix is summed channel by channel); measured 2026-11-28 on the idle \
                   machine",
        look_at: "IoU view: each recurrent mixer's soft IoU, read on |A| row-normalised (the \
                  protocol line says so), beside softmax's; measured best heads: softmax 0.67, \
                  retention 0.23, GLA 0.23, DeltaNet 0.18 with its other heads at 0.02-0.06 \
                  (hard IoU at τ 0.1, on the threshold curve: 0.65, 0.42, 0.40, 0.48). \
                  Attention view: their maps are signed, drawn blue (< 0), white (0) and red \
                  (> 0): retention's fade with distance at a fixed rate per head, DeltaNet's \
                  carry the blue entries where its rule erases an overwritten key.",
        claim: "Every one of these mixers computes its output as A·V for an explicit L × L \
                matrix (its hidden attention), so they can be read like attention; all four \
                recall MQAR at this size, the recurrent ones with a state of H d_k d_v floats.",
    },
    Experiment {
        title: "Who recalls with how much state: the recurrent mixers' frontier on MQAR",
        source: "Based, Figure 2 (zoology's recall-vs-state plot), with RetNet, GLA, DeltaNet, \
                 Gated DeltaNet and Mamba-2",
        runs: &[],
        analysis: Analysis::Sweep("mqar_frontier_mixers"),
        overlay: &[],
        expected: "about 30 minutes on 2 cores: 15 cells (5 mixers at d_model 16, 32, 64), two \
                   at a time; a cell that reaches 99 % stops early. Stop and rerun to resume",
        look_at: "Sweep view: the frontier panel puts each cell's best accuracy against its \
                  recurrent state (log x), the smallest state reaching 99 % marked; measured \
                  (docs/recall.md): DeltaNet reaches 99 % at d_model 32 with 1,408 units, the \
                  smallest state of any mechanism measured; at d_model 64 every mixer but GLA \
                  (expand_k 0.5, 94.9 %) reaches 98–99 %. One seed per cell: a cell that does \
                  not take off in 16 epochs is not a property of its width. Collect it with \
                  frontier-small to put softmax, Based and ReBased on the same plot.",
        claim: "Recall costs state: each mixer recalls MQAR's pairs only once its recurrent \
                state is large enough, and the mixers differ in how much they need.",
    },
    Experiment {
        title: "The MAD battery for one mechanism: MAD-lite's first look (a cell a probe), \
                scored beside the published rows",
        source: "MAD (Poli et al. 2024, mad-lab `benchmark.py`); the DeltaNet paper's MAD table",
        runs: &[],
        analysis: Analysis::Sweep("mad_lite_quick"),
        overlay: &[],
        expected: "under an hour on 2 cores (Mamba-2, the slowest per step, took 43 \
                   minutes): the six probes at epoch scale 0.05 (10 of MAD's 200 epochs), \
                   one cell each at lr 1e-3 and decay 0.1, two cells at a time \
                   on a core each; selective copying (length 256) is the longest, \
                   memorisation takes a minute. Stop and rerun to resume. MAD's grid of 3 lrs \
                   x 2 decays (sweep mad_lite, about 5 hours) trains into the same folder and \
                   keeps these six. For another mechanism, edit set (attention.kind=...) \
                   in mad_lite_quick.toml and mad_lite.toml alike (they share a folder), or \
                   give the quick one its own out",
        look_at: "Sweep view: MAD's score per task (here the one cell's last macro accuracy: \
                  a lower bound of MAD-lite's best of six, within 0.03 of it in every probe \
                  measured so far) in the table and the bar figure, the DeltaNet paper's \
                  Transformer row beside softmax's. At this epoch scale the scores are not \
                  MAD's protocol and sit below the published ones: one softmax run of \
                  in-context recall reached 0.63 macro accuracy after 10 epochs, 0.76 after 20.",
        claim: "Which synthetic capabilities a mixer has (recall, noisy and fuzzy recall, \
                selective copying, compression, memorisation) predicts how it scales; softmax \
                attention is the reference row of MAD's table.",
    },
    Experiment {
        title: "DIET vs T5 biases",
        source: "DIET",
        runs: &[
            run("lm_t5"),
            Run {
                preset: "lm_t5",
                set: &["name=lm-diet-rel", "encoding=diet-rel"],
            },
        ],
        analysis: Analysis::Extrapolation,
        overlay: &[],
        expected: "about 1.5 minutes: training 24 s and 23 s, then perplexity at 7 lengths \
                   51 s",
        look_at: "Extrapolation view: perplexity at the training length L = 64 (the first \
                  column) is close for the two (measured: T5 7.45, DIET-REL 7.72, on the \
                  development machine's corpus = \"auto\", the cargo registry's Rust \
                  sources); beyond L \
                  both rise, as their learned tables (Theorem 0.4: diverges) predict.",
        claim: "What makes relative encodings work is a position term added per head to the \
                attention logits: DIET-REL's one learned scalar per distance does as well as \
                T5's bucketed bias.",
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    /// A perplexity depends on the text it is measured on, and `corpus = "auto"` finds other
    /// text on other machines: an experiment that quotes language models' perplexities says
    /// which text gave them.
    #[test]
    fn every_language_model_experiment_names_the_text_of_its_numbers() {
        for experiment in EXPERIMENTS {
            let perplexities = matches!(experiment.analysis, Analysis::Extrapolation)
                && experiment.look_at.contains("measured")
                && experiment
                    .runs
                    .iter()
                    .any(|run| run.load().unwrap().task.lm().is_some());
            if perplexities {
                assert!(
                    experiment.look_at.contains("corpus"),
                    "{}: {}",
                    experiment.title,
                    experiment.look_at
                );
            }
        }
    }

    /// The error names what was asked and lists what there is.
    #[test]
    fn an_unknown_preset_name_lists_the_shipped_ones() {
        let Err(Error::Unknown {
            what,
            name,
            expected,
        }) = shipped("nonesuch")
        else {
            panic!("an unknown name must be Error::Unknown");
        };
        assert_eq!((what, name.as_str()), ("shipped preset", "nonesuch"));
        assert!(expected.contains("mqar_softmax"), "{expected}");
    }

    #[test]
    fn shipped_sweeps_load_from_a_folder_without_a_checkout() {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files: Vec<String> = std::fs::read_dir(manifest.join("sweeps"))
            .unwrap()
            .filter_map(|e| e.ok()?.path().file_stem()?.to_str().map(str::to_string))
            .collect();
        files.sort();
        let names: Vec<&str> = SWEEPS.iter().map(|s| s.name).collect();
        assert_eq!(files, names, "every file of sweeps/ is compiled in");
        let (elsewhere, written) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let paths = sweeps_from(elsewhere.path(), written.path()).unwrap();
        assert!(
            paths.iter().all(|p| p.starts_with(written.path())),
            "{paths:?}"
        );
        for path in &paths {
            crate::sweep::Sweep::load(path).unwrap();
        }
        let in_checkout = sweeps_from(manifest, written.path()).unwrap();
        assert!(
            in_checkout.iter().all(|p| p.starts_with(manifest)),
            "{in_checkout:?}"
        );
    }

    #[test]
    fn every_shipped_file_is_compiled_in_and_valid() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("presets");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok()?.path().file_stem()?.to_str().map(str::to_string))
            .collect();
        files.sort();
        let names: Vec<&str> = PRESETS.iter().map(|s| s.name).collect();
        assert_eq!(files, names);
        for shipped in PRESETS {
            shipped.preset(&[]).unwrap();
        }
    }

    /// Every experiment trains presets that load, or runs a shipped sweep.
    #[test]
    fn every_experiment_loads_its_presets_or_names_a_shipped_sweep() {
        for experiment in EXPERIMENTS {
            let presets = experiment.presets().unwrap();
            match experiment.analysis {
                Analysis::Sweep(name) => {
                    assert!(SWEEPS.iter().any(|s| s.name == name), "{name}");
                    assert!(presets.is_empty(), "{}", experiment.title);
                }
                _ => assert!(!presets.is_empty(), "{}", experiment.title),
            }
            for encoding in experiment.overlay {
                crate::encodings::EncodingSpec::from_name(encoding).unwrap();
            }
        }
        let diet = EXPERIMENTS
            .iter()
            .find(|e| e.title.starts_with("DIET"))
            .unwrap()
            .presets()
            .unwrap();
        assert_eq!(diet[1].encoding.name(), "diet-rel");
        assert_eq!(diet[1].name, "lm-diet-rel");
    }
}
