//! A whole training run: drives a [`Trainer`], writes the run folder, emits events; or goes on
//! with a stopped or crashed one from its checkpoint ([`resume`]). A group of replicas
//! ([`run_group`]) is driven the same way, each replica into its own run folder with its own
//! events, as if it trained alone.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use candle_core::Tensor;

use super::board::Board;
use super::run_dir::{AttentionExample, AttentionIndex, AttentionLayerFile};
use super::trainer::{EvalStats, ReplicaStep, StepStats};
use super::{
    EvalRecord, MetricRecord, RunDir, RunStatus, StepRecord, Summary, TrainEvent, Trainer,
};
use crate::preset::Preset;
use crate::tasks::truth::{Crop, Target};
use crate::{Error, Result};

/// Training time after which a checkpoint is saved even without an evaluation (evaluations
/// can be an epoch apart): a killed run loses at most this much training and resumes from
/// there ([`resume`]). Saving a small model takes milliseconds, so a minute costs nothing.
pub const CHECKPOINT_EVERY: Duration = Duration::from_secs(60);

/// Trains `preset` into a new folder under `runs_root`, calling `emit` for every event, until
/// the planned steps are done, the target accuracy is reached, or `stop` is set (checked every
/// step). Returns the final summary; on error, `Failed` has been emitted and what was saved stays.
pub fn run(
    preset: &Preset,
    runs_root: &Path,
    stop: &AtomicBool,
    emit: &mut dyn FnMut(TrainEvent),
) -> Result<Summary> {
    run_every(preset, runs_root, CHECKPOINT_EVERY, stop, emit)
}

/// [`run`] with a checkpoint after every `checkpoint_every` of training (instead of
/// [`CHECKPOINT_EVERY`]): a test saves one at every step.
pub fn run_every(
    preset: &Preset,
    runs_root: &Path,
    checkpoint_every: Duration,
    stop: &AtomicBool,
    emit: &mut dyn FnMut(TrainEvent),
) -> Result<Summary> {
    let member = (preset.clone(), runs_root.to_path_buf());
    let members = std::slice::from_ref(&member);
    let mut results = run_group_every(members, checkpoint_every, stop, &mut |_, e| emit(e));
    results.swap_remove(0)
}

/// Continues the stopped, crashed or failed run in folder `run_dir` from its last checkpoint,
/// exactly as it would have gone on (weights, optimiser state, learning rate, data order,
/// dropout), in the same folder: the lines of `metrics.jsonl` after the checkpoint are
/// dropped, as they are trained again. A run that ended (completed, target reached) is
/// refused. Events and result as for [`run`].
pub fn resume(
    run_dir: &Path,
    stop: &AtomicBool,
    emit: &mut dyn FnMut(TrainEvent),
) -> Result<Summary> {
    let (mut trainer, member) = match reopen(run_dir) {
        Ok(reopened) => reopened,
        Err(error) => {
            emit(failed_event(&error, None));
            return Err(error);
        }
    };
    let preset = trainer.preset().clone();
    emit(started_event(&trainer, &preset, &member));
    let mut clock = Clock::new(member.summary.elapsed_secs, CHECKPOINT_EVERY);
    drive(&mut trainer, vec![member], &mut clock, stop, &mut |_, e| {
        emit(e)
    })
    .swap_remove(0)
}

/// Opens run folder `path` to go on training: a trainer restored from its checkpoint, its
/// metrics after the checkpoint dropped and its summary "running" again.
fn reopen(path: &Path) -> Result<(Trainer, Member)> {
    let dir = RunDir::open(path)?;
    let mut summary = dir.read_summary()?;
    if matches!(
        summary.status,
        RunStatus::Completed | RunStatus::TargetReached
    ) {
        return Err(Error::RunDir {
            message: format!(
                "cannot resume: the run has already ended ({}); train its preset again for a new run",
                summary.status.describe()
            ),
            path: path.to_path_buf(),
        });
    }
    dir.check_resumable_checkpoint()?;
    let preset = dir.read_preset()?;
    preset.validate()?;
    // `corpus = "auto"` (or a path) may name other text here than where the run trained.
    let resolved = preset
        .task
        .lm()
        .map(|lm| lm.corpus_description())
        .transpose()?;
    if let (Some(trained), Some(now)) = (&summary.corpus, &resolved)
        && trained != now
    {
        return Err(Error::RunDir {
            message: format!(
                "cannot resume: the run trained on {trained}, and its task.corpus names {now} \
                 here; set task.corpus in its preset.toml to the text it trained on"
            ),
            path: path.to_path_buf(),
        });
    }
    let mut trainer = Trainer::new(&preset)?;
    trainer.restore(&dir.checkpoint_path(), &dir.optimizer_path())?;
    let step = trainer.step();
    dir.truncate_metrics(step)?;
    summary.status = RunStatus::Running;
    summary.error = None;
    // A replica of a group goes on alone: a replica trains as it would alone (up to the
    // rounding in which a group and a lone run differ).
    summary.replicas = None;
    summary.steps = step;
    summary.epoch = trainer.epoch();
    dir.write_summary(&summary)?;
    let board = Board::resume(dir.path(), &preset, step)?;
    let member = Member {
        dir,
        summary,
        checkpoint_step: Some(step),
        result: None,
        board,
    };
    Ok((trainer, member))
}

