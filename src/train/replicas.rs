//! Which runs can train as replicas of one model (see `params.rs` and [`super::Trainer::group`]).
//!
//! Replicas share every tensor shape and the training data: only the settings below, scalars of
//! the initialisation, the data order and the optimiser, may differ between them.

use crate::preset::Preset;

/// The preset keys a replica may set on its own.
pub const PER_RUN: [&str; 11] = [
    "name",
    "train.seed",
    "train.lr",
    "train.min_lr",
    "train.schedule",
    "train.warmup_steps",
    "train.weight_decay",
    "train.beta1",
    "train.beta2",
    "train.eps",
    "train.grad_clip and train.target_accuracy",
];

/// `preset` with its per-run settings ([`PER_RUN`]) at fixed values: presets with equal shapes
/// train as replicas.
pub fn shape(preset: &Preset) -> Preset {
    let mut shape = preset.clone();
    shape.name.clear();
    shape.description.clear();
    let fixed = crate::train::TrainConfig::default();
    let train = &mut shape.train;
    train.seed = fixed.seed;
    train.lr = fixed.lr;
    train.min_lr = fixed.min_lr;
    train.schedule = fixed.schedule;
    train.warmup_steps = fixed.warmup_steps;
    train.weight_decay = fixed.weight_decay;
    train.beta1 = fixed.beta1;
    train.beta2 = fixed.beta2;
    train.eps = fixed.eps;
    train.grad_clip = fixed.grad_clip;
    train.target_accuracy = fixed.target_accuracy;
    shape
}

/// Whether `a` and `b` can train as replicas of one group.
pub fn same_shape(a: &Preset, b: &Preset) -> bool {
    shape(a) == shape(b)
}

/// `presets` split into groups of one shape, at most `max_size` each, in order of first
/// appearance: indices into `presets`.
pub fn groups(presets: &[Preset], max_size: usize) -> Vec<Vec<usize>> {
    let mut groups: Vec<(Preset, Vec<usize>)> = Vec::new();
    for (i, preset) in presets.iter().enumerate() {
        let key = shape(preset);
        match groups
            .iter_mut()
            .find(|(k, members)| *k == key && members.len() < max_size.max(1))
        {
            Some((_, members)) => members.push(i),
            None => groups.push((key, vec![i])),
        }
    }
    groups.into_iter().map(|(_, members)| members).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn preset(overrides: &[&str]) -> Preset {
        let base = Preset::default().to_toml().unwrap();
        let overrides: Vec<String> = overrides.iter().map(|o| o.to_string()).collect();
        Preset::parse(&base, &overrides, std::path::Path::new("test")).unwrap()
    }

    #[test]
    fn seeds_and_learning_rates_group_widths_do_not() {
        let presets = [
            preset(&["train.seed=1"]),
            preset(&["model.d_model=32"]),
            preset(&["train.lr=0.01", "train.weight_decay=0"]),
            preset(&["train.seed=2"]),
            preset(&["model.d_model=32", "train.seed=5"]),
        ];
        assert_eq!(groups(&presets, 8), vec![vec![0, 2, 3], vec![1, 4]]);
        assert_eq!(groups(&presets, 2), vec![vec![0, 2], vec![1, 4], vec![3]]);
        assert!(!same_shape(&presets[0], &preset(&["train.epochs=3"])));
    }
}
