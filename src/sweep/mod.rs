//! Sweeps: one base preset trained over a grid of mechanisms, widths, lengths, learning rates and
//! seeds (the ReBased paper's Figure 1), resumable, spreadable over machines.
//!
//! ```toml
//! name = "fig1"
//! base = "../presets/mqar_rebased.toml"  # relative to this file
//! out = "runs/sweep-fig1"                # the default is runs/sweep-<name>
//! workers = 0                            # groups trained at once; 0 (the default): one per core, one on a GPU
//! replicas = 8                           # cells of one shape trained as one model, at most; 1: cell by cell
//! set = ["train.epochs=4"]               # overrides applied to every cell
//! [axes]                                 # every axis is optional
//! mechanism = ["softmax", "based", { kind = "rebased", variant = "x2" }]
//! d_model = [32, 64]
//! seq_len = [64, 128]
//! num_kv_pairs = [4, 8]                  # one per seq_len
//! lr = [1e-3, 3e-3]
//! seed = [0, 1, 2]                       # train.seed: initialisation and data order
//! ```
//!
//! A MAD base preset (`sweeps/mad_lite.toml`) takes two more axes, `probe` (`task.probe`) and
//! `weight_decay`; its runs are summarised as MAD's score (`mad.rs`). Instead of `probe`, the
//! `task` axis lists task settings, one table per point (`{ probe = "compression",
//! vocab_size = 32 }`, the rest the base's): MAD's `changes` (`sweeps/mad_full.toml`).
//!
//! Cells that differ only in per-run settings (seed, learning rate, …; see
//! [`crate::train::replicas`]) train as replicas of one batched model, a group, each into its
//! own run folder exactly as if trained alone. Workers train groups side by side, each on its
//! own share of the cores ([`Split`]).
//!
//! Each cell trains into its own folder `out/<cell id>/<time>-<name>/`. A cell counts as done
//! when one of its run folders has a `summary.json` with status `completed` or
//! `target-reached`; anything else (stopped, failed, still running when killed) is trained again
//! on resume. A finished run of another preset than its cell's (the sweep file changed) is
//! refused, not counted; its name, description and device may differ. The summary reads only
//! run folders (their `preset.toml` and `summary.json`), so `collect` merges folders trained
//! anywhere.

mod eta;
pub mod figures;
pub mod mad;
mod summary;

use std::cmp::Reverse;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;

use serde::{Deserialize, Serialize};

pub use eta::Eta;
pub use summary::{CellResult, SummaryPoint, SweepSummary, collect, mechanism_label, summarise};

use crate::preset::Preset;
use crate::train::worker::panic_text;
use crate::train::{RunDir, RunStatus, TrainEvent};
use crate::{Error, Result};

/// A sweep file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SweepFile {
    name: String,
    base: PathBuf,
    out: Option<PathBuf>,
    #[serde(default)]
    workers: usize,
    #[serde(default = "default_replicas")]
    replicas: usize,
    #[serde(default)]
    set: Vec<String>,
    #[serde(default)]
    axes: Axes,
}

/// The most cells one group trains by default: a sweep's lrs × seeds (Figure 1: 2 × 3) fit.
pub const DEFAULT_REPLICAS: usize = 8;

fn default_replicas() -> usize {
    DEFAULT_REPLICAS
}

/// The axes of a sweep file; an empty axis keeps the base preset's value.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Axes {
    /// MAD's probes (`task.probe`), with each probe's baseline settings.
    probe: Vec<String>,
    /// Task settings, one table per point, each key set under `[task]` over the base's.
    task: Vec<toml::Table>,
    mechanism: Vec<toml::Value>,
    d_model: Vec<usize>,
    seq_len: Vec<usize>,
    num_kv_pairs: Vec<usize>,
    lr: Vec<f64>,
    weight_decay: Vec<f64>,
    seed: Vec<u64>,
}

/// One point of the grid.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Cell {
    /// File-name-safe name, unique in the sweep: its folder under the sweep's `out`.
    pub id: String,
    /// `--set` overrides that turn the base preset into this cell's preset.
    pub overrides: Vec<String>,
}

/// A loaded and validated sweep.
#[derive(Clone, Debug)]
pub struct Sweep {
    pub name: String,
    /// The base preset, as a path usable from the current directory.
    pub base: PathBuf,
    pub out: PathBuf,
    /// Groups trained at once; 0 picks by the cores ([`Split::of`]), or one on a GPU.
    pub workers: usize,
    /// The most cells trained as replicas of one group; 1 trains cell by cell.
    pub replicas: usize,
    pub cells: Vec<Cell>,
}

/// One value of an axis: what goes into the cell id and the overrides it adds.
struct AxisValue {
    label: String,
    overrides: Vec<String>,
}

