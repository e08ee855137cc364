//! The one list of tasks, as `attention/catalogue.rs` is the mechanisms'. Each task's file
//! states everything about it: its config (its `[task]` settings), its [`TaskFacts`] (name,
//! summary, paper, whether it needs a causal model) and how it makes its data, as an
//! implementation of [`Task`]. The list below turns those files into [`TaskSpec`] (the preset
//! section), [`TASKS`] (what the editor's picker, `attnlab tasks` and the tests read) and the
//! dispatch of every [`Task`] method. A new task is its file, its `mod` line and one line here.

use serde::{Deserialize, Serialize};

use super::lm::LmConfig;
use super::mad::MadConfig;
use super::mqar::MqarConfig;
use super::{Dataset, Row, Split};
use crate::{Error, Result};

/// [`Task`]'s four sizes for a config that holds them as fields of the same names.
macro_rules! sizes_from_fields {
    () => {
        fn vocab_size(&self) -> usize {
            self.vocab_size
        }

        fn seq_len(&self) -> usize {
            self.seq_len
        }

        fn train_examples(&self) -> usize {
            self.train_examples
        }

        fn test_examples(&self) -> usize {
            self.test_examples
        }
    };
}
pub(super) use sizes_from_fields;

/// Writes [`TaskSpec`], [`TASKS`] and the dispatch of [`Task`] from the list of tasks and
/// their configs.
macro_rules! tasks {
    ($($(#[$doc:meta])* $variant:ident($config:ty),)+) => {
        /// The `[task]` section of a preset: `kind` names the task, the other keys are its
        /// config's.
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
        pub enum TaskSpec {
            $($(#[$doc])* $variant($config),)+
        }

        /// Every task, in the order pickers list them.
        pub static TASKS: [&TaskFacts; [$(stringify!($variant)),+].len()] =
            [$(<$config as Listed>::FACTS),+];

        impl TaskSpec {
            /// This task's entry of [`TASKS`].
            pub fn facts(&self) -> &'static TaskFacts {
                match self {
                    $(Self::$variant(_) => <$config as Listed>::FACTS,)+
                }
            }

            /// The task's config, through what every task states.
            fn task(&self) -> &dyn Task {
                match self {
                    $(Self::$variant(c) => c,)+
                }
            }
        }
    };
}

tasks! {
    /// Multi-query associative recall (zoology's `multiquery_ar`).
    Mqar(MqarConfig),
    /// Next-token language modelling on a text corpus.
    Lm(LmConfig),
    /// One of MAD's six synthetic probes (Poli et al. 2024).
    Mad(MadConfig),
}

impl Default for TaskSpec {
    fn default() -> Self {
        Self::Mqar(MqarConfig::default())
    }
}

/// What there is to know about one task, apart from its data.
#[derive(Debug)]
pub struct TaskFacts {
    /// The name used in presets (`kind`), the CLI and the GUI.
    pub name: &'static str,
    /// What it asks of a model, in a line.
    pub summary: &'static str,
    /// Where it comes from.
    pub paper: &'static str,
    /// Whether a position's target may be seen by a non-causal mixer (the next token, the data
    /// to copy): such a task refuses mechanisms that mix later tokens in.
    pub needs_causal: bool,
    /// The task with its default settings.
    pub default: fn() -> TaskSpec,
}

/// A task's catalogue entry (apart from [`Task`] so that `&dyn Task` can dispatch).
pub trait Listed {
    const FACTS: &'static TaskFacts;
}

/// What a task's config states about it: the rest of attnlab reaches a task only through
/// these (and its data), dispatched by the list above.
pub trait Task {
    fn vocab_size(&self) -> usize;

    /// Length of the rows the model is trained on.
    fn seq_len(&self) -> usize;

    fn train_examples(&self) -> usize;

    fn test_examples(&self) -> usize;

    /// Checks its own fields; errors name the preset key (`task.…`).
    fn validate(&self) -> Result<()>;

    /// The training and test datasets.
    fn datasets(&self) -> Result<(Dataset, Dataset)>;

    /// Whether its inputs exist on this machine (a corpus, a data folder), which training
    /// reads only when it starts; `attnlab check` asks here first.
    fn check_inputs_here(&self) -> Result<()> {
        Ok(())
    }

    /// Whether every position is scored against its own input token (MAD's compression),
    /// which a causal language model copies: the model must decode the row from a pooled
    /// state (`model.head = "autoencoder"`, what `auto` picks for it).
    fn scores_its_inputs(&self) -> bool {
        false
    }

    /// The task as a sentence names it, where its name says too little ("MAD's compression").
    fn title(&self) -> Option<String> {
        None
    }

    /// The most positions of a training row that are scored (a step's logits are kept there
    /// only): every position unless the task says otherwise.
    fn scored_per_row(&self) -> usize {
        self.seq_len()
    }

    /// Bytes its datasets hold beyond each row's token ids and labels (ground truth, the
    /// text a language model's rows are cut from), for the memory estimate.
    fn extra_data_bytes(&self) -> f64 {
        0.0
    }

    /// How many positions from the start of a test row hold what its scored queries read
    /// (MQAR's context of pairs; a MAD recall probe's whole row), or `None` for a task
    /// without a ground truth: IoU, spectra and the views' examples need one.
    fn truth_context(&self) -> Option<usize> {
        None
    }

    /// The first `n` rows of `split` (fewer if it holds fewer), each with where its scored
    /// queries should read if the task has a [`Self::truth_context`]: what `attnlab data`
    /// prints and the views' examples are. Every task has them from its datasets; a task that
    /// can make a few rows without making them all says how.
    fn rows(&self, split: Split, n: usize) -> Result<Vec<Row>> {
        let (train, test) = self.datasets()?;
        Ok(match split {
            Split::Train => train,
            Split::Test => test,
        }
        .first_rows(n))
    }
}

impl TaskSpec {
    pub fn name(&self) -> &'static str {
        self.facts().name
    }

    pub fn vocab_size(&self) -> usize {
        self.task().vocab_size()
    }

    /// Length of the rows the model is trained on.
    pub fn seq_len(&self) -> usize {
        self.task().seq_len()
    }

    pub fn train_examples(&self) -> usize {
        self.task().train_examples()
    }

    pub fn test_examples(&self) -> usize {
        self.task().test_examples()
    }

    /// [`Task::check_inputs_here`].
    pub fn check_inputs_here(&self) -> Result<()> {
        self.task().check_inputs_here()
    }

    /// [`Task::scores_its_inputs`].
    pub fn scores_its_inputs(&self) -> bool {
        self.task().scores_its_inputs()
    }

    /// The task as a sentence names it ([`Task::title`]), else its name.
    pub fn title(&self) -> String {
        self.task().title().unwrap_or_else(|| self.name().into())
    }

    /// [`Task::scored_per_row`].
    pub fn scored_per_row(&self) -> usize {
        self.task().scored_per_row()
    }

    /// [`Task::extra_data_bytes`].
    pub fn extra_data_bytes(&self) -> f64 {
        self.task().extra_data_bytes()
    }

    /// [`Task::truth_context`].
    pub fn truth_context(&self) -> Option<usize> {
        self.task().truth_context()
    }

    /// Why the analyses that read a task's ground truth (IoU, spectra, the views' examples)
    /// cannot run on it, if they cannot: the window disables their buttons with it.
    pub fn lacks_ground_truth(&self) -> Option<String> {
        self.truth_context().is_none().then(|| {
            format!(
                "this analysis needs a task with a ground truth (MQAR; MAD's in-context, noisy \
                 recall or selective copying), but the run's task is {}",
                self.title()
            )
        })
    }

    /// The first `n` rows of `split` ([`Task::rows`]).
    pub fn rows(&self, split: Split, n: usize) -> Result<Vec<Row>> {
        self.task().rows(split, n)
    }

    /// The first `n` test rows with their ground truth; an error saying why for a task
    /// without one.
    pub fn truth_examples(&self, n: usize) -> Result<Vec<Row>> {
        match self.lacks_ground_truth() {
            Some(why) => Err(Error::Data(why)),
            None => self.rows(Split::Test, n),
        }
    }

    /// Whether a position may not look at later positions ([`TaskFacts::needs_causal`]).
    pub fn requires_causal(&self) -> bool {
        self.facts().needs_causal
    }

    /// Checks the task's own fields; errors name the preset key (`task.…`).
    pub fn validate(&self) -> Result<()> {
        self.task().validate()
    }

    /// The training and test datasets.
    pub fn datasets(&self) -> Result<(Dataset, Dataset)> {
        self.task().datasets()
    }

    /// The MQAR settings, when this is the MQAR task.
    pub fn mqar(&self) -> Option<&MqarConfig> {
        match self {
            Self::Mqar(c) => Some(c),
            _ => None,
        }
    }

    /// Token `id` as a reader should see it in the views: an LM's byte or character as its
    /// character ([`super::lm::Tokens::label`], with a character LM's `characters`), any
    /// other id as its number.
    pub fn token_label(&self, id: u32, characters: Option<&[char]>) -> String {
        match self.lm() {
            Some(lm) => lm.tokens.label(id, characters),
            None => id.to_string(),
        }
    }

    /// The language-modelling settings, when this is the LM task.
    pub fn lm(&self) -> Option<&LmConfig> {
        match self {
            Self::Lm(c) => Some(c),
            _ => None,
        }
    }

    /// Every task with its default settings, in [`TASKS`]' order.
    pub fn all_defaults() -> Vec<Self> {
        TASKS.iter().map(|facts| (facts.default)()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each entry's default finds its way back to its entry, names are unique and are the
    /// `kind` presets write, texts are not empty, and each default validates.
    #[test]
    fn every_task_is_the_facts_of_its_own_default() {
        let mut names = std::collections::BTreeSet::new();
        for &facts in &TASKS {
            let spec = (facts.default)();
            assert!(std::ptr::eq(spec.facts(), facts), "{}", facts.name);
            assert!(names.insert(facts.name), "{} twice", facts.name);
            assert!(!facts.summary.is_empty() && !facts.paper.is_empty());
            let table = toml::Table::try_from(&spec).unwrap();
            assert_eq!(table["kind"].as_str(), Some(facts.name));
            spec.validate().unwrap();
        }
        assert_eq!(names.len(), 3);
    }

    /// A task's rows (what `attnlab data` prints, the views' examples) are the first rows of
    /// its datasets, ground truth included, in both splits, whether the task makes them
    /// itself (MQAR, MAD) or takes them from its datasets (language modelling).
    #[test]
    fn every_task_s_rows_are_the_first_rows_of_its_datasets() {
        for spec in TaskSpec::all_defaults() {
            let spec = match spec {
                TaskSpec::Lm(c) => TaskSpec::Lm(LmConfig {
                    corpus: "generated".into(),
                    train_bytes: 1000,
                    valid_bytes: 400,
                    train_examples: 10,
                    test_examples: 4,
                    ..c
                }),
                spec => spec,
            };
            let (train, test) = spec.datasets().unwrap();
            for (split, data) in [(Split::Train, &train), (Split::Test, &test)] {
                let rows = spec.rows(split, 3).unwrap();
                assert_eq!(rows.len(), 3, "{}", spec.name());
                assert_eq!(rows, data.first_rows(3), "{} {split:?}", spec.name());
            }
        }
        let test = TaskSpec::default().rows(Split::Test, 2).unwrap();
        assert!(
            test.iter().all(|row| !row.queries.is_empty()),
            "MQAR's truth"
        );
    }
}
