//! mad-lab's published data (Zenodo record 10843663): one folder per task setting, holding
//! `train/{inputs,targets}.npy` and `test/{inputs,targets}.npy`, rows × tokens of integers with
//! −100 where nothing is scored. attnlab's generators follow MAD's line by line but not NumPy's
//! random stream, so these files are the only way to train on MAD's exact rows
//! (`task.data`); `attnlab data import-mad DIR` reads a folder's settings from its name
//! (mad-lab's `paths.py`: `t-CR_vs-16_sl-128_ntr-12800_nte-1280_km-1_vm-1_mq-1_fn-0#0_nvs-0_
//! ntc-0_s-12345`) and checks its files.

use std::path::Path;

use candle_core::{DType, Tensor};

use super::mad::{MadConfig, Probe, Resolved};
use super::{IGNORE, mqar::QueryTruth};
use super::{Row, Split};
use crate::{Error, Result};

/// The files of a data folder.
pub const FILES: [&str; 4] = [
    "train/inputs.npy",
    "train/targets.npy",
    "test/inputs.npy",
    "test/targets.npy",
];

/// The largest `.npy` file read: a split of MAD's longest rows (12,800 × 1,024 int64s) is 105 MB.
const MAX_FILE: u64 = 1 << 31;

/// The rows of `split` in the data folder `dir`, checked against `resolved`: as many rows as
/// it asks, each of its row length, tokens in its vocabulary and targets in it or −100; with
/// the ground truth a generated row carries (recall at test, selective copying).
pub fn read_split(dir: &Path, split: Split, resolved: &Resolved) -> Result<Vec<Row>> {
    let folder = dir.join(match split {
        Split::Train => "train",
        Split::Test => "test",
    });
    let rows = match split {
        Split::Train => resolved.train_examples,
        Split::Test => resolved.test_examples,
    };
    let len = resolved.row_len();
    let inputs = read_matrix(&folder.join("inputs.npy"), (rows, len))?;
    let targets = read_matrix(&folder.join("targets.npy"), (rows, len))?;
    let vocab = resolved.vocab_size as i64;
    let bad = |file: &str, row: usize, value: i64, what: &str| Error::RunDir {
        message: format!(
            "row {row} holds {value}, not {what} (task.vocab_size = {vocab}): the task's \
             settings do not describe this data"
        ),
        path: folder.join(file),
    };
    let mut out = Vec::with_capacity(rows);
    for (i, (tokens, labels)) in inputs.chunks(len).zip(targets.chunks(len)).enumerate() {
        if let Some(&t) = tokens.iter().find(|&&t| !(0..vocab).contains(&t)) {
            return Err(bad("inputs.npy", i, t, "a token"));
        }
        if let Some(&t) = labels
            .iter()
            .find(|&&t| t != i64::from(IGNORE) && !(0..vocab).contains(&t))
        {
            return Err(bad("targets.npy", i, t, "a token or -100"));
        }
        let row = Row {
            inputs: tokens.iter().map(|&t| t as u32).collect(),
            labels: labels.iter().map(|&t| t as i32).collect(),
            queries: Vec::new(),
        };
        // mad-lab before commit 35772e8 wrote 16 tokens to copy whatever its `ntc` said.
        let scored = row.labels.iter().filter(|&&l| l != IGNORE).count();
        if resolved.probe == Probe::SelectiveCopying && scored != resolved.num_tokens_to_copy {
            return Err(Error::RunDir {
                message: format!(
                    "row {i} scores {scored} copied tokens where task.num_tokens_to_copy = {} \
                     (data made before mad-lab's commit 35772e8 copies 16 whatever its name says)",
                    resolved.num_tokens_to_copy
                ),
                path: folder.join("targets.npy"),
            });
        }
        out.push(with_truth(row, resolved, split));
    }
    Ok(out)
}

