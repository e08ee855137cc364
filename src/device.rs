//! Choosing the compute device from a preset or the command line.
//!
//! Names: `cpu`, `cuda` / `cuda:N`, `metal`. A device this build was not compiled for is a
//! clear error that says which cargo feature to build with. A GPU this build supports but that
//! does not open here (no driver, no GPU, driver too old) is a different matter: runs fall back
//! to the CPU through [`DeviceName::open_or_fallback`], with a notice saying why, so a GPU build started on
//! a machine without a GPU still works.

use std::sync::{Once, OnceLock};

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// A compute device as a preset names it: `cpu`, `cuda` / `cuda:N` or `metal`. Parsed once,
/// when the preset is read (a bad name is an error at its key); every consumer opens it through
/// [`DeviceName::open_or_fallback`], the one fallback policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum DeviceName {
    #[default]
    Cpu,
    Cuda(usize),
    Metal,
}

impl std::fmt::Display for DeviceName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `pad`, so widths and alignment in format strings apply (`attnlab devices` aligns).
        match self {
            DeviceName::Cpu => f.pad("cpu"),
            DeviceName::Cuda(ordinal) => f.pad(&format!("cuda:{ordinal}")),
            DeviceName::Metal => f.pad("metal"),
        }
    }
}

impl std::str::FromStr for DeviceName {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self> {
        let unknown = || {
            Error::Device(format!(
                "unknown device '{name}': expected cpu, cuda, cuda:N or metal"
            ))
        };
        match name {
            "cpu" => Ok(DeviceName::Cpu),
            "cuda" => Ok(DeviceName::Cuda(0)),
            "metal" => Ok(DeviceName::Metal),
            _ => {
                let ordinal = name.strip_prefix("cuda:").ok_or_else(unknown)?;
                ordinal.parse().map(DeviceName::Cuda).map_err(|_| unknown())
            }
        }
    }
}

impl TryFrom<String> for DeviceName {
    type Error = Error;

    fn try_from(name: String) -> Result<Self> {
        name.parse()
    }
}

impl From<DeviceName> for String {
    fn from(name: DeviceName) -> Self {
        name.to_string()
    }
}

impl DeviceName {
    /// The devices this build can open, for pickers and error messages.
    pub fn available() -> Vec<DeviceName> {
        let mut names = vec![DeviceName::Cpu];
        if cfg!(feature = "cuda") {
            names.push(DeviceName::Cuda(0));
        }
        if cfg!(feature = "metal") {
            names.push(DeviceName::Metal);
        }
        names
    }

    /// Checks that this build was compiled for the device, without opening it.
    pub fn check(self) -> Result<()> {
        match self {
            DeviceName::Cpu => Ok(()),
            DeviceName::Cuda(_) if cfg!(feature = "cuda") => Ok(()),
            DeviceName::Metal if cfg!(feature = "metal") => Ok(()),
            DeviceName::Cuda(_) => Err(not_compiled(self, "cuda")),
            DeviceName::Metal => Err(not_compiled(self, "metal")),
        }
    }

    /// Opens the device and runs a tiny computation on it, so a device that opens but cannot
    /// run attnlab's kernels (a driver too old for the PTX, missing cuBLAS) fails here with a
    /// hint rather than in the middle of a run.
    pub fn open(self) -> Result<Device> {
        self.check()?;
        let device = match self {
            DeviceName::Cpu => return Ok(Device::Cpu),
            DeviceName::Cuda(ordinal) => cuda_on_one_stream(ordinal),
            DeviceName::Metal => Device::new_metal(0),
        };
        device
            .and_then(|device| smoke_test(&device).map(|()| device))
            .map_err(|e| Error::Device(cannot_open(self, &e.to_string())))
    }

    /// The one policy every run, analysis and evaluation opens its device by: the device, or
    /// the CPU when this build supports it but it does not open here (no driver, no GPU), with
    /// a notice for the run's log and summary. A device this build was not compiled for stays
    /// an error, as in preset validation.
    pub fn open_or_fallback(self) -> Result<Opened> {
        self.check()?;
        Ok(or_cpu(self, self.open()))
    }
}

