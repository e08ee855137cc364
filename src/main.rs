use clap::Parser as _;

/// mimalloc keeps freed tensor buffers for reuse; glibc's malloc returns blocks over 128 KiB to
/// the kernel and page-faults them in again on the next step (a fifth of a training step).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    // SAFETY: the first statement of `main`: no other thread exists yet.
    #[allow(unsafe_code)]
    unsafe {
        attnlab::device::tune_cpu_runtime();
    }
    match attnlab::cli::run(attnlab::cli::Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) if attnlab::cli::is_broken_pipe(&error) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("attnlab: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
