//! Training: optimiser, the step loop, run folders and the worker thread (its configuration,
//! [`TrainConfig`], is a section of the preset).
//!
//! Layering: [`Trainer`] is the pure loop (no threads, no files); [`run::run`] drives it and
//! writes the run folder (and, through [`board`], its TensorBoard event file) while emitting
//! [`TrainEvent`]s; [`worker::spawn`] puts that on a
//! thread with a channel and a stop flag, for the CLI today and the GUI tomorrow.

pub mod board;
pub mod events;
pub mod figures;
pub mod loaded;
pub mod optim;
pub mod replicas;
pub mod run;
pub mod run_dir;
pub mod trainer;
pub mod worker;

pub use crate::preset::{Metric, Schedule, TrainConfig};
pub use events::{EvalRecord, MetricRecord, RunStatus, StepRecord, Summary, TrainEvent};
pub use loaded::{LoadedRun, Opening};
pub use optim::AdamW;
pub use run_dir::RunDir;
pub use trainer::{ReplicaStep, Trainer, evaluate};
pub use worker::{
    PRIORITY_VARIABLE, Priority, TrainHandle, background_priority_is_low, lower_thread_priority,
    spawn, spawn_resume, spawn_with,
};