impl Sweep {
    /// Reads `path` and checks every cell's preset before any work starts.
    pub fn load(path: &Path) -> Result<Self> {
        let text = crate::io::read_text(path, "sweep", crate::io::MAX_TEXT_FILE)?;
        // A file of comments only is as empty as a blank one (it said "missing field `name`").
        if toml::from_str::<toml::Table>(&text).is_ok_and(|keys| keys.is_empty()) {
            return Err(Error::RunDir {
                message: "invalid sweep: the file is empty (or only comments); a sweep needs at \
                          least `name` and `base` (the preset each cell starts from), see \
                          docs/recall.md"
                    .into(),
                path: path.to_path_buf(),
            });
        }
        let file: SweepFile = toml::from_str(&text).map_err(|e| Error::PresetSyntax {
            what: "sweep file",
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let bad = |key: &str, why: String| Error::RunDir {
            message: format!("invalid sweep: {key}: {why}"),
            path: path.to_path_buf(),
        };
        if file.replicas == 0 {
            return Err(bad(
                "replicas",
                "must be at least 1 (1 trains cell by cell)".into(),
            ));
        }
        check_folder_name(&file.name).map_err(|why| bad("name", why))?;
        let base = path.parent().unwrap_or(Path::new("")).join(&file.base);
        let axes = file.axes.values().map_err(|(key, why)| bad(key, why))?;
        let decays = !file.axes.weight_decay.is_empty();
        check_grid_size(&axes).map_err(|why| bad("axes", why))?;
        let cells = grid(&axes, &file.set);
        check_cell_ids(&cells).map_err(|why| bad("axes", why))?;
        let sweep = Self {
            out: file
                .out
                .clone()
                .unwrap_or_else(|| PathBuf::from(format!("runs/sweep-{}", file.name))),
            name: file.name,
            base,
            workers: file.workers,
            replicas: file.replicas,
            cells,
        };
        for cell in &sweep.cells {
            let preset = sweep.preset(cell).map_err(|e| {
                bad(
                    &format!("cell {}", cell.id),
                    format!("{e} (overrides {})", cell.overrides.join(" ")),
                )
            })?;
            // An MQAR point is the best lr's mean over seeds: runs of other decays would be
            // taken for more seeds. MAD's score takes the best over lr × decay.
            if decays && !matches!(preset.task, crate::tasks::TaskSpec::Mad(_)) {
                return Err(bad(
                    "axes.weight_decay",
                    format!(
                        "is for MAD sweeps (their score takes the best of lr x decay); cell {} \
                         is a {} run, whose summary picks the best lr only: set \
                         train.weight_decay in `set`, one sweep per decay",
                        cell.id,
                        preset.task.name()
                    ),
                ));
            }
        }
        Ok(sweep)
    }

    /// The preset of `cell`.
    pub fn preset(&self, cell: &Cell) -> Result<Preset> {
        let mut preset = Preset::load(&self.base, &cell.overrides)?;
        preset.name = format!("{}-{}", self.name, cell.id);
        crate::preset::check_name(&preset.name)?;
        Ok(preset)
    }

    /// The folder `cell` trains into.
    pub fn cell_dir(&self, cell: &Cell) -> PathBuf {
        self.out.join(&cell.id)
    }

    /// The newest finished run folder of `cell` that trained the cell's preset, if it has
    /// one; an error if it has finished runs and none did (the sweep file changed since, e.g.
    /// its mechanism in `set`): taken as done, such a run's result would have been reported as
    /// the changed cell's. What names, describes or places a run (its name, description,
    /// device, TensorBoard log) may differ: a run renamed in the window, or a sweep moved to a
    /// GPU halfway, keeps its finished cells.
    pub fn finished_run(&self, cell: &Cell) -> Result<Option<PathBuf>> {
        let want = self.preset(cell)?;
        let mut refusal = None;
        for run_dir in finished_runs_in(&self.cell_dir(cell)).into_iter().rev() {
            let changed = RunDir::open(&run_dir)
                .and_then(|run| run.read_preset())
                .and_then(|trained| {
                    crate::preset::changed_settings(&want, &placed_as(trained, &want))
                });
            let why = match changed {
                Ok(changed) if changed.is_empty() => return Ok(Some(run_dir)),
                Ok(changed) => format!("the sweep now sets {}", changed.join(" ")),
                Err(e) => format!("its preset does not read: {e}"),
            };
            // The newest refused run is the one named.
            refusal.get_or_insert((why, run_dir));
        }
        let Some((why, path)) = refusal else {
            return Ok(None);
        };
        Err(Error::RunDir {
            message: format!(
                "the folder of cell {} of sweep {} holds a finished run of another preset \
                 ({why}): give the changed sweep its own `out` folder, or move the run away",
                cell.id, self.name,
            ),
            path,
        })
    }

    /// All cells in groups of one shape, at most `replicas` each: a group's number (from 1)
    /// does not change as its cells finish, so `attnlab sweep FILE --group N` names it.
    pub fn all_groups(&self) -> Result<Vec<Vec<usize>>> {
        groups(self, &(0..self.cells.len()).collect::<Vec<_>>())
    }

    /// One shell command per group of replicas, for a scheduler that runs whole groups:
    /// `attnlab sweep FILE --group N --replicas R --workers 1  # cells: ID …`, `file` as the
    /// commands name it. The comment names the group's cells, so that a person can pick one
    /// group (a mechanism's probe, say) from the plan; shells and schedulers ignore it.
    pub fn group_plan(&self, file: &Path) -> Result<Vec<String>> {
        let file = shell_quote(&file.to_string_lossy());
        Ok((self.all_groups()?.iter().enumerate())
            .map(|(i, group)| {
                let ids: Vec<&str> = group.iter().map(|&c| self.cells[c].id.as_str()).collect();
                format!(
                    "attnlab sweep {file} --group {} --replicas {} --workers 1  # cells: {}",
                    i + 1,
                    self.replicas,
                    ids.join(" ")
                )
            })
            .collect())
    }

    /// The sweep narrowed to the cells whose id matches the glob `pattern` (`*`, `?`,
    /// `[…]`): one mechanism's probe, say (`in-context-recall-linear-*`), whatever the
    /// grouping, where a group's number depends on `replicas`.
    pub fn only_cells(mut self, pattern: &str) -> Result<Self> {
        let bad = |reason: String| Error::argument("cells (--cells)", pattern, reason);
        let glob =
            glob::Pattern::new(pattern).map_err(|e| bad(format!("is not a glob pattern: {e}")))?;
        if !self.cells.iter().any(|cell| glob.matches(&cell.id)) {
            let examples: Vec<&str> = self.cells.iter().take(3).map(|c| c.id.as_str()).collect();
            return Err(bad(format!(
                "matches none of the {} cells of sweep {}, named like {}, …",
                self.cells.len(),
                self.name,
                examples.join(", ")
            )));
        }
        self.cells.retain(|cell| glob.matches(&cell.id));
        Ok(self)
    }

    /// The sweep narrowed to group `n` (from 1) of [`Self::all_groups`].
    pub fn only_group(mut self, n: usize) -> Result<Self> {
        let groups = self.all_groups()?;
        let Some(group) = n.checked_sub(1).and_then(|i| groups.get(i)) else {
            return Err(Error::argument(
                "group (--group)",
                n,
                format!(
                    "does not exist: sweep {} has groups 1 to {}",
                    self.name,
                    groups.len()
                ),
            ));
        };
        self.cells = group.iter().map(|&i| self.cells[i].clone()).collect();
        Ok(self)
    }

    /// One self-contained shell command per cell: trains it into its folder with the base preset
    /// and the cell's overrides (the same preset [`Sweep::preset`] builds).
    pub fn plan(&self) -> Vec<String> {
        self.cells
            .iter()
            .map(|cell| {
                let mut words = vec![
                    "attnlab".to_string(),
                    "train".into(),
                    shell_quote(&self.base.to_string_lossy()),
                ];
                for o in &cell.overrides {
                    words.push("--set".into());
                    words.push(shell_quote(o));
                }
                words.push("--set".into());
                words.push(shell_quote(&format!("name={}-{}", self.name, cell.id)));
                words.push("--out".into());
                words.push(shell_quote(&self.cell_dir(cell).to_string_lossy()));
                words.push("--quiet".into());
                words.join(" ")
            })
            .collect()
    }
}

impl Axes {
    /// The axes as lists of values, in grid order (outermost first); an error names the key.
    fn values(&self) -> std::result::Result<Vec<Vec<AxisValue>>, (&'static str, String)> {
        if !self.probe.is_empty() && self.task.iter().any(|t| t.contains_key("probe")) {
            return Err((
                "axes.probe",
                "and axes.task's entries both set the probe: give it in one of them".into(),
            ));
        }
        let tasks = table_values("axes.task", &self.task, task_value)?;
        if !self.num_kv_pairs.is_empty() && self.num_kv_pairs.len() != self.seq_len.len() {
            return Err((
                "axes.num_kv_pairs",
                format!(
                    "has {} entries but axes.seq_len has {}: give one number of pairs per length",
                    self.num_kv_pairs.len(),
                    self.seq_len.len()
                ),
            ));
        }
        let mechanisms = table_values("axes.mechanism", &self.mechanism, mechanism_value)?;
        let lengths = self
            .seq_len
            .iter()
            .enumerate()
            .map(|(i, &l)| {
                let mut overrides = vec![format!("task.seq_len={l}")];
                if let Some(n) = self.num_kv_pairs.get(i) {
                    overrides.push(format!("task.num_kv_pairs={n}"));
                }
                AxisValue {
                    label: format!("L{l}"),
                    overrides,
                }
            })
            .collect();
        let simple = |prefix: &str, key: &str, values: Vec<String>| -> Vec<AxisValue> {
            values
                .into_iter()
                .map(|v| AxisValue {
                    label: format!("{prefix}{v}"),
                    overrides: vec![format!("{key}={v}")],
                })
                .collect()
        };
        let strings = |v: &[usize]| v.iter().map(usize::to_string).collect();
        let reals = |v: &[f64]| v.iter().map(f64::to_string).collect();
        Ok(vec![
            simple("", "task.probe", self.probe.clone()),
            tasks,
            mechanisms,
            lengths,
            simple("d", "model.d_model", strings(&self.d_model)),
            simple("lr", "train.lr", reals(&self.lr)),
            simple("wd", "train.weight_decay", reals(&self.weight_decay)),
            simple(
                "s",
                "train.seed",
                self.seed.iter().map(u64::to_string).collect(),
            ),
        ])
    }
}

/// A mechanism axis entry: a name (`"based"`) or a table of the `[attention]` section. The
/// whole section is replaced, so settings of the base's mechanism do not leak into another.
fn mechanism_value(value: &toml::Value) -> std::result::Result<AxisValue, String> {
    let table = match value {
        toml::Value::String(kind) => {
            let mut t = toml::Table::new();
            t.insert("kind".into(), toml::Value::String(kind.clone()));
            t
        }
        toml::Value::Table(t) if t.get("kind").is_some_and(toml::Value::is_str) => t.clone(),
        other => {
            return Err(format!(
                "{other} is neither a mechanism name nor a table with a `kind`"
            ));
        }
    };
    let kind = table["kind"].as_str().unwrap_or_default();
    let text = |v: &toml::Value| match v {
        toml::Value::String(s) => s.clone(),
        v => v.to_string(),
    };
    let settings: Vec<(&String, String)> = table
        .iter()
        .filter(|(k, _)| *k != "kind")
        .map(|(k, v)| (k, text(v)))
        .collect();
    let mut label = vec![kind.to_string()];
    label.extend(settings.iter().map(|(k, v)| format!("{k}-{v}")));
    // `attention=KIND` replaces the whole section; the settings follow one `--set` each, so no
    // override needs quotes (xargs and schedulers' line handling strip them).
    let mut overrides = vec![format!("attention={kind}")];
    overrides.extend(settings.iter().map(|(k, v)| format!("attention.{k}={v}")));
    Ok(AxisValue {
        label: label.join("_"),
        overrides,
    })
}

/// The values of an axis of tables (mechanisms, task settings), each read by `value`; an error
/// names `key`.
fn table_values<T>(
    key: &'static str,
    entries: &[T],
    value: fn(&T) -> std::result::Result<AxisValue, String>,
) -> std::result::Result<Vec<AxisValue>, (&'static str, String)> {
    entries
        .iter()
        .map(value)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|why| (key, why))
}

/// A task axis entry: settings under `[task]` over the base's, its label the probe (if set)
/// and each other `key-value`. Values go without quotes, as the mechanism axis's.
fn task_value(table: &toml::Table) -> std::result::Result<AxisValue, String> {
    if table.is_empty() || table.contains_key("kind") {
        return Err(format!(
            "{{ {table} }} must set at least one task setting, and not `kind` (the base's \
             task is the one whose settings vary)"
        ));
    }
    let text = |v: &toml::Value| match v {
        toml::Value::String(s) => s.clone(),
        v => v.to_string(),
    };
    let probe = table.get("probe").map(text);
    let mut label: Vec<String> = probe.into_iter().collect();
    label.extend(
        table
            .iter()
            .filter(|(k, _)| *k != "probe")
            .map(|(k, v)| format!("{k}-{}", text(v))),
    );
    Ok(AxisValue {
        label: label.join("_"),
        overrides: table
            .iter()
            .map(|(k, v)| format!("task.{k}={}", text(v)))
            .collect(),
    })
}

/// Every combination of the axes' values, outermost axis first.
fn grid(axes: &[Vec<AxisValue>], set: &[String]) -> Vec<Cell> {
    let mut cells = vec![Cell {
        id: String::new(),
        overrides: set.to_vec(),
    }];
    for axis in axes.iter().filter(|a| !a.is_empty()) {
        cells = cells
            .iter()
            .flat_map(|cell| {
                axis.iter().map(move |value| Cell {
                    id: if cell.id.is_empty() {
                        value.label.clone()
                    } else {
                        format!("{}-{}", cell.id, value.label)
                    },
                    overrides: [cell.overrides.clone(), value.overrides.clone()].concat(),
                })
            })
            .collect();
    }
    for cell in cells.iter_mut().filter(|c| c.id.is_empty()) {
        cell.id = "base".into();
    }
    cells
}

/// The most cells a sweep may have: a grid of 1e10 cells took 6 GB before training anything.
pub const MAX_CELLS: usize = 10_000;

/// The longest sweep name: its cells' run names are `<name>-<cell id>`, within a preset's
/// [`crate::preset::MAX_NAME_CHARS`].
const MAX_SWEEP_NAME: usize = 100;

/// Whether `name` can be one folder's name on every system: letters, digits, `-`, `_` and
/// `.`, not starting with `.`. A sweep's name is its default output folder and a cell's id its
/// folder, so `../..` would leave `runs/` and a newline would split a plan's command.
fn check_folder_name(name: &str) -> std::result::Result<(), String> {
    let safe = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
    if name.is_empty() || name.starts_with('.') || !name.chars().all(safe) {
        return Err(format!(
            "{name:?} must be letters, digits, '-', '_' or '.', not starting with '.'"
        ));
    }
    if name.len() > MAX_SWEEP_NAME {
        return Err(format!(
            "{name:?} is {} characters long: at most {MAX_SWEEP_NAME}",
            name.len()
        ));
    }
    Ok(())
}

/// The product of the axes' lengths, overflow-checked, against [`MAX_CELLS`], before the grid
/// is built.
fn check_grid_size(axes: &[Vec<AxisValue>]) -> std::result::Result<(), String> {
    let lengths: Vec<usize> = axes.iter().map(Vec::len).filter(|&n| n > 0).collect();
    match lengths
        .iter()
        .try_fold(1usize, |n, &len| n.checked_mul(len))
    {
        Some(cells) if cells <= MAX_CELLS => Ok(()),
        cells => Err(format!(
            "the grid has {} cells (axes of {lengths:?} values): at most {MAX_CELLS}",
            cells.map_or("more than 2^64".to_string(), |n| n.to_string())
        )),
    }
}

/// Every cell has its own folder: a repeated axis value would make two cells share one, and a
/// setting's text could make a folder name leave the sweep's `out`.
fn check_cell_ids(cells: &[Cell]) -> std::result::Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    for cell in cells {
        check_folder_name(&cell.id).map_err(|why| format!("cell {why}"))?;
        if !seen.insert(&cell.id) {
            return Err(format!(
                "cell {} appears twice: an axis repeats a value, so two cells would share a folder",
                cell.id
            ));
        }
    }
    Ok(())
}

