//! Trainable parameters: a named store of candle `Var`s with seeded initialisation.
//!
//! Why not candle-nn's `VarMap`/`VarBuilder`: their initialisers draw from candle's CPU
//! generator, which cannot be seeded, so two runs of the same preset would differ. Here each
//! parameter is initialised from its own stream `(seed, name)`, which also makes a parameter's
//! initial value independent of the order in which the model is built.
//!
//! Asking twice for the same name returns the same `Var`: that is how Linformer's layer-wise
//! shared projection is shared.
//!
//! **Replicas.** `Params::replicated(seeds)` builds R models at once (a sweep's cells that
//! differ only in seed, learning rate and the like, trained as one batched computation): every
//! parameter gets a leading dimension R, and replica r's slice is initialised from
//! `(seeds[r], name)`, exactly as a lone model with seed `seeds[r]` would be. The layers read
//! [`Params::replicas`] and stack their computation along that dimension.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use candle_core::{DType, Device, Shape, Tensor, Var};

use crate::rng;
use crate::{Error, Result};

/// How a new parameter is initialised. The defaults follow PyTorch's modules so that the
/// benchmark compares like with like (see docs/performance.md).
#[derive(Clone, Copy, Debug)]
pub enum Init {
    /// U(−bound, bound); PyTorch `nn.Linear` uses bound = 1/√fan_in for weight and bias.
    Uniform(f64),
    /// N(0, std²); PyTorch `nn.Embedding` uses std = 1.
    Normal(f64),
    /// U(lo, hi): KERPLE's per-head parameters (r ~ U(0, 2), k ~ U(0, 1) in its reference).
    Between(f64, f64),
    Constant(f64),
    /// ln U(lo, hi): Mamba-2's and Gated DeltaNet's A_log (A ~ U(0, 16), stored as its log).
    LogOfUniform(f64, f64),
    /// softplus⁻¹(dt) with dt = exp(U(ln lo, ln hi)), at least 1e-4: Mamba-2's and Gated
    /// DeltaNet's dt_bias, so that softplus(dt_bias) starts log-uniform in [lo, hi].
    InverseSoftplusLogUniform(f64, f64),
}

/// The largest magnitude a trained parameter may reach: past it f32 no longer resolves an
/// AdamW step (about the learning rate; at 1e8 neighbouring floats are 8 apart), and a forward
/// pass overflows soon after, so a run whose weights got there has diverged (a weight decay of
/// 1e12 kept a checkpoint of weights near 9e18 whose loss was not finite).
pub const EXPLODED: f32 = 1e8;

#[derive(Default)]
struct Store {
    vars: BTreeMap<String, Var>,
}

/// Builds parameters under a name prefix (`blocks.0.attn.wqkv.weight`), like candle's `vb.pp`.
#[derive(Clone)]
pub struct Params {
    store: Arc<Mutex<Store>>,
    prefix: String,
    /// One seed per replica; a lone model has one and no replica dimension.
    seeds: Arc<[u64]>,
    replicated: bool,
    /// New parameters start as zeros, not drawn: their values are loaded right after the build.
    to_be_loaded: bool,
    device: Device,
}

impl Params {
    pub fn new(seed: u64, device: &Device) -> Self {
        Self {
            store: Arc::new(Mutex::new(Store::default())),
            prefix: String::new(),
            seeds: Arc::from([seed]),
            replicated: false,
            to_be_loaded: false,
            device: device.clone(),
        }
    }

    /// Parameters whose values come from a checkpoint right after the model is built (a
    /// pretrained model's): created as zeros, not drawn from their initialisers, which took a
    /// third of a GPT-2 small load (124 M random values).
    pub fn to_be_loaded(device: &Device) -> Self {
        Self {
            to_be_loaded: true,
            ..Self::new(0, device)
        }
    }

    /// Parameters of `seeds.len()` replicas: each parameter is stacked along a leading
    /// dimension, replica r's slice initialised as `Params::new(seeds[r], …)` would.
    pub fn replicated(seeds: &[u64], device: &Device) -> Self {
        Self {
            seeds: Arc::from(seeds),
            replicated: true,
            ..Self::new(0, device)
        }
    }

