//! Choosing the compute device from a preset or the command line.
//!
//! Names: `cpu`, `cuda` / `cuda:N`, `metal`. A device this build was not compiled for is a
//! clear error that says which cargo feature to build with, never a silent CPU fallback.

use candle_core::Device;

use crate::{Error, Result};

/// The device names this build can open, for pickers and error messages.
pub fn available() -> Vec<&'static str> {
    let mut names = vec!["cpu"];
    if cfg!(feature = "cuda") {
        names.push("cuda:0");
    }
    if cfg!(feature = "metal") {
        names.push("metal");
    }
    names
}

/// Checks that `name` is a device name this build supports, without opening it.
pub fn check(name: &str) -> Result<()> {
    match parse(name)? {
        Parsed::Cpu => Ok(()),
        Parsed::Cuda(_) if cfg!(feature = "cuda") => Ok(()),
        Parsed::Metal if cfg!(feature = "metal") => Ok(()),
        Parsed::Cuda(_) => Err(not_compiled(name, "cuda")),
        Parsed::Metal => Err(not_compiled(name, "metal")),
    }
}

/// Opens the device called `name`.
pub fn open(name: &str) -> Result<Device> {
    check(name)?;
    let device = match parse(name)? {
        Parsed::Cpu => Ok(Device::Cpu),
        Parsed::Cuda(ordinal) => Device::new_cuda(ordinal),
        Parsed::Metal => Device::new_metal(0),
    };
    device.map_err(|e| Error::Device(format!("cannot open device '{name}': {e}")))
}

enum Parsed {
    Cpu,
    Cuda(usize),
    Metal,
}

fn parse(name: &str) -> Result<Parsed> {
    let unknown = || {
        Error::Device(format!(
            "unknown device '{name}': expected cpu, cuda, cuda:N or metal"
        ))
    };
    match name {
        "cpu" => Ok(Parsed::Cpu),
        "cuda" => Ok(Parsed::Cuda(0)),
        "metal" => Ok(Parsed::Metal),
        _ => {
            let ordinal = name.strip_prefix("cuda:").ok_or_else(unknown)?;
            ordinal.parse().map(Parsed::Cuda).map_err(|_| unknown())
        }
    }
}

fn not_compiled(name: &str, feature: &str) -> Error {
    Error::Device(format!(
        "device '{name}' is not available: this attnlab was built without GPU support; \
         rebuild with `cargo build --release --features {feature}` (available here: {})",
        available().join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_always_opens() {
        assert!(open("cpu").unwrap().is_cpu());
    }

    #[test]
    fn unknown_and_uncompiled_devices_say_why() {
        let err = check("tpu").unwrap_err().to_string();
        assert!(err.contains("unknown device 'tpu'"), "{err}");
        if !cfg!(feature = "cuda") {
            let err = check("cuda:1").unwrap_err().to_string();
            assert!(err.contains("--features cuda"), "{err}");
        }
    }
}