/// `text` as one shell word.
fn shell_quote(text: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "-_./=:+,".contains(c);
    if !text.is_empty() && text.chars().all(safe) {
        text.to_string()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

/// `trained` with `want`'s name, description, device and TensorBoard switch: what a run may
/// differ in and still be the run `want` trains ([`Sweep::finished_run`]).
fn placed_as(mut trained: Preset, want: &Preset) -> Preset {
    trained.name.clone_from(&want.name);
    trained.description.clone_from(&want.description);
    trained.train.device = want.train.device;
    trained.train.tensorboard = want.train.tensorboard;
    trained
}

/// Whether a run ended in a state the summary uses.
fn is_finished(status: RunStatus) -> bool {
    matches!(status, RunStatus::Completed | RunStatus::TargetReached)
}

/// The finished run folders directly inside `dir`, oldest first (folder names start with the time).
fn finished_runs_in(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut runs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| !crate::train::run_dir::is_hidden(p))
        .filter(|p| {
            RunDir::open(p)
                .and_then(|r| r.read_summary())
                .is_ok_and(|s| is_finished(s.status))
        })
        .collect();
    runs.sort();
    runs
}

/// What a running sweep reports.
#[derive(Clone, Debug)]
pub enum SweepEvent {
    /// What will train: `groups` of cell indices, `split` the machine between them, and by
    /// cell index each cell's estimated work (0 for cells not trained now), for an [`Eta`].
    Planned {
        groups: Vec<Vec<usize>>,
        split: Split,
        work: Vec<f64>,
    },
    /// The cell had a finished run already; it is not trained again.
    Skipped { cell: usize, run_dir: PathBuf },
    /// A group's cells start training as replicas of one model (a group of one: alone).
    GroupStarted { cells: Vec<usize> },
    /// A training event of cell `cell`.
    Train { cell: usize, event: TrainEvent },
}

/// How a sweep shares the machine: `workers` groups at once, each on a pool of `threads`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Split {
    pub workers: usize,
    pub threads: usize,
}