/// Trains `members` (presets of one shape, see [`super::replicas`], each with the folder its
/// run folder goes under) as replicas of one batched model. Each replica gets the events, the
/// run folder and the result [`run`] would give it alone (`emit` gets its index); one that
/// reaches its target or diverges is frozen and finished while the others train on.
pub fn run_group(
    members: &[(Preset, PathBuf)],
    stop: &AtomicBool,
    emit: &mut dyn FnMut(usize, TrainEvent),
) -> Vec<Result<Summary>> {
    run_group_every(members, CHECKPOINT_EVERY, stop, emit)
}

/// [`run_group`] with checkpoints every `checkpoint_every` of training.
fn run_group_every(
    members: &[(Preset, PathBuf)],
    checkpoint_every: Duration,
    stop: &AtomicBool,
    emit: &mut dyn FnMut(usize, TrainEvent),
) -> Vec<Result<Summary>> {
    let mut results: Vec<Option<Result<Summary>>> = (0..members.len()).map(|_| None).collect();
    let mut valid = Vec::new();
    for (i, (preset, _)) in members.iter().enumerate() {
        match preset.validate() {
            Ok(()) => valid.push(i),
            Err(error) => {
                emit(i, failed_event(&error, None));
                results[i] = Some(Err(error));
            }
        }
    }
    if !valid.is_empty() {
        let group: Vec<(Preset, PathBuf)> = valid.iter().map(|&i| members[i].clone()).collect();
        let trained = train_group(&group, checkpoint_every, stop, &mut |r, event| {
            emit(valid[r], event)
        });
        for (result, &i) in trained.into_iter().zip(&valid) {
            results[i] = Some(result);
        }
    }
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(Error::Internal("the run did not start".into()))))
        .collect()
}

/// A replica's run between steps: its folder, its summary and what is done with it.
struct Member {
    dir: RunDir,
    summary: Summary,
    /// The step of its last checkpoint (every one written is finite), if it has one.
    checkpoint_step: Option<usize>,
    /// Its result once it has ended (finished, stopped or failed).
    result: Option<Result<Summary>>,
    /// Its TensorBoard event file, unless the preset turns it off.
    board: Option<Board>,
}

/// The group's clock and throughput, shared by its replicas, and when they were last saved.
struct Clock {
    started: Instant,
    tokens: usize,
    training_secs: f64,
    /// Training seconds between time-based checkpoints ([`CHECKPOINT_EVERY`]).
    checkpoint_every: f64,
    /// `training_secs` at the last checkpoint.
    checkpointed_secs: f64,
}

impl Clock {
    /// A clock that has run `elapsed` seconds already (a resumed run's).
    fn new(elapsed: f64, checkpoint_every: Duration) -> Self {
        let now = Instant::now();
        let started = Duration::try_from_secs_f64(elapsed)
            .ok()
            .and_then(|d| now.checked_sub(d));
        Self {
            started: started.unwrap_or(now),
            tokens: 0,
            training_secs: 0.0,
            checkpoint_every: checkpoint_every.as_secs_f64(),
            checkpointed_secs: 0.0,
        }
    }

    /// Whether enough training has passed since the last checkpoint to save one.
    fn checkpoint_due(&self) -> bool {
        self.training_secs - self.checkpointed_secs >= self.checkpoint_every
    }
}

