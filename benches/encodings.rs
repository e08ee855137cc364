//! Criterion benchmarks of the encoding analyses the GUI recomputes on every slider move: the
//! TRF of every relative-bias encoding at m = 10^6, and the convergence verdicts.

use criterion::{Criterion, criterion_group, criterion_main};

use attnlab::analysis::{Heads, Rows, StudiedEncoding};
use attnlab::encodings::EncodingSpec;

/// Every encoding with a relative bias, untrained, for 8 heads of width 64.
fn studied() -> Vec<StudiedEncoding> {
    EncodingSpec::all_defaults()
        .iter()
        .map(|spec| StudiedEncoding::untrained(spec, 8, 64).expect("builds"))
        .filter(|s| s.biases().expect("biases").is_some())
        .collect()
}

fn analyses(c: &mut Criterion) {
    let encodings = studied();
    let mut group = c.benchmark_group("encodings");
    group.sample_size(10);
    group.bench_function("trf_all_m1e6", |b| {
        b.iter(|| {
            for s in &encodings {
                s.trf(1_000_000, 50, Heads::Mean, Rows::Last).expect("trf");
            }
        })
    });
    group.bench_function("verdict_all", |b| {
        b.iter(|| {
            for s in &encodings {
                s.verdict().expect("verdict");
            }
        })
    });
    group.finish();
}

criterion_group!(benches, analyses);
criterion_main!(benches);