impl Split {
    /// `requested` workers (0: one per core, or one when the cells train on a GPU), at most one
    /// per group of work, the cores shared out between them. One thread per worker is what
    /// trains small models fastest on the CPU: on 2 cores, two groups of six MQAR cells on one
    /// thread each trained 1.3-1.5x more steps per second than one group on two threads
    /// (docs/performance.md, many small models). On a GPU a small model's step is bound by
    /// launching its kernels: the small Figure 1 sweep with a worker per core (16 on an H200
    /// machine, its groups of six split to feed them) took about 97 ms a step per group,
    /// evaluations included, where one group alone takes 6 ms; by the sweep's own estimates
    /// ~12 min in all against ~9 min one whole group at a time (docs/gpu.md).
    pub fn of(requested: usize, groups: usize, cores: usize, gpu: bool) -> Self {
        let cores = cores.max(1);
        let wanted = match requested {
            0 if gpu => 1,
            0 => cores,
            n => n,
        };
        let workers = wanted.min(groups).max(1);
        Self {
            workers,
            threads: (cores / workers).max(1),
        }
    }
}

/// The unfinished cells of `sweep` in groups of one shape (at most `sweep.replicas` each).
pub fn groups(sweep: &Sweep, cells: &[usize]) -> Result<Vec<Vec<usize>>> {
    let presets = cells
        .iter()
        .map(|&i| sweep.preset(&sweep.cells[i]))
        .collect::<Result<Vec<_>>>()?;
    Ok(crate::train::replicas::groups(&presets, sweep.replicas)
        .into_iter()
        .map(|group| group.into_iter().map(|i| cells[i]).collect())
        .collect())
}