/// A device opened for a run, or the CPU standing in for it.
#[derive(Clone, Debug)]
pub struct Opened {
    pub device: Device,
    /// The device actually used (`cpu` after a fallback).
    pub name: DeviceName,
    /// Why the CPU stands in for the device asked for; `None` when that device opened.
    pub notice: Option<String>,
}

fn or_cpu(name: DeviceName, opened: Result<Device>) -> Opened {
    match opened {
        Ok(device) => Opened {
            device,
            name,
            notice: None,
        },
        Err(e) => Opened {
            device: Device::Cpu,
            name: DeviceName::Cpu,
            notice: Some(format!("{e}; running on the CPU instead")),
        },
    }
}

/// Whether one device opens here, for a device picker.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceStatus {
    pub name: DeviceName,
    /// `Err` holds why it does not open.
    pub usable: std::result::Result<(), String>,
}

/// Opens every device of [`DeviceName::available`] once, which can take a second or two for a GPU (driver
/// start-up); the first call starts that probe on a background thread and returns `None` until
/// it is done, so a GUI never waits for it.
pub fn probed() -> Option<&'static [DeviceStatus]> {
    static PROBED: OnceLock<Vec<DeviceStatus>> = OnceLock::new();
    static STARTED: Once = Once::new();
    STARTED.call_once(|| {
        std::thread::spawn(|| PROBED.get_or_init(probe_all));
    });
    PROBED.get().map(Vec::as_slice)
}

/// A device picker's entries: every device of [`DeviceName::available`], with why it does not open here
/// (`None` while it opens, or while the background probe of [`probed`] is still running).
pub fn picker() -> Vec<(DeviceName, Option<String>)> {
    let probed = probed().unwrap_or_default();
    DeviceName::available()
        .into_iter()
        .map(|name| {
            let status = probed.iter().find(|s| s.name == name);
            (name, status.and_then(|s| s.usable.clone().err()))
        })
        .collect()
}

/// Opens every device of [`DeviceName::available`] now, on this thread.
pub fn probe_all() -> Vec<DeviceStatus> {
    DeviceName::available()
        .into_iter()
        .map(|name| DeviceStatus {
            name,
            usable: name.open().map(drop).map_err(|e| e.to_string()),
        })
        .collect()
}

/// CUDA device `ordinal` with one stream of its own that every thread uses.
///
/// candle's `Device::new_cuda` queues each thread's work on that thread's default stream, and
/// streams are not ordered against each other. A trainer's steps run on whichever rayon thread
/// picks them up (`rayon::scope`), its evaluation and checkpoints on another: the AdamW update of
/// one step could still be running while the next step read the weights, and a buffer freed on
/// one thread's stream could be handed out again while another stream still used it. One
/// stream orders all of it. cudarc's per-buffer event tracking, which would synchronise several
/// streams, is turned off: with one stream it only adds driver calls to every launch.
///
/// Making the stream synchronises the GPU's context once (cudarc does so when a context gets its
/// first stream of its own): opening a device waits for work queued by other runs on that GPU.
#[allow(unsafe_code)] // a reviewed exception: cudarc marks turning the tracking off unsafe
fn cuda_on_one_stream(ordinal: usize) -> candle_core::Result<Device> {
    let device = Device::new_cuda_with_stream(ordinal)?;
    #[cfg(feature = "cuda")]
    // SAFETY: every buffer of this device lives on its one stream (cudarc's condition for
    // turning the tracking off: no buffer used by two streams); buffers are made after this.
    unsafe {
        device
            .as_cuda_device()?
            .cuda_stream()
            .context()
            .disable_event_tracking();
    }
    Ok(device)
}

/// The bytes free on a CUDA device (`None` for the CPU and Metal, or where the driver does not
/// say), for refusing a run whose weights cannot fit before drawing them.
pub fn free_gpu_bytes(device: &Device) -> Option<u64> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(cuda) = device {
        let info = cuda.cuda_stream().context().mem_get_info();
        return info.ok().map(|(free, _total)| free as u64);
    }
    let _ = device;
    None
}

/// exp(ones(2,2)·ones(2,2)) summed: exercises cuBLAS, an element-wise and a reduction kernel.
fn smoke_test(device: &Device) -> candle_core::Result<()> {
    let ones = Tensor::ones((2, 2), DType::F32, device)?;
    let got = ones.matmul(&ones)?.exp()?.sum_all()?.to_scalar::<f32>()?;
    let want = 4.0 * 2f32.exp();
    if (got - want).abs() > 1e-3 * want {
        candle_core::bail!("a test computation gave {got} instead of {want}");
    }
    Ok(())
}

