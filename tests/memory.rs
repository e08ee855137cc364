//! The memory estimate (`Preset::memory_estimate`) against the peak resident memory of real
//! runs: `attnlab train` reports both at its end. The stated margin: the estimate is never
//! more than 10 % below the measured peak, and at most 1.6 times it, on configurations where
//! each part of the estimate dominates in turn (parameters and logits, activations, attention,
//! kernel feature maps). Linux only (the peak is read from /proc).

#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

mod common;

/// "1.5 GB" → bytes.
fn parse_size(text: &str) -> f64 {
    let (number, unit) = text.trim().split_once(' ').unwrap();
    let power = ["B", "KB", "MB", "GB", "TB"]
        .iter()
        .position(|u| *u == unit)
        .unwrap();
    number.parse::<f64>().unwrap() * 1024f64.powi(power as i32)
}

/// (measured peak, estimate) of three training steps of the softmax MQAR preset with `sets`.
fn peak_and_estimate(sets: &[&str]) -> (f64, f64) {
    let out = tempfile::tempdir().unwrap();
    let mut args = vec![
        "train",
        "presets/mqar_softmax.toml",
        "--quiet",
        "--out",
        out.path().to_str().unwrap(),
    ];
    for set in [
        "train.max_steps=3",
        "train.eval_every=3",
        "train.warmup_steps=0",
    ]
    .iter()
    .chain(sets)
    {
        args.extend(["--set", set]);
    }
    let o = common::attnlab(&args);
    let stderr = common::stderr(&o);
    assert!(o.status.success(), "{stderr}");
    let line = stderr
        .lines()
        .find_map(|l| l.strip_prefix("peak memory "))
        .unwrap_or_else(|| panic!("no peak memory line in {stderr}"));
    let (peak, estimate) = line.split_once(" (estimated ").unwrap();
    (parse_size(peak), parse_size(estimate.trim_end_matches(')')))
}

#[test]
fn the_estimate_is_within_its_margin_of_the_measured_peak() {
    if !cfg!(target_os = "linux") {
        return;
    }
    for sets in [
        &["task.vocab_size=20000", "model.d_model=128"][..],
        &[
            "train.batch_size=256",
            "task.seq_len=128",
            "task.vocab_size=256",
        ],
        &["attention=rebased", "train.batch_size=256"],
        &["attention=retention", "train.batch_size=256"],
        &["attention=gla", "train.batch_size=256"],
        &["attention=gated-deltanet", "train.batch_size=256"],
        &["attention=mamba2", "train.batch_size=256"],
        &[
            "encoding=learned",
            "task.seq_len=256",
            "task.vocab_size=512",
            "train.batch_size=128",
        ],
    ] {
        let (peak, estimate) = peak_and_estimate(sets);
        let ratio = estimate / peak;
        assert!(
            (0.9..=1.6).contains(&ratio),
            "{sets:?}: estimated {estimate:.3e} bytes, measured {peak:.3e} ({ratio:.2}x)"
        );
    }
}

#[test]
fn check_shows_the_estimate_and_refuses_what_cannot_fit() {
    let o = common::attnlab(&["check", "presets/mqar_softmax.toml"]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("# memory: ≈ "), "{stdout}");
    let o = common::attnlab(&[
        "check",
        "presets/mqar_softmax.toml",
        "--set",
        "model.d_model=8192",
        "--set",
        "model.n_layers=64",
    ]);
    let stderr = common::stderr(&o);
    assert!(!o.status.success());
    assert!(
        stderr.contains("more than the") && stderr.contains("lower model.d_model"),
        "{stderr}"
    );
}
