//! How long a sweep has left, from the work its cells have done rather than from how many
//! have ended.
//!
//! Cells differ in size: in MAD-lite's quick sweep for Mamba-2 on 2 cores the first cell to
//! end (fuzzy recall, 22 minutes) was one of the two longest, and "the time per cell so far
//! times the cells left" said 1h51m where 20 minutes were left (this estimate: 32, two cells
//! then stopping early at their target). Each cell's share here is its estimated arithmetic
//! ([`super::work`]), and a running cell counts by its steps.

use crate::train::TrainEvent;

/// The planned cells' estimated work and how much of each is done, fed the cells' training
/// events.
#[derive(Clone, Debug, Default)]
pub struct Eta {
    /// By cell index: the estimated work (0 for cells not trained in this run of the sweep),
    /// the planned steps (known once the cell starts) and the fraction done.
    cells: Vec<CellWork>,
}

#[derive(Clone, Copy, Debug, Default)]
struct CellWork {
    work: f64,
    total_steps: usize,
    done: f64,
}

impl Eta {
    /// Nothing done of cells with these estimated amounts of work, by cell index (what
    /// [`super::SweepEvent::Planned`] carries).
    pub fn new(work: &[f64]) -> Self {
        let cells = work
            .iter()
            .map(|&work| CellWork {
                work,
                ..CellWork::default()
            })
            .collect();
        Self { cells }
    }

    /// Takes cell `cell`'s training event: its planned steps when it starts, its share done
    /// at each step, all of it when it ends (however it ends: a stopped or failed cell is
    /// not trained again in this run).
    pub fn record(&mut self, cell: usize, event: &TrainEvent) {
        let Some(total_steps) = self.cells.get(cell).map(|c| c.total_steps) else {
            return;
        };
        match event {
            TrainEvent::Started { total_steps, .. } => self.cells[cell].total_steps = *total_steps,
            TrainEvent::Step(s) if total_steps > 0 => {
                self.set_done(cell, s.step as f64 / total_steps as f64)
            }
            TrainEvent::Finished(_) | TrainEvent::Failed { .. } => self.set_done(cell, 1.0),
            _ => {}
        }
    }

    /// Sets the share of cell `cell` done (clamped to 0 to 1), for a front end that follows
    /// its cells' steps itself; a cell not planned is ignored.
    pub fn set_done(&mut self, cell: usize, fraction: f64) {
        if let Some(c) = self.cells.get_mut(cell) {
            c.done = fraction.clamp(0.0, 1.0);
        }
    }

    /// The share of the planned work done, 0 to 1 (0 with nothing planned).
    pub fn fraction_done(&self) -> f64 {
        let total: f64 = self.cells.iter().map(|c| c.work).sum();
        if total <= 0.0 {
            return 0.0;
        }
        self.cells.iter().map(|c| c.work * c.done).sum::<f64>() / total
    }

    /// Seconds left when `elapsed_secs` have gone into the work done so far, at the pace so
    /// far; `None` before any work is done and once all of it is. Workers that run out of
    /// cells near the end make the last minutes slower than the pace of all of them.
    pub fn seconds_left(&self, elapsed_secs: f64) -> Option<f64> {
        let done = self.fraction_done();
        (done > 0.0 && done < 1.0).then(|| elapsed_secs * (1.0 - done) / done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::StepRecord;

    fn started(total_steps: usize) -> TrainEvent {
        TrainEvent::Started {
            run_dir: Default::default(),
            total_steps,
            steps_per_epoch: total_steps,
            n_params: 0,
            device_notice: None,
            precision_note: None,
            corpus: None,
        }
    }

    fn step(step: usize) -> TrainEvent {
        TrainEvent::Step(StepRecord {
            step,
            epoch: 0.0,
            loss: 0.0,
            lr: 0.0,
            grad_norm: 0.0,
            tokens_per_s: 0.0,
            elapsed_secs: 0.0,
        })
    }

    fn failed() -> TrainEvent {
        TrainEvent::Failed {
            message: String::new(),
            run_dir: None,
        }
    }

    /// The long cell ended first: by cells, a third done and 20 minutes left; by work, 4/5
    /// done and 2.5 minutes left.
    #[test]
    fn a_long_cell_ending_first_leaves_little_time() {
        let mut eta = Eta::new(&[8.0, 1.0, 1.0]);
        assert_eq!(eta.seconds_left(60.0), None);
        eta.record(0, &started(100));
        eta.record(0, &step(50));
        assert_eq!(eta.fraction_done(), 0.4);
        eta.record(0, &failed());
        assert_eq!(eta.fraction_done(), 0.8);
        let left = eta.seconds_left(600.0).unwrap();
        assert!((left - 150.0).abs() < 1e-9, "{left}");
        for cell in [1, 2] {
            eta.record(cell, &started(10));
            eta.record(cell, &step(10));
        }
        assert_eq!(eta.seconds_left(700.0), None);
    }

    /// A step before its cell's start, a step past its total and a cell not planned are no
    /// progress, all of it, and ignored.
    #[test]
    fn odd_events_do_not_move_it_out_of_range() {
        let mut eta = Eta::new(&[1.0, 0.0]);
        eta.record(0, &step(5));
        assert_eq!(eta.fraction_done(), 0.0);
        eta.record(0, &started(4));
        eta.record(0, &step(5));
        assert_eq!(eta.fraction_done(), 1.0);
        eta.record(7, &failed());
        assert_eq!(Eta::new(&[]).fraction_done(), 0.0);
    }
}