/// The message for a device that did not open: the backend's own error, and what it means in
/// words where the error code is one a user can act on.
fn cannot_open(name: DeviceName, error: &str) -> String {
    const HINTS: [(&str, &str); 6] = [
        (
            "CUDA_ERROR_STUB_LIBRARY",
            "no NVIDIA driver is installed (libcuda.so.1 is a stub)",
        ),
        ("CUDA_ERROR_NO_DEVICE", "the NVIDIA driver sees no GPU"),
        (
            "CUDA_ERROR_INVALID_DEVICE",
            "there is no GPU with this index",
        ),
        (
            "CUDA_ERROR_INSUFFICIENT_DRIVER",
            "the NVIDIA driver is older than this build's CUDA 13 (needs driver R580 or newer)",
        ),
        (
            "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
            "the NVIDIA driver is older than the CUDA compiler that built the kernels",
        ),
        (
            "CUDA_ERROR_NO_BINARY_FOR_GPU",
            "the kernels were built for another GPU generation; rebuild with \
             CUDA_COMPUTE_CAP set to this GPU's compute capability",
        ),
    ];
    // candle appends a backtrace on the following lines when RUST_BACKTRACE is set.
    let error = error.lines().next().unwrap_or_default();
    match HINTS.iter().find(|(code, _)| error.contains(code)) {
        Some((_, hint)) => format!("cannot open device '{name}': {hint} ({error})"),
        None => format!("cannot open device '{name}': {error}"),
    }
}

/// How CUDA's cuBLAS computes f32 products for `precision`: exactly, on TF32 tensor cores
/// (`tf32`, candle's switch) or on bf16 tensor cores (`bf16`, the vendored candle's: operands
/// rounded to bf16 and summed in f32, as autocast's products, the result left in f32); nothing
/// elsewhere. The switches are one per process: a run sets them as it starts and turns them
/// off as it ends (`train::run`), and two runs in one window with different precisions on one
/// GPU use the last one started.
pub fn use_precision(device: &Device, precision: crate::ops::Precision) {
    #[cfg(feature = "cuda")]
    if device.is_cuda() {
        use crate::ops::Precision;
        candle_core::cuda_backend::set_gemm_reduced_precision_f32(precision == Precision::Tf32);
        candle_core::cuda_backend::set_gemm_bf16_compute_f32(precision == Precision::Bf16);
    }
    #[cfg(not(feature = "cuda"))]
    let _ = (device, precision);
}

/// What a precision means on a device where it is not what its name says, for the run's log:
/// tf32 is f32 off CUDA, and bf16 on the CPU only rounds (candle widens its products to f32).
pub fn precision_note(device: &Device, precision: crate::ops::Precision) -> Option<String> {
    use crate::ops::Precision;
    match precision {
        Precision::Tf32 if !device.is_cuda() => Some(
            "train.precision = tf32 acts on CUDA matrix products only; here they stay f32".into(),
        ),
        Precision::Bf16 if device.is_cpu() => Some(
            "train.precision = bf16 on the CPU rounds product operands to bf16 but computes in \
             f32, slower than f32: it shows the accuracy cost, not the speed-up"
                .into(),
        ),
        _ => None,
    }
}

/// The environment variable that sets how long candle's CPU thread pool spins before it sleeps.
const CPU_POOL_SPIN_VAR: &str = "CANDLE_BARRIER_POOL_SPIN_LIMIT";

/// The spin [`tune_cpu_runtime`] sets: spins of 100 to 5,000 measured the same.
const SHORT_SPIN: &str = "1000";

/// mimalloc's option `mi_option_purge_delay` (its position in `mi_option_t`, mimalloc.h;
/// libmimalloc-sys does not name it). Tested: its default is mimalloc 3's 1,000 ms.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// How long freed memory stays with mimalloc before it goes back to the OS: delays of 2 s,
/// 10 s and "never" measured the same; 10 s still returns a finished run's memory.
const PURGE_DELAY_MS: std::ffi::c_long = 10_000;

/// The variable rayon's pool and candle's read for their number of threads.
const THREADS_VAR: &str = "RAYON_NUM_THREADS";