/// Whether the sweep's cells train on a GPU ([`Split::of`] then keeps to one group at a time).
fn on_gpu(sweep: &Sweep) -> Result<bool> {
    match sweep.cells.first() {
        Some(cell) => Ok(sweep.preset(cell)?.train.device != crate::device::DeviceName::Cpu),
        None => Ok(false),
    }
}

/// `groups` with the largest halved until there are `workers` of them (or every group is one
/// cell), so no worker idles while another trains a large group: on 2 cores, six MQAR cells as
/// two groups of three on one thread each trained in 0.81-0.91x the time of one group of six
/// on two threads (docs/performance.md, many small models). Cell-by-cell equality makes the
/// split invisible in the results.
fn spread(mut groups: Vec<Vec<usize>>, workers: usize) -> Vec<Vec<usize>> {
    while groups.len() < workers {
        let Some(largest) = (0..groups.len()).max_by_key(|&i| (groups[i].len(), Reverse(i))) else {
            break;
        };
        if groups[largest].len() < 2 {
            break;
        }
        let half = groups[largest].len().div_ceil(2);
        let rest = groups[largest].split_off(half);
        groups.insert(largest + 1, rest);
    }
    groups
}

/// An estimate of the arithmetic a cell's training takes: steps × tokens per step × the
/// per-token cost of its layers (projections and MLP ~ 12·d², attention ~ 2·T·d). Only its
/// ratios matter: they order the groups ([`longest_first`]) and weigh the cells in an [`Eta`].
fn work(preset: &Preset) -> f64 {
    let task = &preset.task;
    let (t, d) = (task.seq_len() as f64, preset.model.d_model as f64);
    let steps = preset.train.total_steps(task.train_examples()) as f64;
    let tokens = steps * preset.train.batch_size as f64 * t;
    tokens * preset.model.n_layers as f64 * (12.0 * d * d + 2.0 * t * d)
}

/// By cell index, the estimated work of each cell in `groups` ([`work`]); 0 for the others.
fn cell_work(sweep: &Sweep, groups: &[Vec<usize>]) -> Result<Vec<f64>> {
    let mut by_cell = vec![0.0; sweep.cells.len()];
    for group in groups {
        let one = work(&sweep.preset(&sweep.cells[group[0]])?);
        for &cell in group {
            by_cell[cell] = one;
        }
    }
    Ok(by_cell)
}

