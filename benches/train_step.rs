//! Criterion benchmarks of one training step (forward, backward, AdamW) on the reference
//! MQAR configuration, and of a forward pass that captures every attention matrix.
//! `cargo bench` runs them; `attnlab bench` adds time-to-accuracy and the PyTorch comparison.

use std::path::Path;

use criterion::{Criterion, criterion_group};

use attnlab::Preset;
use attnlab::train::Trainer;

/// The allocator of the `attnlab` binary, so these numbers match `attnlab bench`.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const REFERENCE: &str = include_str!("../presets/bench_mqar.toml");

fn reference(overrides: &[&str]) -> Preset {
    let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    Preset::parse(REFERENCE, &overrides, Path::new("presets/bench_mqar.toml"))
        .expect("reference preset is valid")
}

fn train_step(c: &mut Criterion) {
    let mut group = c.benchmark_group("train_step");
    group.sample_size(20);
    for mechanism in ["softmax", "based", "rebased"] {
        let preset = reference(&[&format!("attention.kind={mechanism}")]);
        let mut trainer = Trainer::new(&preset).expect("trainer");
        group.bench_function(mechanism, |b| {
            b.iter(|| trainer.train_step().expect("step"))
        });
    }
    group.finish();
}

fn capture_attention(c: &mut Criterion) {
    let trainer = Trainer::new(&reference(&[])).expect("trainer");
    let rows: Vec<usize> = (0..64).collect();
    c.bench_function("capture_attention_64_rows", |b| {
        b.iter(|| trainer.attention_of(&rows).expect("attention"))
    });
}

criterion_group!(benches, train_step, capture_attention);

/// `criterion_main!`, after the CPU pool setting of the `attnlab` binary (so these numbers
/// match `attnlab bench`).
fn main() {
    // SAFETY: the first statement of `main`: no other thread exists yet.
    #[allow(unsafe_code)]
    unsafe {
        attnlab::device::tune_cpu_runtime();
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