/// The cores of this machine and the threads the user asked for in `RAYON_NUM_THREADS`.
fn cores_and_request() -> (usize, Option<usize>) {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let requested = std::env::var(THREADS_VAR).ok().and_then(|v| v.parse().ok());
    (cores, requested)
}

/// The threads this process's CPU work gets ([`thread_count`] of the user's request): what a
/// sweep shares among its workers, so that `RAYON_NUM_THREADS=1` keeps a sweep to one core as
/// it keeps a run (a sweep had split all the cores whatever the variable said).
pub fn cpu_threads() -> usize {
    let (cores, requested) = cores_and_request();
    thread_count(requested, cores)
}

/// The threads a process gets: `requested` (the user's `RAYON_NUM_THREADS`) or all `cores`,
/// never more than the cores: more threads than cores made a training step 1.9x (benchmark)
/// to 3.8x (a small sweep cell) slower on 2 cores, the threads taking turns on them.
pub fn thread_count(requested: Option<usize>, cores: usize) -> usize {
    requested
        .filter(|&n| n > 0)
        .map_or(cores, |n| n.min(cores))
        .max(1)
}

/// Tunes three CPU runtimes for training steps, measured on the benchmark on 2 cores.
///
/// - rayon's pool and candle's get one thread per core at most, whatever
///   `RAYON_NUM_THREADS` asks ([`thread_count`]); asking for more prints a note.
///
/// - candle hands large elementwise ops (the gradient sums of every backward pass among
///   them) to its own thread pool, whose idle threads spin 25,000 times, about a millisecond,
///   before they sleep. The rest of a step runs on rayon's pool (attnlab's kernels, gemm), and
///   on few cores the spinning thread takes a core from it: 92 → 84 ms per step with a spin
///   of 1,000. A spin the user set in `CANDLE_BARRIER_POOL_SPIN_LIMIT` is kept.
/// - mimalloc (the binaries' allocator) returns freed memory to the OS after its purge delay.
///   A step frees and reallocates the same few hundred MB, and each return made the next
///   step fault the pages in again, zeroed by the kernel: 75.5 → 72.8 ms per step with freed
///   memory kept for 10 s.
///
/// # Safety
/// It sets an environment variable, which is undefined behaviour while another thread may
/// read the environment: call it first thing in `main`, before any thread is started.
#[allow(unsafe_code)]
pub unsafe fn tune_cpu_runtime() {
    let (cores, requested) = cores_and_request();
    let threads = thread_count(requested, cores);
    if requested.is_some_and(|r| r > threads) {
        eprintln!(
            "note: {THREADS_VAR}={} is more than the {cores} cores here; using {threads} threads",
            requested.unwrap_or_default()
        );
    }
    // SAFETY: the caller guarantees that no other thread exists yet.
    unsafe { std::env::set_var(THREADS_VAR, threads.to_string()) };
    if std::env::var_os(CPU_POOL_SPIN_VAR).is_none() {
        // SAFETY: the caller guarantees that no other thread exists yet.
        unsafe { std::env::set_var(CPU_POOL_SPIN_VAR, SHORT_SPIN) };
    }
    // SAFETY: mi_option_set takes any option and value; no other thread allocates yet.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
}

