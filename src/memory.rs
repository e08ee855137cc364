//! Memory as the operating system counts it: the machine's free memory (what a new run may
//! use, checked against a preset's estimate) and the process's peak resident set (reported by
//! `attnlab train` beside the estimate, and per length by extrapolation).
//!
//! On Linux the peak (`VmHWM` in `/proc/self/status`) is reset by writing `5` to
//! `/proc/self/clear_refs`, so a peak read after [`reset_peak`] belongs to that interval (it
//! still includes what the process already held: model, corpus). Elsewhere, or where the reset
//! is refused, no peak is reported rather than a misleading one.

/// Resets the peak; `true` when the next [`peak_bytes`] will be this interval's peak.
pub fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The peak resident set size in bytes since the last reset (or process start).
pub fn peak_bytes() -> Option<u64> {
    proc_kib("/proc/self/status", "VmHWM:").map(|kib| kib * 1024)
}

/// The machine's memory available to a new run (Linux: `MemAvailable`), if it can be read.
pub fn available_bytes() -> Option<u64> {
    proc_kib("/proc/meminfo", "MemAvailable:").map(|kib| kib * 1024)
}

/// The value in kB of the line starting with `key` in a `/proc` file.
fn proc_kib(file: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(file).ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_and_free_memory_are_read_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(peak_bytes().is_some_and(|b| b > 0));
            assert!(available_bytes().is_some_and(|b| b > 0));
        }
    }
}
