//! Peak memory of an evaluation, as the operating system counts it.
//!
//! On Linux the process's peak resident set (`VmHWM` in `/proc/self/status`) is reset before
//! each evaluation length by writing `5` to `/proc/self/clear_refs`, so the peak read after it
//! belongs to that length (it still includes what the process already held: model, corpus).
//! Elsewhere, or where the reset is refused, no peak is reported rather than a misleading one.

/// Resets the peak; `true` when the next [`peak_bytes`] will be this interval's peak.
pub fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The peak resident set size in bytes since the last reset (or process start).
pub fn peak_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_is_read_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(peak_bytes().is_some_and(|b| b > 0));
        }
    }
}
