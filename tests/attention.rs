//! One attention matrix to rule them all: every mechanism returns its explicit mixing matrix,
//! row-normalised unless its facts say it is signed (then it has entries of both signs);
//! causal ones are zero above the diagonal; capturing them does not change the model's
//! output; and the matrix equals a naive reference written from the papers' formulas.

#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

mod common;

use attnlab::attention::{
    MechanismShape, MechanismSpec, Mixing, RebasedConfig, RebasedVariant, SoftmaxConfig,
};
use attnlab::encodings::NoEncoding;
use attnlab::params::Params;
use attnlab::tasks::Split;
use candle_core::{D, Device, Tensor};

#[test]
fn weights_are_row_normalised_or_signed_and_causal_for_every_combination() {
    let (valid, _) = common::all_combinations();
    for preset in valid {
        let (model, _) = common::build(&preset);
        let data = preset.task.mqar().unwrap().generate(Split::Test);
        let batch = data.batch(&[0, 1, 2], &Device::Cpu).unwrap();
        let forward = model.forward(&batch.inputs).unwrap();
        let layers: Vec<_> = forward.attention.iter().flatten().collect();
        assert_eq!(layers.len(), 2, "{}", preset.name);
        for attention in layers {
            let (b, h, tq, tk) = attention.weights.dims4().unwrap();
            assert_eq!((b, h, tq), (3, 2, 16), "{}", preset.name);
            let expected_tk = if preset.attention.is_causal() { 16 } else { 4 };
            assert_eq!(tk, expected_tk, "{}", preset.name);
            let sums = attention
                .weights
                .sum(D::Minus1)
                .unwrap()
                .flatten_all()
                .unwrap();
            match preset.attention.mixing() {
                Mixing::RowStochastic => {
                    for s in sums.to_vec1::<f32>().unwrap() {
                        assert!((s - 1.0).abs() < 1e-4, "{}: row sums to {s}", preset.name);
                    }
                }
                Mixing::Signed => {
                    let w = attention.weights.flatten_all().unwrap();
                    let w = w.to_vec1::<f32>().unwrap();
                    assert!(
                        w.iter().any(|&x| x < 0.0) && w.iter().any(|&x| x > 0.0),
                        "{}: a signed matrix with entries of one sign",
                        preset.name
                    );
                }
            }
            if preset.attention.is_causal() {
                let w = attention
                    .weights
                    .flatten_to(1)
                    .unwrap()
                    .to_vec3::<f32>()
                    .unwrap();
                for plane in &w {
                    for (i, row) in plane.iter().enumerate() {
                        assert!(
                            row[i + 1..].iter().all(|&x| x == 0.0),
                            "{}: weight above the diagonal",
                            preset.name
                        );
                    }
                }
            }
        }
    }
}

/// The training path (logits at scored rows only) and the capturing path agree.
#[test]
fn capturing_attention_does_not_change_the_output() {
    let (valid, _) = common::all_combinations();
    for preset in valid {
        let (model, _) = common::build(&preset);
        let data = preset.task.mqar().unwrap().generate(Split::Test);
        let batch = data.batch(&[0, 1], &Device::Cpu).unwrap();
        let scored = model.logits_at(&batch.inputs, &batch.rows).unwrap();
        let full = model.forward(&batch.inputs).unwrap().logits;
        let (b, t, v) = full.dims3().unwrap();
        let gathered = full
            .reshape((b * t, v))
            .unwrap()
            .index_select(&batch.rows, 0)
            .unwrap();
        let diff = common::max_abs_diff(&scored, &gathered);
        assert!(diff < 1e-4, "{}: outputs differ by {diff}", preset.name);
    }
}

fn randn(shape: (usize, usize, usize, usize), seed: u64) -> Tensor {
    let n = shape.0 * shape.1 * shape.2 * shape.3;
    let data = attnlab::rng::normal_vec(&mut attnlab::rng::stream(seed, "test"), n, 1.0);
    Tensor::from_vec(data, shape, &Device::Cpu).unwrap()
}

/// The (T, d) matrix of a (1, 1, T, d) tensor.
fn plane(x: &Tensor) -> Vec<Vec<f32>> {
    x.squeeze(0)
        .unwrap()
        .squeeze(0)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap()
}

/// y_i = Σ_j κ(q_i, k_j) v_j / Σ_j κ(q_i, k_j) over the `window` keys up to i (itself
/// included), computed with loops in f64.
fn naive(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    window: usize,
    kernel: impl Fn(&[f32], &[f32]) -> f64,
) -> Vec<Vec<f64>> {
    let (q, k, v) = (plane(q), plane(k), plane(v));
    (0..q.len())
        .map(|i| {
            let keys = i + 1 - window.min(i + 1)..=i;
            let w: Vec<(usize, f64)> = keys.map(|j| (j, kernel(&q[i], &k[j]))).collect();
            let z: f64 = w.iter().map(|(_, w)| w).sum();
            (0..v[0].len())
                .map(|c| w.iter().map(|&(j, w)| w * v[j][c] as f64).sum::<f64>() / z)
                .collect()
        })
        .collect()
}