/// [`run_group`] for validated presets.
fn train_group(
    group: &[(Preset, PathBuf)],
    checkpoint_every: Duration,
    stop: &AtomicBool,
    emit: &mut dyn FnMut(usize, TrainEvent),
) -> Vec<Result<Summary>> {
    let presets: Vec<Preset> = group.iter().map(|(p, _)| p.clone()).collect();
    let trainer = match Trainer::group(&presets) {
        Ok(trainer) => trainer,
        // Most often the parameters not fitting on the device: say what the group needs.
        Err(error) => {
            let error = with_memory_estimate(error, presets.first(), presets.len());
            return fail_all(group.len(), error, emit);
        }
    };
    let roots: Vec<PathBuf> = group.iter().map(|(_, root)| root.clone()).collect();
    train_built(trainer, &roots, checkpoint_every, stop, emit)
}

/// Drives `trainer`, built from a preset by the caller, as [`run`] drives the one it builds,
/// into a new folder under `runs_root`. The caller may have changed the trainer since: the
/// tests poison its parameters (through its [`Trainer::params`]) to see how a divergence ends
/// a run, which no valid preset does in a few steps.
pub fn run_trainer(
    trainer: Trainer,
    runs_root: &Path,
    stop: &AtomicBool,
    emit: &mut dyn FnMut(TrainEvent),
) -> Result<Summary> {
    if trainer.replicas() != 1 {
        return Err(Error::Internal(format!(
            "run_trainer drives one model; this trainer holds {} replicas (use run_group)",
            trainer.replicas()
        )));
    }
    let roots = [runs_root.to_path_buf()];
    let mut results = train_built(trainer, &roots, CHECKPOINT_EVERY, stop, &mut |_, e| emit(e));
    results.swap_remove(0)
}

/// Trains the replicas of `trainer`, replica r into a new folder under `roots[r]`.
fn train_built(
    mut trainer: Trainer,
    roots: &[PathBuf],
    checkpoint_every: Duration,
    stop: &AtomicBool,
    emit: &mut dyn FnMut(usize, TrainEvent),
) -> Vec<Result<Summary>> {
    let mut clock = Clock::new(0.0, checkpoint_every);
    let mut members = Vec::new();
    for (r, root) in roots.iter().enumerate() {
        match start_member(&trainer, r, root) {
            Ok(member) => {
                emit(
                    r,
                    started_event(&trainer, trainer.replica_preset(r), &member),
                );
                members.push(member);
            }
            Err(error) => {
                // A folder that cannot be written fails the group before any step: the
                // folders made so far say so, the replicas without one fail as they start.
                let message = error.to_string();
                let mut results: Vec<Result<Summary>> = Vec::new();
                for (started, member) in members.iter_mut().enumerate() {
                    fail(
                        member,
                        started,
                        &clock,
                        Error::Failed(message.clone()),
                        emit,
                    );
                    results.extend(member.result.take());
                }
                let rest = fail_all(roots.len() - r, error, &mut |i, e| emit(r + i, e));
                results.extend(rest);
                return results;
            }
        }
    }
    drive(&mut trainer, members, &mut clock, stop, emit)
}

/// Trains started `members` to their ends ([`train_members`]); an error there fails those
/// still training. Returns each one's result.
fn drive(
    trainer: &mut Trainer,
    mut members: Vec<Member>,
    clock: &mut Clock,
    stop: &AtomicBool,
    emit: &mut dyn FnMut(usize, TrainEvent),
) -> Vec<Result<Summary>> {
    if let Err(error) = train_members(trainer, &mut members, clock, stop, emit) {
        // The first replica still training gets the error itself, the others its message.
        let message = error.to_string();
        let mut error = Some(error);
        for (r, member) in members.iter_mut().enumerate() {
            if member.result.is_none() {
                let error = error
                    .take()
                    .unwrap_or_else(|| Error::Failed(message.clone()));
                fail(member, r, clock, error, emit);
            }
        }
    }
    // The product switches are one per process: an analysis or run after this one computes
    // exactly unless it asks otherwise.
    crate::device::use_precision(trainer.device(), crate::ops::Precision::F32);
    members
        .into_iter()
        .map(|m| {
            m.result
                .unwrap_or_else(|| Err(Error::Internal("the run did not end".into())))
        })
        .collect()
}

