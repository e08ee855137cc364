//! TensorBoard event files, so that `tensorboard --logdir runs/` (and `wandb sync`) show
//! attnlab's runs beside PyTorch's: scalars, images and the HParams plugin's sessions.
//!
//! An event file is a sequence of TFRecords, each one serialised `Event` protobuf
//! (`../shared/reference/mixers-mad-checkpoints.md` §4.2 gives the messages and tag numbers,
//! checked against TensorBoard's `plugin_data.proto` and `api.proto`). The messages are
//! encoded here by hand ([`proto`]): the maintained crates either leave HParams
//! unimplemented or bring a protobuf code generator with them. `scripts/check_tensorboard.py`
//! reads a run's file back with TensorBoard's own reader, and `tests/fixtures/tensorboard/` holds a
//! file it accepted, which the writer must reproduce byte for byte.
//!
//! The run folder's `metrics.jsonl` and `summary.json` stay the source of truth; this is a
//! second sink, appended to record by record (a crash loses at most the record being written,
//! which TensorBoard's reader skips).

mod proto;

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use proto::Message;

use crate::{Error, Result};

/// The name every event file starts with; TensorBoard reads the files whose names contain
/// `tfevents`.
pub const FILE_PREFIX: &str = "events.out.tfevents.";

/// CRC-32C (Castagnoli), which TFRecord framing uses (not the IEEE CRC-32 of zip and PNG).
const CASTAGNOLI: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);

