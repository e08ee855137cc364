//! Criterion benchmarks of one training step (forward, backward, AdamW) on the reference
//! MQAR configuration, of the delta rule's op alone at its shape, and of a forward pass that
//! captures every attention matrix.
//! `cargo bench` runs them; `attnlab bench` adds time-to-accuracy and the PyTorch comparison.

use std::path::Path;

use candle_core::{Device, Tensor, Var};
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
    for mechanism in ["softmax", "based", "rebased", "gated-deltanet"] {
        let preset = reference(&[&format!("attention.kind={mechanism}")]);
        let mut trainer = Trainer::new(&preset).expect("trainer");
        group.bench_function(mechanism, |b| {
            b.iter(|| trainer.train_step().expect("step"))
        });
    }
    group.finish();
}

/// The delta rule's op (DeltaNet, Gated DeltaNet) forward and backward at the reference
/// step's shape (batch 64, 2 heads of 64, T 64, a decay and β per token): what a layer's
/// mixer costs apart from the projections, gate and convolutions around it, measured without
/// the drift of a whole step.
fn delta_rule(c: &mut Criterion) {
    const T: usize = 64;
    let [q, k, v, g, beta] = delta_rule_inputs(T).expect("delta rule inputs");
    let scale = 1.0 / (q.dims()[3] as f64).sqrt();
    c.bench_function("delta_rule_forward_backward", |bench| {
        bench.iter(|| {
            attnlab::ops::delta_rule(&q, &k, &v, (&g, &beta), (scale, T))
                .expect("delta rule")
                .backward()
                .expect("its gradients")
        })
    });
}

/// q and k of unit length, v, the log-decays g (around −0.05) and β (around 0.5), as
/// variables so that the backward pass computes all five gradients.
fn delta_rule_inputs(t: usize) -> candle_core::Result<[Var; 5]> {
    let (b, h, d) = (64, 2, 64);
    let random = |shape: (usize, usize, usize, usize), mean: f32, std: f32| {
        Var::from_tensor(&Tensor::randn(mean, std, shape, &Device::Cpu)?)
    };
    let unit = |x: Var| Var::from_tensor(&x.broadcast_div(&x.sqr()?.sum_keepdim(3)?.sqrt()?)?);
    Ok([
        unit(random((b, h, t, d), 0.0, 1.0)?)?,
        unit(random((b, h, t, d), 0.0, 1.0)?)?,
        random((b, h, t, d), 0.0, 1.0)?,
        random((b, h, t, 1), -0.05, 0.01)?,
        random((b, h, t, 1), 0.5, 0.1)?,
    ])
}

fn capture_attention(c: &mut Criterion) {
    let trainer = Trainer::new(&reference(&[])).expect("trainer");
    let rows: Vec<usize> = (0..64).collect();
    c.bench_function("capture_attention_64_rows", |b| {
        b.iter(|| trainer.attention_of(&rows).expect("attention"))
    });
}

criterion_group!(benches, train_step, delta_rule, capture_attention);

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