/// Creates replica `r`'s run folder with its preset and first summary.
fn start_member(trainer: &Trainer, r: usize, root: &Path) -> Result<Member> {
    let preset = trainer.replica_preset(r);
    let summary = initial_summary(trainer, r);
    let dir = RunDir::create(root, preset, |dir| {
        dir.write_preset(preset)?;
        dir.write_summary(&summary)
    })?;
    let board = Board::start(dir.path(), preset)?;
    Ok(Member {
        dir,
        summary,
        checkpoint_step: None,
        result: None,
        board,
    })
}

fn started_event(trainer: &Trainer, preset: &Preset, member: &Member) -> TrainEvent {
    TrainEvent::Started {
        run_dir: member.dir.path().to_path_buf(),
        total_steps: trainer.total_steps(),
        steps_per_epoch: trainer.steps_per_epoch(),
        n_params: trainer.params().count(),
        device_notice: trainer.device_notice().map(str::to_string),
        precision_note: crate::device::precision_note(trainer.device(), preset.train.precision),
        corpus: member.summary.corpus.clone(),
    }
}

/// The step loop: until every replica has ended or `stop` is set. An error here (not a
/// replica's own divergence) ends the replicas still training.
fn train_members(
    trainer: &mut Trainer,
    members: &mut [Member],
    clock: &mut Clock,
    stop: &AtomicBool,
    emit: &mut dyn FnMut(usize, TrainEvent),
) -> Result<()> {
    let eval_interval = trainer
        .preset()
        .train
        .eval_interval(trainer.preset().task.train_examples());
    while members.iter().any(|m| m.result.is_none()) {
        if trainer.step() >= trainer.total_steps() {
            return finish_active(trainer, members, clock, RunStatus::Completed, emit);
        }
        if stop.load(Ordering::Relaxed) {
            // Evaluate and save the weights as they are now (unless this step's were just
            // saved), so a stopped run loses no training and can be analysed even before its
            // first evaluation.
            let saved_now = members
                .iter()
                .filter(|m| m.result.is_none())
                .all(|m| m.checkpoint_step == Some(trainer.step()));
            if !saved_now || members.iter().any(|m| m.summary.last_accuracy.is_none()) {
                evaluate_active(trainer, members, clock, emit)?;
            }
            return finish_active(trainer, members, clock, RunStatus::Stopped, emit);
        }
        let step_started = Instant::now();
        let outcomes = trainer.train_step_replicas()?;
        let step_secs = step_started.elapsed().as_secs_f64();
        clock.tokens += trainer.tokens_per_step();
        clock.training_secs += step_secs;
        for (r, outcome) in outcomes.into_iter().enumerate() {
            let member = &mut members[r];
            match outcome {
                _ if member.result.is_some() => {}
                ReplicaStep::Trained(stats) => {
                    record_step(trainer, member, clock, stats, step_secs, &mut |e| {
                        emit(r, e)
                    })?
                }
                ReplicaStep::Diverged(error) => fail(member, r, clock, error, emit),
                ReplicaStep::Frozen => {}
            }
        }
        if trainer.step().is_multiple_of(eval_interval) || trainer.step() == trainer.total_steps() {
            evaluate_active(trainer, members, clock, emit)?;
        } else if clock.checkpoint_due() {
            checkpoint_active(trainer, members, clock, emit)?;
        }
    }
    Ok(())
}

/// Saves a checkpoint and the summary of every replica still training: the time-based
/// checkpoint between evaluations.
fn checkpoint_active(
    trainer: &mut Trainer,
    members: &mut [Member],
    clock: &mut Clock,
    emit: &mut dyn FnMut(usize, TrainEvent),
) -> Result<()> {
    clock.checkpointed_secs = clock.training_secs;
    for (r, member) in members.iter_mut().enumerate() {
        if member.result.is_some() {
            continue;
        }
        let saved = save_state(trainer, r, member);
        if unless_diverged(trainer, r, member, clock, saved, emit)? {
            member.dir.write_summary(&member.summary)?;
        }
    }
    Ok(())
}

/// Saves replica `r`'s checkpoint: the weights, then the optimiser state, whose step marks
/// the pair complete (resuming checks they were written in this order).
fn save_state(trainer: &Trainer, r: usize, member: &mut Member) -> Result<()> {
    trainer.save_checkpoint(r, &member.dir.checkpoint_path())?;
    trainer.save_optimizer(r, &member.dir.optimizer_path())?;
    member.checkpoint_step = Some(trainer.step());
    Ok(())
}