fn not_compiled(name: DeviceName, feature: &str) -> Error {
    let available: Vec<String> = DeviceName::available()
        .iter()
        .map(DeviceName::to_string)
        .collect();
    Error::Device(format!(
        "device '{name}' is not available: this attnlab was built without GPU support; \
         rebuild with `cargo build --release --features {feature}` (available here: {})",
        available.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(unsafe_code)]
    fn the_purge_delay_option_is_mimallocs() {
        // SAFETY: mi_option_get only reads an option.
        let delay = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        // mimalloc 3's default, or this module's value should the test process have been tuned.
        assert!(
            delay == 1_000 || delay == PURGE_DELAY_MS,
            "option 15 is {delay}"
        );
    }

    #[test]
    fn threads_never_outnumber_the_cores() {
        assert_eq!(thread_count(None, 8), 8);
        assert_eq!(thread_count(Some(16), 2), 2);
        assert_eq!(thread_count(Some(1), 4), 1);
        assert_eq!(thread_count(Some(0), 4), 4);
        assert_eq!(thread_count(None, 0), 1);
    }

    #[test]
    fn cpu_always_opens() {
        assert!(DeviceName::Cpu.open().unwrap().is_cpu());
        let opened = DeviceName::Cpu.open_or_fallback().unwrap();
        assert!(opened.device.is_cpu());
        assert_eq!((opened.name, opened.notice), (DeviceName::Cpu, None));
    }

    #[test]
    fn unknown_and_uncompiled_devices_say_why() {
        let err = "tpu".parse::<DeviceName>().unwrap_err().to_string();
        assert!(err.contains("unknown device 'tpu'"), "{err}");
        for bad in ["cuda:", "cuda:x", "cuda:-1", "CPU"] {
            assert!(bad.parse::<DeviceName>().is_err(), "{bad}");
        }
        if !cfg!(feature = "cuda") {
            let err = DeviceName::Cuda(1).check().unwrap_err().to_string();
            assert!(err.contains("--features cuda"), "{err}");
        }
    }

    #[test]
    fn a_device_that_does_not_open_falls_back_to_the_cpu_with_a_notice() {
        let error = Error::Device(cannot_open(
            DeviceName::Cuda(0),
            "DriverError(CUDA_ERROR_STUB_LIBRARY, \"stub library\")",
        ));
        let opened = or_cpu(DeviceName::Cuda(0), Err(error));
        assert!(opened.device.is_cpu());
        assert_eq!(opened.name, DeviceName::Cpu);
        let notice = opened.notice.unwrap();
        assert!(notice.contains("cannot open device 'cuda:0'"), "{notice}");
        assert!(notice.contains("no NVIDIA driver is installed"), "{notice}");
        assert!(notice.ends_with("running on the CPU instead"), "{notice}");
    }

    #[test]
    fn a_device_that_opens_is_used_without_notice() {
        let opened = or_cpu(DeviceName::Cuda(1), Ok(Device::Cpu));
        assert_eq!((opened.name, opened.notice), (DeviceName::Cuda(1), None));
    }

    #[test]
    fn cuda_errors_get_a_hint_in_words_and_others_pass_through() {
        let msg = cannot_open(
            DeviceName::Cuda(3),
            "DriverError(CUDA_ERROR_INVALID_DEVICE, \"\")",
        );
        assert!(msg.contains("no GPU with this index"), "{msg}");
        assert!(msg.contains("CUDA_ERROR_INVALID_DEVICE"), "{msg}");
        let msg = cannot_open(DeviceName::Metal, "no Metal device\n   0: <unknown>\n");
        assert_eq!(msg, "cannot open device 'metal': no Metal device");
    }

    /// (A bad name in a preset names its key: `preset`'s tests, which may import this module.)
    #[test]
    fn names_read_and_print_the_same() {
        for name in ["cpu", "cuda:0", "cuda:3", "metal"] {
            assert_eq!(name.parse::<DeviceName>().unwrap().to_string(), name);
        }
        assert_eq!(format!("{:<8}|", DeviceName::Cuda(1)), "cuda:1  |");
        assert_eq!("cuda".parse::<DeviceName>().unwrap(), DeviceName::Cuda(0));
        let err = "tpu".parse::<DeviceName>().unwrap_err().to_string();
        assert!(err.contains("unknown device 'tpu'"), "{err}");
    }

    #[test]
    fn uncompiled_gpus_stay_an_error() {
        if !cfg!(feature = "cuda") {
            let err = DeviceName::Cuda(0)
                .open_or_fallback()
                .unwrap_err()
                .to_string();
            assert!(err.contains("--features cuda"), "{err}");
        }
    }

    #[test]
    fn probing_lists_every_available_device_and_the_cpu_opens() {
        let statuses = probe_all();
        let names: Vec<_> = statuses.iter().map(|s| s.name).collect();
        assert_eq!(names, DeviceName::available());
        assert_eq!(statuses[0].usable, Ok(()));
        let started = std::time::Instant::now();
        while probed().is_none() {
            assert!(
                started.elapsed().as_secs() < 60,
                "background probe never finished"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(probed().unwrap(), statuses.as_slice());
        let entries = picker();
        assert_eq!(entries.len(), statuses.len());
        assert_eq!(entries[0], (DeviceName::Cpu, None));
    }
}