    /// The number of replicas when the parameters are stacked, `None` for a lone model.
    pub fn replicas(&self) -> Option<usize> {
        self.replicated.then_some(self.seeds.len())
    }

    /// The same store, with `name` appended to the prefix.
    pub fn pp(&self, name: impl AsRef<str>) -> Self {
        Self {
            prefix: self.full_name(name.as_ref()),
            ..self.clone()
        }
    }

    /// The same store with no prefix, for parameters shared across layers.
    pub fn root(&self) -> Self {
        Self {
            prefix: String::new(),
            ..self.clone()
        }
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    fn full_name(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.prefix)
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        // A poisoned lock only means another thread panicked mid-insert; the map itself is intact.
        self.store
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The parameter `name` of `shape` (with replicas, (R, …shape)), created with `init` if it
    /// does not exist yet.
    pub fn get(&self, name: &str, shape: impl Into<Shape>, init: Init) -> Result<Tensor> {
        let mut shape: Shape = shape.into();
        if let Some(r) = self.replicas() {
            shape = Shape::from([&[r], shape.dims()].concat());
        }
        let full = self.full_name(name);
        if let Some(var) = self.lock().vars.get(&full) {
            if var.shape() != &shape {
                return Err(Error::Internal(format!(
                    "parameter {full} requested with shape {shape:?} but exists with {:?}",
                    var.shape()
                )));
            }
            return Ok(var.as_tensor().clone());
        }
        if self.to_be_loaded {
            let var = Var::zeros(shape, DType::F32, &self.device)?;
            let tensor = var.as_tensor().clone();
            self.lock().vars.insert(full, var);
            return Ok(tensor);
        }
        let n = shape.elem_count() / self.seeds.len();
        let data: Vec<f32> = self
            .seeds
            .iter()
            .flat_map(|&seed| initial_values(init, seed, &full, n))
            .collect();
        let var = Var::from_tensor(&Tensor::from_vec(data, shape, &self.device)?)?;
        let tensor = var.as_tensor().clone();
        self.lock().vars.insert(full, var);
        Ok(tensor)
    }

    /// A new store with replicas `keep` of this one (their slices, in that order, and their
    /// seeds): what a group trains on once other replicas have finished.
    pub fn select_replicas(&self, keep: &[usize]) -> Result<Self> {
        let index = Tensor::from_vec(
            keep.iter().map(|&r| r as u32).collect::<Vec<_>>(),
            keep.len(),
            &self.device,
        )?;
        let vars = self
            .lock()
            .vars
            .iter()
            .map(|(name, var)| {
                let kept = var.as_tensor().index_select(&index, 0)?;
                Ok((name.clone(), Var::from_tensor(&kept)?))
            })
            .collect::<Result<BTreeMap<_, _>>>()?;
        Ok(Self {
            store: Arc::new(Mutex::new(Store { vars })),
            prefix: String::new(),
            seeds: keep.iter().map(|&r| self.seeds[r]).collect(),
            replicated: true,
            to_be_loaded: false,
            device: self.device.clone(),
        })
    }

    /// Writes replica `replica`'s parameters to a safetensors file (atomically), under the
    /// names and shapes a lone model has: its run folder reads like any other; `step`, the
    /// training step, goes in its header.
    pub fn save_replica(&self, replica: usize, path: &Path, step: Option<usize>) -> Result<()> {
        let tensors = self
            .lock()
            .vars
            .iter()
            .map(|(name, var)| Ok((name.clone(), var.as_tensor().get(replica)?)))
            .collect::<Result<std::collections::HashMap<String, Tensor>>>()?;
        save_tensors(&tensors, path, step)
    }

    /// The first parameter (by name) that a run cannot go on from, and why: one holding a NaN
    /// or an infinity, or one past ±[`EXPLODED`]; of replica `replica` when the parameters are
    /// stacked replicas, else of the whole model.
    pub fn first_unusable(&self, replica: Option<usize>) -> Result<Option<(String, String)>> {
        for (name, var) in self.lock().vars.iter() {
            let tensor = match replica {
                Some(r) => var.as_tensor().get(r)?,
                None => var.as_tensor().clone(),
            };
            let scalar = |t: Tensor| -> Result<f32> { Ok(t.to_dtype(DType::F32)?.to_scalar()?) };
            // 0·x is 0 for finite x and NaN otherwise, so the sum is finite iff every x is.
            if !scalar(tensor.affine(0.0, 0.0)?.sum_all()?)?.is_finite() {
                return Ok(Some((name.clone(), "is not finite".into())));
            }
            let largest = scalar(tensor.abs()?.flatten_all()?.max(0)?)?;
            if largest > EXPLODED {
                let why = format!("reached {largest:.2e}, past ±{EXPLODED:.0e}");
                return Ok(Some((name.clone(), why)));
            }
        }
        Ok(None)
    }

    /// All trainable variables, sorted by name.
    pub fn vars(&self) -> Vec<(String, Var)> {
        self.lock()
            .vars
            .iter()
            .map(|(name, var)| (name.clone(), var.clone()))
            .collect()
    }

    /// Number of trainable scalars of one model (of each replica's).
    pub fn count(&self) -> usize {
        let all: usize = self.lock().vars.values().map(|v| v.elem_count()).sum();
        all / self.seeds.len()
    }

    /// Writes every parameter to a safetensors file (atomically), `step`, the training step,
    /// in its header.
    pub fn save(&self, path: &Path, step: Option<usize>) -> Result<()> {
        let tensors: std::collections::HashMap<String, Tensor> = self
            .lock()
            .vars
            .iter()
            .map(|(name, var)| (name.clone(), var.as_tensor().clone()))
            .collect();
        save_tensors(&tensors, path, step)
    }

    /// Overwrites every parameter with the values stored in a safetensors file. A parameter
    /// missing, of another shape (a preset that does not match the checkpoint) or holding NaN
    /// or infinity is an error naming it and the file.
    pub fn load(&self, path: &Path) -> Result<()> {
        let bad = |message: String| Error::RunDir {
            message,
            path: path.to_path_buf(),
        };
        let loaded = load_tensors(path, "checkpoint", &self.device)?;
        for (name, var) in self.lock().vars.iter() {
            let value = loaded
                .get(name)
                .ok_or_else(|| bad(format!("checkpoint has no parameter {name}")))?;
            if value.dims() != var.dims() {
                return Err(bad(format!(
                    "checkpoint parameter {name} has shape {:?}, the preset's model {:?}",
                    value.dims(),
                    var.dims()
                )));
            }
            var.set(&value.to_dtype(DType::F32)?)?;
        }
        match self.first_unusable(None)? {
            Some((name, why)) => Err(bad(format!("checkpoint parameter {name} {why}"))),
            None => Ok(()),
        }
    }
}

/// Every tensor of a safetensors file (`what`, e.g. "checkpoint"), on `device`: a regular file
/// only, read no further than its size ([`io::read_bytes`]; candle's `load` reads a FIFO or
/// `/dev/zero` until it blocks or memory runs out).
pub(crate) fn load_tensors(
    path: &Path,
    what: &str,
    device: &Device,
) -> Result<std::collections::HashMap<String, Tensor>> {
    let bytes = crate::io::read_bytes(path, what)?;
    candle_core::safetensors::load_buffer(&bytes, device).map_err(|e| Error::RunDir {
        message: format!("cannot read {what} ({e})"),
        path: path.to_path_buf(),
    })
}

/// The key of a checkpoint header's metadata that holds the training step it was saved at.
const STEP_METADATA: &str = "step";

/// The most bytes a safetensors header may declare before [`saved_step`] refuses to read it
/// (a model of 100k tensors has a header of a few MB).
const MAX_HEADER: u64 = 100 << 20;

/// Writes `tensors` to a safetensors file atomically, with the training `step` it holds in its
/// header's metadata where given, with the permissions of the run folder's other files (0666
/// less the umask, what `File::create` gives): the safetensors crate creates its files 0600,
/// so a checkpoint in a shared run folder was unreadable to colleagues, and a fixed 0644 made
/// it readable to all under `umask 077`, which every other file of the run respects.
pub(crate) fn save_tensors(
    tensors: &std::collections::HashMap<String, Tensor>,
    path: &Path,
    step: Option<usize>,
) -> Result<()> {
    crate::io::write_atomically(path, |tmp| {
        let permissions = std::fs::File::create(tmp)
            .and_then(|file| file.metadata())
            .map_err(|e| Error::io("cannot write checkpoint", path, e))?
            .permissions();
        let metadata = step.map(|s| [(STEP_METADATA.to_string(), s.to_string())].into());
        // candle's error would not say which file (a full disk read "No space left on device").
        safetensors::serialize_to_file(tensors.iter(), metadata, tmp).map_err(|e| {
            Error::io(
                "cannot write checkpoint",
                path,
                std::io::Error::other(e.to_string()),
            )
        })?;
        std::fs::set_permissions(tmp, permissions)
            .map_err(|e| Error::io("cannot set the checkpoint's permissions", tmp, e))
    })
}

/// The training step a safetensors file was saved at ([`save_tensors`]), read from its header
/// alone; `None` for a file saved without one (before attnlab recorded it).
pub fn saved_step(path: &Path) -> Result<Option<usize>> {
    use std::io::Read as _;
    let bad = |why: String| Error::RunDir {
        message: format!("cannot read the checkpoint's header: {why}"),
        path: path.to_path_buf(),
    };
    let file_len =
        crate::io::regular_file_len(path, "cannot read the checkpoint's header", u64::MAX)?;
    let mut file = std::fs::File::open(path).map_err(|e| Error::io("cannot open", path, e))?;
    let mut len = [0u8; 8];
    file.read_exact(&mut len)
        .map_err(|e| Error::io("cannot read", path, e))?;
    let len = u64::from_le_bytes(len);
    if len > MAX_HEADER.min(file_len.saturating_sub(8)) {
        return Err(bad(format!("it declares {len} bytes")));
    }
    let mut header = vec![0u8; len as usize];
    file.read_exact(&mut header)
        .map_err(|e| Error::io("cannot read", path, e))?;
    let header: serde_json::Value =
        serde_json::from_slice(&header).map_err(|e| bad(e.to_string()))?;
    let step = header
        .get("__metadata__")
        .and_then(|m| m.get(STEP_METADATA))
        .and_then(|s| s.as_str());
    step.map(|s| s.parse().map_err(|_| bad(format!("step {s:?}"))))
        .transpose()
}

/// The first `n` values of `init` for parameter `name` of a model seeded `seed`.
fn initial_values(init: Init, seed: u64, name: &str, n: usize) -> Vec<f32> {
    let mut stream = rng::stream(seed, name);
    match init {
        Init::Uniform(bound) => rng::uniform_vec(&mut stream, n, bound),
        Init::Normal(std) => rng::normal_vec(&mut stream, n, std),
        Init::Between(lo, hi) => rng::uniform_vec(&mut stream, n, (hi - lo) / 2.0)
            .into_iter()
            .map(|x| x + ((lo + hi) / 2.0) as f32)
            .collect(),
        Init::Constant(value) => vec![value as f32; n],
        Init::LogOfUniform(lo, hi) => initial_values(Init::Between(lo, hi), seed, name, n)
            .into_iter()
            .map(|a| a.max(1e-4).ln())
            .collect(),
        Init::InverseSoftplusLogUniform(lo, hi) => {
            initial_values(Init::Between(lo.ln(), hi.ln()), seed, name, n)
                .into_iter()
                .map(|log_dt| {
                    let dt = f64::from(log_dt).exp().max(1e-4);
                    (dt + (-(-dt).exp_m1()).ln()) as f32
                })
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A_log is the log of U(0, 16); softplus(dt_bias) is log-uniform in [1e-3, 0.1].
    #[test]
    fn mamba_style_inits_land_in_their_ranges() {
        let a_log = initial_values(Init::LogOfUniform(0.0, 16.0), 1, "a", 1000);
        assert!(a_log.iter().all(|&a| a <= 16f32.ln() + 1e-6));
        assert!(a_log.iter().any(|&a| a < 0.0) && a_log.iter().any(|&a| a > 2.0));
        let dt_bias = initial_values(Init::InverseSoftplusLogUniform(1e-3, 0.1), 1, "dt", 1000);
        for b in dt_bias {
            let dt = f64::from(b).exp().ln_1p();
            assert!((0.999e-3..=0.1001).contains(&dt), "{dt}");
        }
    }

    #[test]
    fn same_seed_and_name_give_same_values_regardless_of_order() {
        let a = Params::new(3, &Device::Cpu);
        let b = Params::new(3, &Device::Cpu);
        let a1 = a.pp("x").get("w", (2, 3), Init::Normal(1.0)).unwrap();
        let _ = b.get("other", 5, Init::Normal(1.0)).unwrap();
        let b1 = b.pp("x").get("w", (2, 3), Init::Normal(1.0)).unwrap();
        assert_eq!(
            a1.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            b1.flatten_all().unwrap().to_vec1::<f32>().unwrap()
        );
        assert_eq!(a.count(), 6);
        assert_eq!(b.count(), 11);
    }

    /// A write that fails (a full disk, a missing folder) names the checkpoint, which candle's
    /// own error does not.
    #[test]
    fn a_checkpoint_that_cannot_be_written_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("not-a-folder");
        std::fs::write(&blocker, b"x").unwrap();
        let params = Params::new(0, &Device::Cpu);
        params.get("w", 4, Init::Constant(1.0)).unwrap();
        let path = blocker.join("model.safetensors");
        let err = params.save(&path, None).unwrap_err().to_string();
        assert!(
            err.contains("cannot write checkpoint") && err.contains("model.safetensors"),
            "{err}"
        );
    }

    /// A checkpoint is only written when this finds nothing, so it must see a single NaN,
    /// infinity or exploded weight, in the right replica.
    #[test]
    fn unusable_parameters_are_found_per_replica() {
        let stacked = Params::replicated(&[0, 1], &Device::Cpu);
        stacked.pp("a").get("w", 3, Init::Normal(1.0)).unwrap();
        stacked.pp("b").get("w", 3, Init::Normal(1.0)).unwrap();
        assert_eq!(stacked.first_unusable(Some(1)).unwrap(), None);
        let (name, var) = stacked.vars().pop().unwrap();
        let poisoned = Tensor::new(&[[0f32, 0.0, 0.0], [0.0, f32::INFINITY, 0.0]], &Device::Cpu);
        var.set(&poisoned.unwrap()).unwrap();
        assert_eq!(stacked.first_unusable(Some(0)).unwrap(), None);
        let not_finite = Some((name.clone(), "is not finite".to_string()));
        assert_eq!(stacked.first_unusable(Some(1)).unwrap(), not_finite);
        let exploded = Tensor::new(&[[0f32, -9.1e18, 0.0], [0.0, 1e8, 0.0]], &Device::Cpu);
        var.set(&exploded.unwrap()).unwrap();
        let past = Some((name, "reached 9.10e18, past ±1e8".to_string()));
        assert_eq!(stacked.first_unusable(Some(0)).unwrap(), past);
        assert_eq!(
            stacked.first_unusable(Some(1)).unwrap(),
            None,
            "1e8 itself is usable"
        );
        let lone = Params::new(0, &Device::Cpu);
        lone.get("w", 2, Init::Constant(f64::NAN)).unwrap();
        let (name, _) = lone.first_unusable(None).unwrap().unwrap();
        assert_eq!(name, "w");
    }

    /// A checkpoint that does not fit the model, or holds NaN, is refused naming the
    /// parameter and the file (candle's shape error named neither; NaN was accepted).
    #[test]
    fn loading_names_the_parameter_that_does_not_fit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        let save = |values: &[f32]| {
            let w = Tensor::new(values, &Device::Cpu).unwrap();
            candle_core::safetensors::save(&std::collections::HashMap::from([("w", w)]), &path)
                .unwrap();
        };
        let model = Params::new(0, &Device::Cpu);
        model.get("w", 2, Init::Normal(1.0)).unwrap();
        save(&[1.0, 2.0]);
        model.load(&path).unwrap();
        save(&[1.0, 2.0, 3.0]);
        let err = model.load(&path).unwrap_err().to_string();
        assert!(
            err.contains("parameter w has shape [3], the preset's model [2]")
                && err.contains("m.safetensors"),
            "{err}"
        );
        save(&[1.0, f32::NAN]);
        let err = model.load(&path).unwrap_err().to_string();
        assert!(err.contains("parameter w is not finite"), "{err}");
        save(&[1.0, 3e9]);
        let err = model.load(&path).unwrap_err().to_string();
        assert!(
            err.contains("parameter w reached 3.00e9, past ±1e8"),
            "{err}"
        );
    }

    /// Set in the copy of this test binary that [`checkpoints_get_the_mode_of_other_files`]
    /// runs under `umask 077`.
    #[cfg(unix)]
    const UMASK_077: &str = "ATTNLAB_TEST_UMASK_077";

    /// Checkpoints were written 0600 (the safetensors crate's mode), then 0644 whatever the
    /// umask: they get the mode of a file `File::create` makes beside them, under the umask
    /// this test runs with and, in a copy of this test binary, under `umask 077` (the umask
    /// is the whole process's, which the tests running in parallel share).
    #[cfg(unix)]
    #[test]
    fn checkpoints_get_the_mode_of_other_files() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        let model = Params::new(0, &Device::Cpu);
        model.get("w", 2, Init::Normal(1.0)).unwrap();
        model.save(&path, Some(7)).unwrap();
        assert_eq!(saved_step(&path).unwrap(), Some(7));
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        let other = dir.path().join("other");
        std::fs::File::create(&other).unwrap();
        assert_eq!(mode(&path), mode(&other));
        if std::env::var_os(UMASK_077).is_some() {
            assert_eq!(mode(&path), 0o600);
            return;
        }
        let test = "params::tests::checkpoints_get_the_mode_of_other_files";
        let child = std::process::Command::new("sh")
            .args(["-c", "umask 077 && exec \"$0\" \"$@\""])
            .arg(std::env::current_exe().unwrap())
            .args(["--exact", test, "--test-threads", "1"])
            .env(UMASK_077, "1")
            .output()
            .unwrap();
        let report = String::from_utf8_lossy(&child.stdout);
        assert!(
            child.status.success() && report.contains("1 passed"),
            "under umask 077: {report}{}",
            String::from_utf8_lossy(&child.stderr)
        );
    }