/// Whether replica `r` trains on after `result`: a divergence freezes and fails it (false),
/// another error is the group's.
fn unless_diverged(
    trainer: &mut Trainer,
    r: usize,
    member: &mut Member,
    clock: &Clock,
    result: Result<()>,
    emit: &mut dyn FnMut(usize, TrainEvent),
) -> Result<bool> {
    match result {
        Ok(()) => Ok(true),
        Err(error @ Error::Diverged { .. }) => {
            trainer.freeze(r);
            fail(member, r, clock, error, emit);
            Ok(false)
        }
        Err(error) => Err(error),
    }
}

/// Evaluates every replica still training, saves its evaluation, and finishes (and freezes)
/// those that reached their target.
fn evaluate_active(
    trainer: &mut Trainer,
    members: &mut [Member],
    clock: &mut Clock,
    emit: &mut dyn FnMut(usize, TrainEvent),
) -> Result<()> {
    clock.checkpointed_secs = clock.training_secs;
    let evals = trainer.evaluate_replicas()?;
    let rows: Vec<usize> = (0..trainer
        .preset()
        .eval
        .attention_examples
        .min(trainer.test_set().len()))
        .collect();
    let attention = trainer.replica_attention(&rows)?;
    for ((r, eval), (_, weights)) in evals.into_iter().zip(attention) {
        let member = &mut members[r];
        if member.result.is_some() {
            continue;
        }
        let recorded = record_eval(trainer, r, member, clock, eval, &rows, weights, &mut |e| {
            emit(r, e)
        });
        if !unless_diverged(trainer, r, member, clock, recorded, emit)? {
            continue;
        }
        let train = &trainer.replica_preset(r).train;
        let target = train.target_accuracy;
        if target > 0.0 && eval.headline(train.metric) >= target {
            trainer.freeze(r);
            finish(member, clock, RunStatus::TargetReached, &mut |e| emit(r, e))?;
        }
    }
    Ok(())
}

/// Ends every replica still training with `status`.
fn finish_active(
    trainer: &mut Trainer,
    members: &mut [Member],
    clock: &Clock,
    status: RunStatus,
    emit: &mut dyn FnMut(usize, TrainEvent),
) -> Result<()> {
    for (r, member) in members.iter_mut().enumerate() {
        if member.result.is_none() {
            trainer.freeze(r);
            finish(member, clock, status, &mut |e| emit(r, e))?;
        }
    }
    Ok(())
}

fn finish(
    member: &mut Member,
    clock: &Clock,
    status: RunStatus,
    emit: &mut dyn FnMut(TrainEvent),
) -> Result<()> {
    // The event file's end first: were it to fail after the summary said "completed", the
    // failure would rewrite that summary as failed.
    if let Some(board) = &member.board {
        board.end(member.summary.steps, status)?;
    }
    member.summary.status = status;
    member.summary.elapsed_secs = clock.started.elapsed().as_secs_f64();
    member.dir.write_summary(&member.summary)?;
    emit(TrainEvent::Finished(Box::new(member.summary.clone())));
    member.result = Some(Ok(member.summary.clone()));
    Ok(())
}

fn initial_summary(trainer: &Trainer, r: usize) -> Summary {
    let preset = trainer.replica_preset(r);
    let state = preset.state();
    Summary {
        name: preset.name.clone(),
        status: RunStatus::Running,
        mechanism: preset.attention.name().into(),
        encoding: preset.encoding.name().into(),
        task: preset.task.name().into(),
        corpus: preset.task.lm().and_then(|lm| lm.corpus_description().ok()),
        device: trainer.device_name(),
        device_notice: trainer.device_notice().map(str::to_string),
        precision: preset.train.precision,
        metric: preset.train.metric,
        n_params: trainer.params().count(),
        state_floats: state.map(|s| s.floats),
        state_zoology: state.map(|s| s.zoology_units),
        replicas: (trainer.replicas() > 1).then_some(trainer.replicas()),
        steps: 0,
        total_steps: trainer.total_steps(),
        epoch: 0.0,
        elapsed_secs: 0.0,
        last_loss: None,
        last_accuracy: None,
        best_accuracy: None,
        time_to_target_secs: None,
        tokens_per_s: None,
        error: None,
        attnlab_version: env!("CARGO_PKG_VERSION").into(),
    }
}

