//! Criterion benchmarks of the data generators: MAD's 12,800 training rows of each probe's
//! baseline (issue 31's target: under 1 s each), and MQAR's reference training split.

use criterion::{Criterion, criterion_group, criterion_main};

use attnlab::tasks::Split;
use attnlab::tasks::mad::Probe;
use attnlab::tasks::mqar::MqarConfig;

fn generators(c: &mut Criterion) {
    let mut group = c.benchmark_group("tasks");
    group.sample_size(10);
    for probe in Probe::ALL {
        let config = probe.baseline();
        group.bench_function(format!("mad_{}_train", probe.name()), |b| {
            b.iter(|| config.generate(Split::Train))
        });
    }
    let mqar = MqarConfig::default();
    group.bench_function("mqar_default_train", |b| {
        b.iter(|| mqar.generate(Split::Train))
    });
    group.finish();
}

criterion_group!(benches, generators);
criterion_main!(benches);