/// `groups` with the most work first (a stable sort: equal groups keep their order), so the
/// longest group does not start last and leave the other workers idle at the sweep's end.
fn longest_first(groups: Vec<Vec<usize>>, work: &[f64]) -> Vec<Vec<usize>> {
    let mut costed: Vec<(f64, Vec<usize>)> = groups
        .into_iter()
        .map(|group| (group.iter().map(|&c| work[c]).sum(), group))
        .collect();
    costed.sort_by(|a, b| b.0.total_cmp(&a.0));
    costed.into_iter().map(|(_, group)| group).collect()
}

/// Trains every unfinished cell of `sweep`, in groups of replicas, `sweep.workers` groups at a
/// time, calling `emit` (on this thread) for every event. Stops starting groups when `stop` is
/// set (running cells stop at their next step and are trained again on resume). Returns the
/// summary of every finished cell.
pub fn run_sweep(
    sweep: &Sweep,
    stop: &AtomicBool,
    emit: &mut dyn FnMut(SweepEvent),
) -> Result<SweepSummary> {
    let mut todo = Vec::new();
    for (i, cell) in sweep.cells.iter().enumerate() {
        match sweep.finished_run(cell)? {
            Some(run_dir) => emit(SweepEvent::Skipped { cell: i, run_dir }),
            None => todo.push(i),
        }
    }
    let cores = crate::device::cpu_threads();
    let gpu = on_gpu(sweep)?;
    let todo = spread(
        groups(sweep, &todo)?,
        Split::of(sweep.workers, usize::MAX, cores, gpu).workers,
    );
    let work = cell_work(sweep, &todo)?;
    let todo = longest_first(todo, &work);
    let split = Split::of(sweep.workers, todo.len(), cores, gpu);
    emit(SweepEvent::Planned {
        groups: todo.clone(),
        split,
        work,
    });
    let next = AtomicUsize::new(0);
    let (sender, events) = mpsc::channel();
    let failures = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..split.workers)
            .map(|_| {
                let sender = sender.clone();
                let (next, todo) = (&next, &todo);
                scope.spawn(move || -> Vec<String> {
                    let pool = match rayon::ThreadPoolBuilder::new()
                        .num_threads(split.threads)
                        .build()
                    {
                        Ok(pool) => pool,
                        Err(e) => return vec![format!("cannot start a worker's threads: {e}")],
                    };
                    let mut failures = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let Some(group) = todo.get(next.fetch_add(1, Ordering::Relaxed)) else {
                            break;
                        };
                        failures.extend(pool.install(|| train_group(sweep, group, stop, &sender)));
                    }
                    failures
                })
            })
            .collect();
        drop(sender);
        for event in events {
            emit(event);
        }
        workers
            .into_iter()
            .flat_map(|w| {
                w.join().unwrap_or_else(|payload| {
                    vec![format!("a worker panicked: {}", panic_text(&*payload))]
                })
            })
            .collect::<Vec<_>>()
    });
    if !failures.is_empty() {
        return Err(Error::Failed(format!(
            "{} of the sweep's cells failed (finished cells are kept): {}",
            failures.len(),
            failures.join("; ")
        )));
    }
    collect(std::slice::from_ref(&sweep.out))
}