fn record_step(
    trainer: &Trainer,
    member: &mut Member,
    clock: &Clock,
    stats: StepStats,
    step_secs: f64,
    emit: &mut dyn FnMut(TrainEvent),
) -> Result<()> {
    let record = StepRecord {
        step: trainer.step(),
        epoch: trainer.epoch(),
        loss: stats.loss,
        lr: stats.lr,
        grad_norm: stats.grad_norm,
        tokens_per_s: trainer.tokens_per_step() as f64 / step_secs.max(1e-9),
        elapsed_secs: clock.started.elapsed().as_secs_f64(),
    };
    member
        .dir
        .append_metric(&MetricRecord::Step(record.clone()))?;
    if let Some(board) = &member.board {
        board.step(&record)?;
    }
    let summary = &mut member.summary;
    summary.steps = record.step;
    summary.epoch = record.epoch;
    summary.last_loss = Some(record.loss);
    summary.elapsed_secs = record.elapsed_secs;
    summary.tokens_per_s = Some(clock.tokens as f64 / clock.training_secs.max(1e-9));
    emit(TrainEvent::Step(record));
    Ok(())
}

/// Logs replica `r`'s evaluation, saves its checkpoint, attention and summary.
#[allow(clippy::too_many_arguments)]
fn record_eval(
    trainer: &Trainer,
    r: usize,
    member: &mut Member,
    clock: &Clock,
    eval: EvalStats,
    rows: &[usize],
    attention: Vec<Option<Tensor>>,
    emit: &mut dyn FnMut(TrainEvent),
) -> Result<()> {
    let record = EvalRecord {
        step: trainer.step(),
        epoch: trainer.epoch(),
        accuracy: eval.accuracy,
        macro_accuracy: Some(eval.macro_accuracy).filter(|m| m.is_finite()),
        loss: eval.loss,
        elapsed_secs: clock.started.elapsed().as_secs_f64(),
    };
    member
        .dir
        .append_metric(&MetricRecord::Eval(record.clone()))?;
    save_state(trainer, r, member)?;
    // After the checkpoint: the event file is a second record, and a failure to write it
    // must not cost the evaluation's checkpoint.
    if let Some(board) = &member.board {
        board.eval(&record, &attention, &truth_crops(trainer, rows))?;
    }
    let dir = &member.dir;
    save_attention(dir, trainer, rows, attention)?;
    let summary = &mut member.summary;
    let train = &trainer.replica_preset(r).train;
    let accuracy = eval.headline(train.metric);
    summary.last_accuracy = Some(accuracy);
    summary.best_accuracy = Some(summary.best_accuracy.unwrap_or(0.0).max(accuracy));
    let target = train.target_accuracy;
    if target > 0.0 && accuracy >= target && summary.time_to_target_secs.is_none() {
        summary.time_to_target_secs = Some(record.elapsed_secs);
    }
    dir.write_summary(summary)?;
    emit(TrainEvent::Eval(record));
    Ok(())
}

/// The ground truth of test rows `rows` as crops of their attention, for the TensorBoard
/// sink's IoU; none for a task without a ground truth.
fn truth_crops(trainer: &Trainer, rows: &[usize]) -> Vec<Crop> {
    let Some(context) = trainer.preset().task.truth_context() else {
        return Vec::new();
    };
    let test = trainer.test_set();
    rows.iter()
        .map(|&row| {
            let queries = test.queries.get(row).map_or(&[][..], Vec::as_slice);
            Crop::new(queries, context, Target::Value)
        })
        .collect()
}

/// Saves the attention of test rows `rows` (the first `eval.attention_examples`), per layer.
fn save_attention(
    dir: &RunDir,
    trainer: &Trainer,
    rows: &[usize],
    attention: Vec<Option<Tensor>>,
) -> Result<()> {
    let preset = trainer.preset();
    let mut layers = Vec::new();
    let mut tensors = Vec::new();
    for (layer, weights) in attention.into_iter().enumerate() {
        if let Some(weights) = weights {
            layers.push(AttentionLayerFile {
                layer,
                file: format!("layer{layer}.npy"),
                shape: weights.dims().to_vec(),
            });
            tensors.push(weights.to_device(&candle_core::Device::Cpu)?);
        }
    }
    let test = trainer.test_set();
    let examples = rows
        .iter()
        .map(|&row| AttentionExample {
            row,
            inputs: test.row(row).to_vec(),
            labels: test.row_labels(row).to_vec(),
            queries: test.queries.get(row).cloned().unwrap_or_default(),
        })
        .collect();
    let index = AttentionIndex {
        mechanism: preset.attention.name().into(),
        encoding: preset.encoding.name().into(),
        step: trainer.step(),
        layers,
        examples,
    };
    dir.write_attention(&index, &tensors)
}