/// κ(q_i, k_j) of a mechanism, written from its paper.
type Kernel = dyn Fn(&[f32], &[f32]) -> f64;

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum()
}

#[test]
fn explicit_matrices_match_the_papers_formulas() {
    let (t, d) = (7, 4);
    let q = randn((1, 1, t, d), 1);
    let k = randn((1, 1, t, d), 2);
    let v = randn((1, 1, t, 3), 3);
    let shape = MechanismShape {
        n_heads: 1,
        qk_dim: d,
        head_dim: 3,
        max_len: t,
        precision: attnlab::ops::Precision::F32,
    };
    let scale = 1.0 / (d as f64).sqrt();
    let elu1 = |x: f32| {
        if x > 0.0 {
            x as f64 + 1.0
        } else {
            (x as f64).exp()
        }
    };
    let softmax = move |a: &[f32], b: &[f32]| (dot(a, b) * scale).exp();
    let cases: Vec<(MechanismSpec, Box<Kernel>)> = vec![
        (
            MechanismSpec::Softmax(Default::default()),
            Box::new(softmax),
        ),
        // Sliding-window softmax: 3 keys, the query's own included.
        (
            MechanismSpec::Softmax(SoftmaxConfig {
                window: Some(3),
                ..Default::default()
            }),
            Box::new(softmax),
        ),
        (
            MechanismSpec::Linear(Default::default()),
            Box::new(move |a, b| a.iter().zip(b).map(|(x, y)| elu1(*x) * elu1(*y)).sum()),
        ),
        (
            MechanismSpec::Based(Default::default()),
            Box::new(move |a, b| {
                let s = dot(a, b) * scale;
                1.0 + s + s * s / 2.0
            }),
        ),
        (
            MechanismSpec::Rebased(RebasedConfig {
                feature_dim: d,
                variant: RebasedVariant::X2,
            }),
            Box::new(move |a, b| (dot(a, b) * scale).powi(2)),
        ),
    ];
    for (spec, kernel) in cases {
        let mechanism = spec.build(&shape, &Params::new(0, &Device::Cpu)).unwrap();
        let attention = mechanism.attend(&q, &k, &v, &NoEncoding).unwrap();
        let y = attention.weights.matmul(&attention.values).unwrap();
        let y = plane(&y);
        let window = match &spec {
            MechanismSpec::Softmax(c) => c.window.unwrap_or(t),
            _ => t,
        };
        let want = naive(&q, &k, &v, window, kernel);
        for (row_y, row_want) in y.iter().zip(&want) {
            for (a, b) in row_y.iter().zip(row_want) {
                assert!((*a as f64 - b).abs() < 1e-4, "{spec:?}: {a} vs {b}");
            }
        }
    }
}

/// Linear attention's recurrent form (S_i = S_{i−1} + φ(k_i) v_iᵀ, z_i = z_{i−1} + φ(k_i))
/// gives the same outputs as its explicit matrix.
#[test]
fn linear_attention_recurrent_form_matches_the_matrix() {
    let (t, d) = (6, 3);
    let q = randn((1, 1, t, d), 4);
    let k = randn((1, 1, t, d), 5);
    let v = randn((1, 1, t, 2), 6);
    let shape = MechanismShape {
        n_heads: 1,
        qk_dim: d,
        head_dim: 2,
        max_len: t,
        precision: attnlab::ops::Precision::F32,
    };
    let mechanism = MechanismSpec::Linear(Default::default())
        .build(&shape, &Params::new(0, &Device::Cpu))
        .unwrap();
    let attention = mechanism.attend(&q, &k, &v, &NoEncoding).unwrap();
    let y = attention.weights.matmul(&attention.values).unwrap();
    let y = plane(&y);
    let phi = |x: &Tensor| plane(&(x.elu(1.0).unwrap() + 1.0).unwrap());
    let (fq, fk) = (phi(&q), phi(&k));
    let v = plane(&v);
    let mut state = vec![vec![0f64; 2]; d];
    let mut z = vec![0f64; d];
    for i in 0..t {
        for a in 0..d {
            z[a] += fk[i][a] as f64;
            for c in 0..2 {
                state[a][c] += fk[i][a] as f64 * v[i][c] as f64;
            }
        }
        let norm: f64 = (0..d).map(|a| fq[i][a] as f64 * z[a]).sum();
        for c in 0..2 {
            let out: f64 = (0..d).map(|a| fq[i][a] as f64 * state[a][c]).sum::<f64>() / norm;
            assert!(
                (out - y[i][c] as f64).abs() < 1e-4,
                "row {i}: {out} vs {}",
                y[i][c]
            );
        }
    }
}
