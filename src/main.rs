use clap::Parser as _;

fn main() -> std::process::ExitCode {
    match attnlab::cli::run(attnlab::cli::Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) if attnlab::cli::is_broken_pipe(&error) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("attnlab: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