/// Marks replica `r`'s run failed in its summary (the last checkpoint stays), then emits
/// `Failed`; a divergence says which checkpoint that is.
fn fail(
    member: &mut Member,
    r: usize,
    clock: &Clock,
    mut error: Error,
    emit: &mut dyn FnMut(usize, TrainEvent),
) {
    if let Error::Diverged { kept, .. } = &mut error {
        *kept = Some(kept_checkpoint(member));
    }
    let preset = member.dir.read_preset().ok();
    let error = with_memory_estimate(error, preset.as_ref(), 1);
    member.summary.status = RunStatus::Failed;
    member.summary.error = Some(error.to_string());
    member.summary.elapsed_secs = clock.started.elapsed().as_secs_f64();
    // Saved before `Failed` goes out: the CLI exits on it, which left the summary "running"
    // and its temp file behind.
    let saved = member.dir.write_summary(&member.summary);
    emit(r, failed_event(&error, Some(&member.dir)));
    member.result = Some(Err(saved.err().unwrap_or(error)));
}

/// A device's out-of-memory error, with the memory estimate of `replicas` models of `preset`:
/// candle reports CUDA's as `CUDA_ERROR_OUT_OF_MEMORY` and Metal's in words, neither saying
/// what the run needed.
fn with_memory_estimate(error: Error, preset: Option<&Preset>, replicas: usize) -> Error {
    let cause = error.to_string();
    let out_of_memory =
        cause.contains("OUT_OF_MEMORY") || cause.to_lowercase().contains("out of memory");
    match preset {
        Some(preset) if out_of_memory => Error::OutOfMemory {
            cause,
            needs: preset.memory_estimate().replicated(replicas).to_string(),
        },
        _ => error,
    }
}

/// Which checkpoint a diverged run keeps, in words.
fn kept_checkpoint(member: &Member) -> String {
    match member.checkpoint_step {
        Some(step) => format!(
            "the last finite checkpoint, from step {step}, is kept: {}",
            member.dir.checkpoint_path().display()
        ),
        None => "no checkpoint was saved (it diverged before its first one)".into(),
    }
}

fn failed_event(error: &Error, dir: Option<&RunDir>) -> TrainEvent {
    TrainEvent::Failed {
        message: error.to_string(),
        run_dir: dir.map(|d| d.path().to_path_buf()),
    }
}

/// Every replica failed with `error` before its folder existed (the first gets `error`
/// itself, the others its message).
fn fail_all(
    n: usize,
    error: Error,
    emit: &mut dyn FnMut(usize, TrainEvent),
) -> Vec<Result<Summary>> {
    let message = error.to_string();
    let mut results = vec![Err(error)];
    results.extend((1..n).map(|_| Err(Error::Failed(message.clone()))));
    for r in 0..n {
        emit(
            r,
            TrainEvent::Failed {
                message: message.clone(),
                run_dir: None,
            },
        );
    }
    results
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first replica keeps the error itself, the others a copy of its message.
    #[test]
    fn a_group_failing_together_copies_the_error_as_text() {
        let mut events = 0;
        let results = fail_all(3, Error::Cancelled, &mut |_, _| events += 1);
        assert_eq!(events, 3);
        assert!(matches!(results[0], Err(Error::Cancelled)));
        for result in &results[1..] {
            assert!(matches!(result, Err(Error::Failed(m)) if m == "cancelled"));
        }
    }

    #[test]
    fn an_out_of_memory_error_says_what_the_run_needs() {
        let preset = Preset::default();
        let cuda = Error::Candle(candle_core::Error::Msg(
            "DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")".into(),
        ));
        let message = with_memory_estimate(cuda, Some(&preset), 1).to_string();
        assert!(
            message.starts_with("the device ran out of memory")
                && message.contains("this run needs ≈ ")
                && message.contains("CUDA_ERROR_OUT_OF_MEMORY"),
            "{message}"
        );
        let other = with_memory_estimate(Error::Data("disk on fire".into()), Some(&preset), 1);
        assert_eq!(other.to_string(), "disk on fire");
    }
}