    /// Replica r starts exactly where a lone model with seed r does, and saves like one.
    #[test]
    fn replicas_start_as_their_lone_models() {
        let stacked = Params::replicated(&[3, 7], &Device::Cpu);
        let w = stacked.pp("x").get("w", (2, 3), Init::Normal(1.0)).unwrap();
        assert_eq!(w.dims(), &[2, 2, 3]);
        assert_eq!(stacked.replicas(), Some(2));
        for (r, seed) in [3, 7].into_iter().enumerate() {
            let lone = Params::new(seed, &Device::Cpu)
                .pp("x")
                .get("w", (2, 3), Init::Normal(1.0))
                .unwrap();
            assert_eq!(
                w.get(r).unwrap().to_vec2::<f32>().unwrap(),
                lone.to_vec2::<f32>().unwrap()
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r1.safetensors");
        stacked.save_replica(1, &path, None).unwrap();
        assert_eq!(saved_step(&path).unwrap(), None);
        let lone = Params::new(7, &Device::Cpu);
        lone.pp("x").get("w", (2, 3), Init::Constant(0.0)).unwrap();
        lone.load(&path).unwrap();
        assert_eq!(
            lone.vars()[0].1.as_tensor().to_vec2::<f32>().unwrap(),
            w.get(1).unwrap().to_vec2::<f32>().unwrap()
        );
    }

    #[test]
    fn asking_twice_shares_the_variable() {
        let p = Params::new(0, &Device::Cpu);
        p.get("e", 4, Init::Constant(1.0)).unwrap();
        p.get("e", 4, Init::Constant(2.0)).unwrap();
        assert_eq!(p.vars().len(), 1);
        assert!(p.get("e", 5, Init::Constant(0.0)).is_err());
    }
}
