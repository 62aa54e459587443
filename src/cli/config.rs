//! `warden config`: every setting with the value in effect and where it
//! came from.

use std::process::ExitCode;

use clap::Args;
use warden::config::{Config, settings};

/// The flags of `warden config`.
#[derive(Debug, Args)]
#[command(
    long_about = "Print every setting with the value in effect and where it came from \
(secrets shown only as (set)); exits 2 when the configuration would not start."
)]
pub struct ConfigArgs {
    /// Print the settings table of docs/reference/configuration.md (Markdown) instead
    #[arg(long)]
    pub markdown: bool,
}

/// Prints the settings; exits 2 when the configuration would not start.
pub(super) fn run(args: ConfigArgs) -> ExitCode {
    if args.markdown {
        print!("{}", settings::markdown());
        return ExitCode::SUCCESS;
    }
    let vars = settings::process_env();
    print!("{}", settings::render_in_effect(&vars));
    match Config::from_vars(&vars) {
        Ok(_) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("warden config: configuration error: {err}");
            ExitCode::from(2)
        }
    }
}