/// Trains the cells `group` as replicas of one model; returns what failed, a line per cell.
fn train_group(
    sweep: &Sweep,
    group: &[usize],
    stop: &AtomicBool,
    sender: &mpsc::Sender<SweepEvent>,
) -> Vec<String> {
    let failed =
        |cell: usize, e: &dyn std::fmt::Display| format!("cell {}: {e}", sweep.cells[cell].id);
    let mut members = Vec::new();
    for &cell in group {
        // Memory is checked here, on the machine that trains the cell (a sweep file may be
        // written for a larger one, like the paper's grid).
        match sweep
            .preset(&sweep.cells[cell])
            .and_then(|p| p.check_group_fits_here(group.len()).map(|_| p))
        {
            Ok(preset) => members.push((preset, sweep.cell_dir(&sweep.cells[cell]))),
            Err(e) => return group.iter().map(|&c| failed(c, &e)).collect(),
        }
    }
    // A closed channel only means nobody listens; the runs still save.
    let _ = sender.send(SweepEvent::GroupStarted {
        cells: group.to_vec(),
    });
    crate::train::run::run_group(&members, stop, &mut |r, event| {
        let _ = sender.send(SweepEvent::Train {
            cell: group[r],
            event,
        });
    })
    .into_iter()
    .zip(group)
    .filter_map(|(result, &cell)| result.err().map(|e| failed(cell, &e)))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn axes(text: &str) -> Vec<Vec<AxisValue>> {
        toml::from_str::<Axes>(text).unwrap().values().unwrap()
    }

    #[test]
    fn the_grid_is_the_product_of_the_axes() {
        let cells = grid(
            &axes(
                "mechanism = [\"softmax\", {kind = \"rebased\", variant = \"x2\"}]\n\
                 seq_len = [64, 128]\nnum_kv_pairs = [4, 8]\nseed = [0, 1, 2]",
            ),
            &["train.epochs=1".into()],
        );
        assert_eq!(cells.len(), 12);
        assert_eq!(cells[0].id, "softmax-L64-s0");
        assert_eq!(cells[11].id, "rebased_variant-x2-L128-s2");
        assert_eq!(
            cells[11].overrides,
            [
                "train.epochs=1",
                "attention=rebased",
                "attention.variant=x2",
                "task.seq_len=128",
                "task.num_kv_pairs=8",
                "train.seed=2"
            ]
        );
        assert_eq!(grid(&axes(""), &[])[0].id, "base");
    }

    #[test]
    fn mismatched_pairs_and_bad_mechanisms_name_the_key() {
        let err = toml::from_str::<Axes>("seq_len = [64]\nnum_kv_pairs = [4, 8]")
            .unwrap()
            .values()
            .err()
            .unwrap();
        assert_eq!(err.0, "axes.num_kv_pairs");
        let err = toml::from_str::<Axes>("mechanism = [3]")
            .unwrap()
            .values()
            .err()
            .unwrap();
        assert_eq!(err.0, "axes.mechanism");
    }

    /// Names that leave `runs/` or break a plan's command line, repeated cells and huge grids
    /// are refused before any preset is read.
    #[test]
    fn unsafe_names_duplicate_cells_and_huge_grids_are_refused() {
        for name in ["../../../../tmp/x", "a\nb", "", ".hidden", "a/b"] {
            assert!(check_folder_name(name).is_err(), "{name:?}");
        }
        assert!(check_folder_name(&"x".repeat(MAX_SWEEP_NAME + 1)).is_err());
        assert!(check_folder_name("fig1-small_2.b").is_ok());
        let err = check_cell_ids(&grid(&axes("seed = [0, 1, 0]"), &[])).unwrap_err();
        assert!(err.contains("cell s0 appears twice"), "{err}");
        let err = check_cell_ids(&grid(&axes("lr = [1e-3, 0.001]"), &[])).unwrap_err();
        assert!(err.contains("appears twice"), "{err}");
        let err = check_cell_ids(&grid(
            &axes("mechanism = [{ kind = \"based\", x = \"../../up\" }]"),
            &[],
        ))
        .unwrap_err();
        assert!(err.contains("cell \"based_x-../../up\""), "{err}");
        let seeds: Vec<String> = (0..1000).map(|s| s.to_string()).collect();
        let big = axes(&format!(
            "seed = [{0}]\nseq_len = [{0}]\nd_model = [{0}]",
            seeds.join(", ")
        ));
        let err = check_grid_size(&big).unwrap_err();
        assert!(err.contains("1000000000 cells"), "{err}");
        assert!(check_grid_size(&axes("seed = [0, 1]")).is_ok());
    }

    /// A decay axis over MQAR runs would have its runs taken for more seeds of an lr.
    #[test]
    fn a_decay_axis_is_for_mad_sweeps_only() {
        let dir = tempfile::tempdir().unwrap();
        let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("presets/mqar_softmax.toml");
        let path = dir.path().join("wd.toml");
        let text = format!("name = \"wd\"\nbase = {base:?}\n[axes]\nweight_decay = [0.0, 0.1]\n");
        std::fs::write(&path, text).unwrap();
        let err = Sweep::load(&path).unwrap_err().to_string();
        assert!(
            err.contains("axes.weight_decay") && err.contains("a mqar run"),
            "{err}"
        );
    }

    /// MAD's full grid: 66 task settings (each task's baseline and its `changes`, one key at a
    /// time) × 3 lrs × 2 decays, a group per setting; a cell's preset has its one change.
    #[test]
    fn the_mad_full_sweep_has_mads_66_settings() {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("sweeps/mad_full.toml");
        let sweep = Sweep::load(&file).unwrap();
        assert_eq!(sweep.cells.len(), 66 * 3 * 2);
        assert_eq!(sweep.all_groups().unwrap().len(), 66);
        let per_probe = |probe: &str| {
            let ids = sweep.cells.iter().filter(|c| c.id.starts_with(probe));
            ids.count() / 6
        };
        let counts = [
            ("in-context-recall", 11),
            ("noisy-in-context-recall", 14),
            ("fuzzy-in-context-recall", 11),
            ("selective-copying", 13),
            ("compression", 11),
            ("memorization", 6),
        ];
        for (probe, settings) in counts {
            assert_eq!(per_probe(probe), settings, "{probe}");
        }
        let cell = sweep
            .cells
            .iter()
            .find(|c| c.id == "noisy-in-context-recall_frac_noise-0.6-lr0.001-wd0")
            .unwrap();
        let preset = sweep.preset(cell).unwrap();
        let crate::tasks::TaskSpec::Mad(task) = &preset.task else {
            panic!("a MAD task")
        };
        let resolved = task.resolved();
        assert_eq!((resolved.frac_noise, resolved.vocab_size), (0.6, 32));
    }

    /// A task entry sets task settings: not the task's kind, not nothing, and not beside a
    /// probe axis that would set the probe twice.
    #[test]
    fn task_axis_entries_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("presets/mad_in_context_recall.toml");
        let path = dir.path().join("task.toml");
        for (axes, named) in [
            ("task = [{}]", "axes.task"),
            ("task = [{ kind = \"mqar\" }]", "axes.task"),
            (
                "probe = [\"compression\"]\ntask = [{ probe = \"memorization\" }]",
                "axes.probe",
            ),
        ] {
            let text = format!("name = \"t\"\nbase = {base:?}\n[axes]\n{axes}\n");
            std::fs::write(&path, text).unwrap();
            let err = Sweep::load(&path).unwrap_err().to_string();
            assert!(err.contains(named), "{axes}: {err}");
        }
    }

    /// An empty file, or one of comments only, said only "cannot read preset …: missing
    /// field `name`"; a sweep file missing a key is called a sweep file.
    #[test]
    fn an_empty_sweep_file_says_what_a_sweep_needs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("empty.toml");
        for text in ["\n  \n", "# a sweep\n  # to come\n"] {
            std::fs::write(&path, text).unwrap();
            let err = Sweep::load(&path).unwrap_err().to_string();
            assert!(
                err.contains("the file is empty") && err.contains("`base`"),
                "{text:?}: {err}"
            );
            assert!(err.contains("empty.toml"), "{err}");
        }
        std::fs::write(&path, "name = \"s\"\n").unwrap();
        let err = Sweep::load(&path).unwrap_err().to_string();
        assert!(err.starts_with("cannot read sweep file"), "{err}");
    }

    #[test]
    fn the_machine_is_split_between_workers_and_threads() {
        // (requested workers, groups, cores, on a GPU) → (workers, threads each)
        for (asked, groups, cores, gpu, want) in [
            (0, 12, 16, false, (12, 1)),
            (0, 12, 2, false, (2, 1)),
            (0, 1, 2, false, (1, 2)),
            (0, 3, 16, false, (3, 5)),
            (4, 12, 16, false, (4, 4)),
            (32, 12, 16, false, (12, 1)),
            (0, 0, 1, false, (1, 1)),
            (0, 12, 16, true, (1, 16)),
            (4, 12, 16, true, (4, 4)),
        ] {
            let split = Split::of(asked, groups, cores, gpu);
            assert_eq!(
                (split.workers, split.threads),
                want,
                "{asked} {groups} {cores}"
            );
        }
    }

    #[test]
    fn the_groups_with_most_work_start_first() {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("sweeps/mqar_fig1_small.toml");
        let sweep = Sweep::load(&file).unwrap();
        let all: Vec<usize> = (0..sweep.cells.len()).collect();
        let grouped = groups(&sweep, &all).unwrap();
        let by_cell = cell_work(&sweep, &grouped).unwrap();
        let ordered = longest_first(grouped, &by_cell);
        let work_of = |group: &Vec<usize>| {
            work(&sweep.preset(&sweep.cells[group[0]]).unwrap()) * group.len() as f64
        };
        let costs: Vec<f64> = ordered.iter().map(work_of).collect();
        assert!(costs.windows(2).all(|w| w[0] >= w[1]), "{costs:?}");
        let first = &sweep.cells[ordered[0][0]].id;
        assert!(first.contains("L128-d64"), "{first}");
        assert_eq!(ordered.concat().len(), all.len());
    }

    /// MAD-lite: each probe's baseline × 3 lrs × 2 decays, a group of replicas per probe, every
    /// cell on MAD's protocol with the probe its id names.
    #[test]
    fn the_mad_lite_sweep_trains_each_probe_as_one_group() {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("sweeps/mad_lite.toml");
        let sweep = Sweep::load(&file).unwrap();
        assert_eq!(sweep.cells.len(), 6 * 3 * 2);
        let groups = sweep.all_groups().unwrap();
        assert_eq!(groups.len(), 6);
        assert!(groups.iter().all(|g| g.len() == 6), "{groups:?}");
        let cell = &sweep.cells[7];
        assert_eq!(cell.id, "noisy-in-context-recall-lr0.0001-wd0.1");
        let preset = sweep.preset(cell).unwrap();
        let crate::tasks::TaskSpec::Mad(task) = &preset.task else {
            panic!("a MAD task")
        };
        assert_eq!(task.probe.name(), "noisy-in-context-recall");
        assert_eq!(preset.train.weight_decay, 0.1);
        assert_eq!(preset.train.metric, crate::preset::Metric::Macro);
        assert_eq!(preset.model.layout, crate::model::Layout::Mad);
    }

    /// The quick MAD-lite trains six of MAD-lite's cells into MAD-lite's folder with the same
    /// presets, so that the whole sweep, run later, takes them as done.
    #[test]
    fn the_quick_mad_lite_cells_are_mad_lite_cells() {
        let sweeps = Path::new(env!("CARGO_MANIFEST_DIR")).join("sweeps");
        let full = Sweep::load(&sweeps.join("mad_lite.toml")).unwrap();
        let quick = Sweep::load(&sweeps.join("mad_lite_quick.toml")).unwrap();
        assert_eq!(quick.out, full.out);
        assert_eq!(quick.cells.len(), 6);
        for cell in &quick.cells {
            assert!(cell.id.ends_with("-lr0.001-wd0.1"), "{}", cell.id);
            let twin = full.cells.iter().find(|c| c.id == cell.id).unwrap();
            let (mine, theirs) = (quick.preset(cell).unwrap(), full.preset(twin).unwrap());
            let changed = crate::preset::changed_settings(&theirs, &placed_as(mine, &theirs));
            assert_eq!(changed.unwrap(), Vec::<String>::new(), "{}", cell.id);
        }
    }

    #[test]
    fn groups_are_halved_until_every_worker_has_one() {
        let group = |cells: std::ops::Range<usize>| cells.collect::<Vec<_>>();
        assert_eq!(spread(vec![group(0..6)], 2), [group(0..3), group(3..6)]);
        assert_eq!(
            spread(vec![group(0..6), group(6..8)], 4),
            [group(0..2), group(2..3), group(3..6), group(6..8)]
        );
        assert_eq!(spread(vec![group(0..2)], 16), [group(0..1), group(1..2)]);
        assert_eq!(spread(vec![group(0..6), group(6..12)], 2).len(), 2);
        assert!(spread(Vec::new(), 4).is_empty());
    }

    #[test]
    fn shell_words_are_quoted_when_needed() {
        assert_eq!(shell_quote("train.lr=0.001"), "train.lr=0.001");
        assert_eq!(
            shell_quote("attention={ kind = \"based\" }"),
            "'attention={ kind = \"based\" }'"
        );
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
