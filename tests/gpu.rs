//! CPU and GPU agree: for every mechanism × encoding (and the short-convolution hybrids), the
//! loss, every gradient and the parameters after one optimiser step on `cuda:0` match the CPU's
//! within float tolerance. Skipped, with a note on stderr (`--nocapture` shows it), where
//! `cuda:0` does not open (a build without `--features cuda`, or no driver or GPU); `attnlab
//! devices` says why. On a machine that has a GPU, set ATTNLAB_REQUIRE_GPU=1 so that a GPU that
//! fails to open fails the tests instead of skipping them.

#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

mod common;

use attnlab::Preset;
use attnlab::params::Params;
use attnlab::tasks::mqar::Split;
use attnlab::train::Trainer;
use candle_core::{Device, Tensor};

const GPU: &str = "cuda:0";

/// The GPU, or `None` (with the reason printed) where there is none to compare with.
fn gpu() -> Option<Device> {
    match attnlab::device::open(GPU) {
        Ok(device) => Some(device),
        Err(e) if std::env::var_os("ATTNLAB_REQUIRE_GPU").is_some() => {
            panic!("ATTNLAB_REQUIRE_GPU is set but {e}")
        }
        Err(e) => {
            eprintln!("SKIPPED: no GPU to compare with the CPU ({e})");
            None
        }
    }
}

/// Every combination the preset validation accepts, plus each mechanism behind a short
/// convolution (conv1d on the GPU).
fn presets() -> Vec<Preset> {
    let (mut presets, _) = common::all_combinations();
    let encoding = common::small_encodings().remove(0);
    for mechanism in common::small_mechanisms() {
        presets.push(common::hybrid(common::tiny(mechanism, encoding.clone())));
    }
    presets
}

fn values(t: &Tensor) -> Vec<f32> {
    t.to_device(&Device::Cpu)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
}

fn max_abs(v: &[f32]) -> f32 {
    v.iter().fold(0f32, |m, x| m.max(x.abs()))
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}

fn close(a: f64, b: f64, rtol: f64) -> bool {
    (a - b).abs() <= rtol * a.abs().max(b.abs()) + 1e-7
}

/// Loss and gradients of one batch on `device`, gradients by parameter name.
fn loss_and_grads(preset: &Preset, device: &Device) -> (f32, Vec<(String, Vec<f32>)>) {
    let params = Params::new(preset.train.seed, device);
    let model = preset.build_model(&params).unwrap();
    let data = preset.task.mqar().unwrap().generate(Split::Train);
    let batch = data.batch(&(0..8).collect::<Vec<_>>(), device).unwrap();
    let logits = model.logits_at(&batch.inputs, &batch.rows).unwrap();
    let loss = candle_nn::loss::cross_entropy(&logits, &batch.targets).unwrap();
    let grads = loss.backward().unwrap();
    let named = params
        .vars()
        .into_iter()
        .map(|(name, var)| {
            let grad = grads.get(var.as_tensor()).unwrap();
            (name, values(grad))
        })
        .collect();
    (values(&loss)[0], named)
}

#[test]
fn gradients_match_the_cpu() {
    let Some(device) = gpu() else { return };
    for preset in presets() {
        let (cpu_loss, cpu_grads) = loss_and_grads(&preset, &Device::Cpu);
        let (gpu_loss, gpu_grads) = loss_and_grads(&preset, &device);
        let name = &preset.name;
        assert!(
            close(cpu_loss.into(), gpu_loss.into(), 1e-4),
            "{name}: loss {cpu_loss} on the CPU, {gpu_loss} on the GPU"
        );
        for ((param, cpu), (_, gpu)) in cpu_grads.iter().zip(&gpu_grads) {
            // Summation order differs between devices: relative to the tensor's largest entry.
            let tol = 1e-3 * max_abs(cpu) + 1e-7;
            let diff = max_diff(cpu, gpu);
            assert!(
                diff <= tol,
                "{name}: gradient of {param} differs by {diff} > {tol}"
            );
        }
    }
}

#[test]
fn one_training_step_matches_the_cpu() {
    if gpu().is_none() {
        return;
    }
    for preset in presets() {
        let mut on_gpu = preset.clone();
        on_gpu.train.device = GPU.into();
        let mut cpu = Trainer::new(&preset).unwrap();
        let mut gpu = Trainer::new(&on_gpu).unwrap();
        assert_eq!(gpu.device_notice(), None);
        let (a, b) = (cpu.train_step().unwrap(), gpu.train_step().unwrap());
        let name = &preset.name;
        assert!(
            close(a.loss.into(), b.loss.into(), 1e-4),
            "{name}: {a:?} vs {b:?}"
        );
        assert!(
            close(a.grad_norm, b.grad_norm, 1e-3),
            "{name}: {a:?} vs {b:?}"
        );
        // AdamW's first step moves each parameter by about lr·sign(gradient); a gradient within
        // float noise of zero may take the other sign on the GPU, so a few entries may differ by
        // up to 2·lr, the rest must agree closely.
        let lr = a.lr as f32;
        for ((param, x), (_, y)) in cpu.params().vars().iter().zip(gpu.params().vars().iter()) {
            let (x, y) = (values(x.as_tensor()), values(y.as_tensor()));
            let far = x
                .iter()
                .zip(&y)
                .filter(|(p, q)| (*p - *q).abs() > 1e-5)
                .count();
            let allowed = 1 + x.len() / 1000;
            assert!(
                far <= allowed,
                "{name}: {far} of {} entries of {param} differ",
                x.len()
            );
            let diff = max_diff(&x, &y);
            assert!(diff <= 2.0 * lr + 1e-5, "{name}: {param} differs by {diff}");
        }
    }
}

#[test]
fn a_gpu_run_reports_no_fallback() {
    if gpu().is_none() {
        return;
    }
    let mut preset = common::tiny(
        common::small_mechanisms().remove(0),
        common::small_encodings().remove(0),
    );
    preset.train.device = GPU.into();
    let root = tempfile::tempdir().unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let summary = attnlab::train::run::run(&preset, root.path(), &stop, &mut |_| {}).unwrap();
    assert_eq!(
        (summary.device.as_str(), summary.device_notice),
        (GPU, None)
    );
    assert!(summary.last_accuracy.is_some());
}