/// TFRecord's masked CRC-32C of `data` (masked so that a CRC of data that holds CRCs stays
/// well distributed).
pub fn masked_crc(data: &[u8]) -> u32 {
    let crc = CASTAGNOLI.checksum(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// `data` framed as one TFRecord: its length (u64 LE), the length's masked CRC (u32 LE), the
/// data, the data's masked CRC.
fn record(data: &[u8]) -> Vec<u8> {
    let length = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&length);
    out.extend_from_slice(&masked_crc(&length).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

/// The records of an event file's bytes, each checked against its CRCs: what a reader of
/// attnlab's files (and the tests) sees. A truncated last record (a crash while writing it)
/// is left out, as TensorBoard's reader does.
pub fn read_records(bytes: &[u8]) -> std::result::Result<Vec<&[u8]>, String> {
    let mut records = Vec::new();
    let mut rest = bytes;
    while rest.len() >= 12 {
        let (length, crc) = (&rest[..8], &rest[8..12]);
        if u32::from_le_bytes(crc.try_into().unwrap_or_default()) != masked_crc(length) {
            return Err(format!(
                "record {}: the length's CRC does not match",
                records.len()
            ));
        }
        let n = u64::from_le_bytes(length.try_into().unwrap_or_default());
        let Some(end) = usize::try_from(n).ok().and_then(|n| n.checked_add(16)) else {
            return Err(format!("record {}: length {n} is too large", records.len()));
        };
        if rest.len() < end {
            break;
        }
        let data = &rest[12..end - 4];
        if rest[end - 4..end] != masked_crc(data).to_le_bytes() {
            return Err(format!(
                "record {}: the data's CRC does not match",
                records.len()
            ));
        }
        records.push(data);
        rest = &rest[end..];
    }
    Ok(records)
}

/// A hyperparameter's value, as the HParams plugin types it.
#[derive(Clone, Debug, PartialEq)]
pub enum HParam {
    Number(f64),
    Text(String),
    Bool(bool),
}

/// A PNG image for TensorBoard's image dashboard.
#[derive(Clone, Debug, PartialEq)]
pub struct Image {
    pub width: u32,
    pub height: u32,
    pub png: Vec<u8>,
}

/// The events of one run, appended to one file in `folder`.
#[derive(Debug)]
pub struct EventWriter {
    path: PathBuf,
}

impl EventWriter {
    /// A new event file in `folder` (created if missing), named as TensorBoard's writers name
    /// theirs (`events.out.tfevents.<unix seconds>.<host>`), holding its first event, the
    /// file version. A second file of the same second gets a number after the name.
    pub fn create(folder: &Path) -> Result<Self> {
        std::fs::create_dir_all(folder)
            .map_err(|e| Error::io("cannot create the folder", folder, e))?;
        let now = wall_time();
        let stem = format!("{FILE_PREFIX}{}.{}", now as u64, host_name());
        let mut path = folder.join(&stem);
        for n in 1.. {
            if !path.exists() {
                break;
            }
            path = folder.join(format!("{stem}.{n}"));
        }
        let writer = Self { path };
        writer.append(&file_version(now))?;
        Ok(writer)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `values` at `step`, one event.
    pub fn scalars(&self, step: usize, values: &[(&str, f64)]) -> Result<()> {
        let values: Vec<Message> = values
            .iter()
            .map(|&(tag, value)| scalar(tag, value))
            .collect();
        self.append(&summary(wall_time(), step, &values))
    }

    /// `image` under `tag` at `step`.
    pub fn image(&self, step: usize, tag: &str, image: &Image) -> Result<()> {
        self.append(&summary(wall_time(), step, &[image_value(tag, image)]))
    }

    /// The start of this run's HParams session, with the values of `hparams`.
    ///
    /// No `_hparams_/experiment` summary goes with it, as PyTorch's `add_hparams` writes:
    /// TensorBoard takes the first experiment it finds for the whole log folder, so in a sweep
    /// over mechanisms one run's settings would hide the others' (retention's γ under a
    /// softmax run's columns). Without one, TensorBoard builds the experiment from every run's
    /// session: each setting any run has, marked where runs differ, and every scalar tag as a
    /// metric (checked with TensorBoard 2.21's HParams plugin).
    pub fn session_start(&self, hparams: &[(String, HParam)]) -> Result<()> {
        let now = wall_time();
        self.append(&summary(now, 0, &[session_start(hparams, now)]))
    }

    /// The successful end of this run's session.
    pub fn session_end(&self, step: usize) -> Result<()> {
        let now = wall_time();
        self.append(&summary(now, step, &[session_end(now)]))
    }

    /// Marks a restart at `step` (a resumed run): TensorBoard drops the events of this run
    /// from `step` on that earlier files hold, as they are trained again.
    pub fn restart(&self, step: usize) -> Result<()> {
        self.append(&restart(wall_time(), step))
    }

    fn append(&self, event: &Message) -> Result<()> {
        crate::io::append_bytes(&self.path, &record(event.as_bytes()))
    }
}

/// Seconds since the Unix epoch, as events carry them.
fn wall_time() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// This machine's name for the file name, only the characters a file name keeps everywhere.
fn host_name() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .unwrap_or_default();
    let name: String = name
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
        .collect();
    if name.is_empty() {
        "localhost".into()
    } else {
        name
    }
}

/// `Event { wall_time = 1; step = 2; … }`.
fn event(wall_time: f64, step: usize) -> Message {
    Message::new().double(1, wall_time).uint(2, step as u64)
}

/// The first event of every file: `file_version = 3`.
fn file_version(wall_time: f64) -> Message {
    Message::new()
        .double(1, wall_time)
        .string(3, "brain.Event:2")
}

/// An event of `Summary { repeated Value value = 1 }` in `summary = 5`.
fn summary(wall_time: f64, step: usize, values: &[Message]) -> Message {
    let summary = values
        .iter()
        .fold(Message::new(), |summary, value| summary.message(1, value));
    event(wall_time, step).message(5, &summary)
}

/// `Value { tag = 1; simple_value = 2 }`. TensorBoard stores scalars as f32.
fn scalar(tag: &str, value: f64) -> Message {
    Message::new().string(1, tag).float(2, value as f32)
}

/// `Value { tag = 1; image = 4 }`: `Image { height = 1; width = 2; colorspace = 3 (4,
/// RGBA: the PNGs are written with an alpha channel); encoded_image_string = 4 }`. Without
/// metadata: TensorBoard moves a value without it to the images plugin, and leaves one with
/// metadata but no plugin out of every dashboard.
fn image_value(tag: &str, image: &Image) -> Message {
    let encoded = Message::new()
        .uint(1, u64::from(image.height))
        .uint(2, u64::from(image.width))
        .uint(3, 4)
        .bytes(4, &image.png);
    Message::new().string(1, tag).message(4, &encoded)
}

/// The HParams plugin's `HParamsPluginData { version = 1 (0); <data> = field }` as a summary
/// value under `tag`, with the empty float tensor PyTorch's writer gives it (TensorBoard's
/// data-compat layer reads the value as a tensor).
fn hparams_value(tag: &str, field: u32, data: &Message) -> Message {
    let content = Message::new().uint(1, 0).message(field, data);
    let plugin = Message::new().string(1, "hparams").message(2, &content);
    let metadata = Message::new().message(1, &plugin);
    let shape = Message::new().message(2, &Message::new().uint(1, 0));
    let tensor = Message::new().uint(1, 1).message(2, &shape);
    Message::new()
        .string(1, tag)
        .message(8, &tensor)
        .message(9, &metadata)
}

/// `SessionStartInfo { hparams = 1 (map entries { key = 1; value = 2: google.protobuf.Value
/// { number_value = 2 | string_value = 3 | bool_value = 4 } }); start_time_secs = 5 }` under
/// `_hparams_/session_start_info`.
fn session_start(hparams: &[(String, HParam)], start: f64) -> Message {
    let info = hparams.iter().fold(Message::new(), |info, (name, value)| {
        let value = match value {
            HParam::Number(x) => Message::new().double(2, *x),
            HParam::Text(s) => Message::new().string(3, s),
            HParam::Bool(b) => Message::new().uint(4, u64::from(*b)),
        };
        info.message(1, &Message::new().string(1, name).message(2, &value))
    });
    hparams_value("_hparams_/session_start_info", 3, &info.double(5, start))
}

/// `SessionEndInfo { status = 1 (STATUS_SUCCESS); end_time_secs = 2 }` under
/// `_hparams_/session_end_info`.
fn session_end(end: f64) -> Message {
    let info = Message::new().uint(1, 1).double(2, end);
    hparams_value("_hparams_/session_end_info", 4, &info)
}

/// An event of `session_log = 7: SessionLog { status = 1 (START) }` at `step`: TensorBoard's
/// reader then purges the run's earlier events at `step` and after.
fn restart(wall_time: f64, step: usize) -> Message {
    event(wall_time, step).message(7, &Message::new().uint(1, 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The check value of CRC-32C (the CRC catalogue's "123456789" → 0xE3069283), and the
    /// mask TensorFlow's `masked_crc32c` applies (an empty input's CRC is 0).
    #[test]
    fn crcs_are_castagnoli_and_masked_as_tensorflow_masks_them() {
        assert_eq!(CASTAGNOLI.checksum(b"123456789"), 0xe306_9283);
        assert_eq!(masked_crc(b""), 0xa282_ead8);
    }

    #[test]
    fn records_read_back_and_damage_is_found() {
        let mut bytes = record(b"first");
        bytes.extend(record(b""));
        bytes.extend(record(&[7; 300]));
        let records = read_records(&bytes).unwrap();
        assert_eq!(records, [&b"first"[..], b"", &[7; 300]]);
        // A crash in the middle of the last record: the others stay readable.
        assert_eq!(read_records(&bytes[..bytes.len() - 5]).unwrap().len(), 2);
        let mut damaged = bytes.clone();
        damaged[14] ^= 1;
        let error = read_records(&damaged).unwrap_err();
        assert_eq!(error, "record 0: the data's CRC does not match");
        damaged = bytes;
        damaged[0] ^= 1;
        assert!(read_records(&damaged).unwrap_err().contains("length's CRC"));
    }

    /// A 1×1 red PNG (as any encoder writes it), so the golden file does not move with the
    /// PNG encoder's version.
    const RED_PIXEL: &[u8] = &[
        0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44,
        0x52, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x02, 0x00, 0x00, 0x00, 0x90,
        0x77, 0x53, 0xde, 0x00, 0x00, 0x00, 0x0c, 0x49, 0x44, 0x41, 0x54, 0x78, 0xda, 0x63, 0xf8,
        0xcf, 0xc0, 0x00, 0x00, 0x03, 0x01, 0x01, 0x00, 0xf7, 0x03, 0x41, 0x43, 0x00, 0x00, 0x00,
        0x00, 0x49, 0x45, 0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
    ];

    /// Every kind of event the writer writes, at fixed times.
    fn golden_events() -> Vec<u8> {
        let hparams = [
            ("attention.kind".to_string(), HParam::Text("softmax".into())),
            ("model.d_model".to_string(), HParam::Number(128.0)),
            ("train.tensorboard".to_string(), HParam::Bool(true)),
        ];
        let red = Image {
            width: 1,
            height: 1,
            png: RED_PIXEL.to_vec(),
        };
        let start = 1_700_000_000.0;
        let events = [
            file_version(start),
            summary(start, 0, &[session_start(&hparams, start)]),
            summary(
                start + 1.0,
                1,
                &[scalar("train/loss", 2.5), scalar("train/lr", 1e-3)],
            ),
            summary(start + 2.0, 1, &[image_value("attention/L0H0", &red)]),
            // Trained again after the restart: the reader keeps only the second value.
            summary(start + 2.5, 2, &[scalar("test/accuracy", 0.5)]),
            restart(start + 3.0, 2),
            summary(start + 4.0, 2, &[scalar("test/accuracy", 0.75)]),
            summary(start + 5.0, 2, &[session_end(start + 5.0)]),
        ];
        events.iter().flat_map(|e| record(e.as_bytes())).collect()
    }

    /// The writer's bytes against a file TensorBoard's reader accepted
    /// (`scripts/check_tensorboard.py --golden tests/fixtures/tensorboard`). After a deliberate change of
    /// the format, `ATTNLAB_BLESS=1` writes the file anew: check it with the script again.
    #[test]
    fn events_are_the_bytes_tensorboard_read_back() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/tensorboard/events.out.tfevents.1700000000.golden");
        let bytes = golden_events();
        if std::env::var_os("ATTNLAB_BLESS").is_some() {
            std::fs::write(&path, &bytes).unwrap();
        }
        let golden = std::fs::read(&path).unwrap();
        assert!(
            bytes == golden,
            "{} differs from the writer's",
            path.display()
        );
        assert_eq!(read_records(&golden).unwrap().len(), 8);
    }

    #[test]
    fn a_writer_appends_framed_events_to_a_new_file_each_time() {
        let dir = tempfile::tempdir().unwrap();
        let first = EventWriter::create(dir.path()).unwrap();
        first.scalars(1, &[("train/loss", 1.0)]).unwrap();
        let second = EventWriter::create(dir.path()).unwrap();
        assert_ne!(first.path(), second.path());
        let name = first.path().file_name().unwrap().to_str().unwrap();
        assert!(name.starts_with(FILE_PREFIX), "{name}");
        let bytes = std::fs::read(first.path()).unwrap();
        let records = read_records(&bytes).unwrap();
        assert_eq!(records.len(), 2);
        assert!(records[0].ends_with(b"brain.Event:2"));
        assert!(records[1].windows(10).any(|w| w == b"train/loss"));
    }
}
