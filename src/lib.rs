//! attnlab: train small models with a chosen attention mechanism and positional encoding,
//! and see what they learned.
//!
//! Modules, in layering order (a module uses only those above it):
//! - [`settings`]: the settings of a preset section as data, read and written by key;
//! - [`encodings`], [`attention`]: where position enters, and how scores become weights;
//! - [`model`]: the transformer that composes them;
//! - [`tasks`]: what the model learns (MQAR, language modelling on a text corpus);
//! - [`tensorboard`]: event files that TensorBoard reads, a second sink of every run;
//! - [`train`]: the loop, the run folders and the worker thread;
//! - [`preset`]: the experiment file that ties it together;
//! - [`analysis`], [`extrapolation`], [`figures`]: the encoding analyses, perplexity against
//!   length, and figures rendered without a GPU;
//! - [`sweep`]: grids of runs (resumable, spreadable over machines) and their summary;
//! - [`experiments`]: the shipped presets (compiled in) and the experiments they reproduce;
//! - `app`: the desktop workbench (the only module that uses egui; the `gui` feature, on by
//!   default);
//! - [`cli`]: the headless command line.
//!
//! # Failure handling
//! The library returns [`Error`] and never panics on user input: presets are validated before
//! any work, with messages that name the key; training errors end the run with a `Failed`
//! event and a `failed` summary, keeping everything saved so far. Files are written
//! atomically (temp file + rename).

pub mod analysis;
#[cfg(feature = "gui")]
pub mod app;
pub mod attention;
pub mod checkpoint;
pub mod cli;
pub mod device;
pub mod encodings;
mod error;
pub mod experiments;
pub mod extrapolation;
pub mod figures;
pub mod io;
pub mod memory;
pub mod model;
pub mod ops;
pub mod params;
pub mod preset;
pub mod report;
pub mod rng;
pub mod settings;
pub mod sweep;
pub mod tasks;
pub mod tensorboard;
pub mod train;

pub use error::{Error, Result};
pub use preset::Preset;