/// A `(rows, len)` matrix of integers from an `.npy` file, refused naming the file when it is
/// missing, not a regular file, too large, not integers, or of another shape.
fn read_matrix(path: &Path, (rows, len): (usize, usize)) -> Result<Vec<i64>> {
    let bad = |message: String| Error::RunDir {
        message,
        path: path.to_path_buf(),
    };
    let meta = std::fs::metadata(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
    if !meta.is_file() || meta.len() > MAX_FILE {
        return Err(bad(format!(
            "must be a regular .npy file of at most {MAX_FILE} bytes"
        )));
    }
    let tensor = Tensor::read_npy(path).map_err(|e| bad(format!("not a readable .npy: {e}")))?;
    if !matches!(
        tensor.dtype(),
        DType::I64 | DType::I32 | DType::U32 | DType::U8
    ) {
        return Err(bad(format!("holds {:?}, not integers", tensor.dtype())));
    }
    if tensor.dims() != [rows, len] {
        return Err(bad(format!(
            "has shape {:?} where the task's settings make {rows} rows of {len} tokens \
             (task.train_examples or task.test_examples, and task.length)",
            tensor.dims()
        )));
    }
    Ok(tensor
        .to_dtype(DType::I64)?
        .flatten_all()?
        .to_vec1::<i64>()?)
}

/// `row` with the ground truth its probe's generator writes: at test, each recalled value's
/// key and value positions (in-context and noisy recall); selective copying's j-th output the
/// j-th data token before the copy token.
fn with_truth(row: Row, resolved: &Resolved, split: Split) -> Row {
    match (resolved.probe, split) {
        (Probe::InContextRecall | Probe::NoisyInContextRecall, Split::Test) => {
            super::mad::with_recall_truth(row)
        }
        (Probe::SelectiveCopying, _) => with_copy_truth(row, resolved.vocab_size as u32),
        _ => row,
    }
}

/// Selective copying's truth read from the row: the data tokens (neither blank V − 2 nor the
/// copy token V − 1) before the copy token, in order, one per scored position.
fn with_copy_truth(mut row: Row, vocab: u32) -> Row {
    let (copy, blank) = (vocab - 1, vocab - 2);
    let end = row.inputs.iter().position(|&t| t == copy).unwrap_or(0);
    let data = (0..end).filter(|&p| row.inputs[p] != blank);
    let scored = (0..row.labels.len()).filter(|&p| row.labels[p] != IGNORE);
    row.queries = scored
        .zip(data)
        .map(|(position, at)| QueryTruth {
            position,
            key: blank,
            value: row.labels[position] as u32,
            key_positions: Vec::new(),
            value_positions: vec![at],
        })
        .collect();
    row
}

/// The task settings a folder of mad-lab's data names (`mad/paths.py`), with `data` set to
/// it: the probe (`t-CR`, `NR`, `FR`, `SC`, `C`, `M`), vocabulary, length, rows, motif sizes,
/// noise and tokens to copy, and the seed.
pub fn settings_of(dir: &Path) -> Result<MadConfig> {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let bad = |why: String| Error::RunDir {
        message: format!(
            "{why}; a folder of MAD's data is named as mad-lab's paths.py names it, e.g. \
             t-CR_vs-16_sl-128_ntr-12800_nte-1280_km-1_vm-1_mq-1_fn-0#0_nvs-0_ntc-0_s-12345"
        ),
        path: dir.to_path_buf(),
    };
    let field = |key: &str| -> Result<&str> {
        name.split('_')
            .find_map(|part| part.strip_prefix(key).and_then(|v| v.strip_prefix('-')))
            .ok_or_else(|| bad(format!("its name has no `{key}-` part")))
    };
    let number = |key: &str| -> Result<usize> {
        let value = field(key)?;
        value
            .parse()
            .map_err(|_| bad(format!("`{key}-{value}` is not a whole number")))
    };
    let probe = match field("t")? {
        "CR" => Probe::InContextRecall,
        "NR" => Probe::NoisyInContextRecall,
        "FR" => Probe::FuzzyInContextRecall,
        "SC" => Probe::SelectiveCopying,
        "C" => Probe::Compression,
        "M" => Probe::Memorization,
        other => return Err(bad(format!("`t-{other}` is none of CR, NR, FR, SC, C, M"))),
    };
    if number("mq")? != 1 {
        return Err(bad(format!(
            "`mq-{}`: attnlab's recall probes are MAD's multi-query form (mq-1) only",
            field("mq")?
        )));
    }
    let noise = field("fn")?.replace('#', ".");
    let frac_noise = noise
        .parse()
        .map_err(|_| bad(format!("`fn-{noise}` is not a fraction")))?;
    let seed = number("s")? as u64;
    let fuzzy = probe == Probe::FuzzyInContextRecall;
    Ok(MadConfig {
        probe,
        vocab_size: Some(number("vs")?),
        length: Some(number("sl")?),
        train_examples: Some(number("ntr")?),
        test_examples: Some(number("nte")?),
        noise_vocab_size: Some(number("nvs")?),
        frac_noise: Some(frac_noise),
        // mad-lab writes 1 for the probes without motifs, which attnlab's settings ignore.
        k_motif_size: fuzzy.then(|| number("km")).transpose()?,
        v_motif_size: fuzzy.then(|| number("vm")).transpose()?,
        num_tokens_to_copy: Some(number("ntc")?).filter(|&n| n > 0),
        seed: Some(seed),
        data: Some(dir.to_path_buf()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A version 1 `.npy` of int64s, as numpy writes `np.save`.
    fn write_npy(path: &Path, rows: usize, len: usize, values: &[i64]) {
        let tensor = Tensor::from_vec(values.to_vec(), (rows, len), &candle_core::Device::Cpu);
        tensor.unwrap().write_npy(path).unwrap();
    }

    /// A folder of data in mad-lab's layout from generated rows.
    fn folder(dir: &Path, config: &Resolved) {
        for (split, name, n) in [
            (Split::Train, "train", config.train_examples),
            (Split::Test, "test", config.test_examples),
        ] {
            std::fs::create_dir_all(dir.join(name)).unwrap();
            let rows = config.rows(split, n);
            let len = config.row_len();
            let inputs: Vec<i64> = rows
                .iter()
                .flat_map(|r| &r.inputs)
                .map(|&t| t.into())
                .collect();
            let targets: Vec<i64> = rows
                .iter()
                .flat_map(|r| &r.labels)
                .map(|&t| t.into())
                .collect();
            write_npy(&dir.join(name).join("inputs.npy"), n, len, &inputs);
            write_npy(&dir.join(name).join("targets.npy"), n, len, &targets);
        }
    }

    /// Rows written in mad-lab's layout read back equal, ground truth included, for every probe
    /// that has one; the folder's name gives back the settings.
    #[test]
    fn published_rows_read_back_with_their_ground_truth() {
        let tmp = tempfile::tempdir().unwrap();
        for probe in [
            Probe::InContextRecall,
            Probe::SelectiveCopying,
            Probe::Compression,
        ] {
            let config = MadConfig {
                probe,
                train_examples: Some(5),
                test_examples: Some(3),
                ..MadConfig::default()
            }
            .resolved();
            let code = match probe {
                Probe::InContextRecall => "CR",
                Probe::SelectiveCopying => "SC",
                _ => "C",
            };
            let name = format!(
                "t-{code}_vs-{}_sl-{}_ntr-5_nte-3_km-1_vm-1_mq-1_fn-0#0_nvs-0_ntc-{}_s-12345",
                config.vocab_size, config.length, config.num_tokens_to_copy
            );
            let dir = tmp.path().join(name);
            folder(&dir, &config);
            let settings = settings_of(&dir).unwrap();
            assert_eq!(settings.resolved(), config, "{probe:?}");
            for split in [Split::Train, Split::Test] {
                let n = if split == Split::Train { 5 } else { 3 };
                let read = read_split(&dir, split, &config).unwrap();
                assert_eq!(read, config.rows(split, n), "{probe:?} {split:?}");
            }
        }
    }

    /// Data the settings do not describe is refused naming the file and what differs.
    #[test]
    fn data_that_does_not_fit_the_settings_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let config = MadConfig {
            train_examples: Some(4),
            test_examples: Some(2),
            ..MadConfig::default()
        }
        .resolved();
        folder(tmp.path(), &config);
        let more = Resolved {
            train_examples: 6,
            ..config
        };
        let smaller = Resolved {
            vocab_size: 8,
            ..config
        };
        for (settings, named) in [(more, "inputs.npy"), (smaller, "task.vocab_size = 8")] {
            let err = read_split(tmp.path(), Split::Train, &settings).unwrap_err();
            assert!(err.to_string().contains(named), "{err}");
        }
        let err = read_split(&tmp.path().join("none"), Split::Test, &config).unwrap_err();
        assert!(err.to_string().contains("cannot read it"), "{err}");
        let err = settings_of(Path::new("t-XY_vs-3")).unwrap_err().to_string();
        assert!(err.contains("t-XY") && err.contains("paths.py"), "{err}");
        let single = "t-CR_vs-16_sl-128_ntr-5_nte-3_km-1_vm-1_mq-0_fn-0#0_nvs-0_ntc-0_s-12345";
        let err = settings_of(Path::new(single)).unwrap_err().to_string();
        assert!(err.contains("mq-0"), "{err}");
        // Selective copying written with 16 tokens to copy, read as if it had 8.
        let copying = MadConfig {
            probe: Probe::SelectiveCopying,
            train_examples: Some(2),
            test_examples: Some(2),
            ..MadConfig::default()
        }
        .resolved();
        let dir = tmp.path().join("copying");
        folder(&dir, &copying);
        let fewer = Resolved {
            num_tokens_to_copy: 8,
            ..copying
        };
        let err = read_split(&dir, Split::Test, &fewer)
            .unwrap_err()
            .to_string();
        assert!(err.contains("num_tokens_to_copy = 8"), "{err}");
    }
}
