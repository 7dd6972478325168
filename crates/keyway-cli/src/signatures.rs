//! `keyway signatures`: prints the stack's operators' state signatures, checks them against the
//! lock file (`--check`, non-zero with the changes named when they differ) or rewrites it
//! (`--update`).

use crate::error::CliError;
use std::path::Path;

use keyway::operator::lock;

use keyway_stack as stack;

/// `keyway signatures`' arguments.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Exit non-zero, naming what changed, when the lock file differs.
    #[arg(long, conflicts_with = "update")]
    pub check: bool,
    /// Rewrite the lock file.
    #[arg(long)]
    pub update: bool,
    #[arg(long, default_value = keyway::operator::lock::LOCK_FILE)]
    pub lock: std::path::PathBuf,
}

enum Mode {
    Print,
    Check,
    Update,
}

pub(crate) fn run(args: Args) -> Result<(), CliError> {
    let mode = match (args.check, args.update) {
        (true, _) => Mode::Check,
        (_, true) => Mode::Update,
        _ => Mode::Print,
    };
    let lock_path: &Path = &args.lock;
    let current = lock::entries(&stack::operators())?;
    match mode {
        Mode::Print => {
            print!("{}", lock::render(&current));
            Ok(())
        }
        Mode::Update => {
            std::fs::write(lock_path, lock::render(&current))
                .map_err(CliError::file(&lock_path))?;
            println!(
                "wrote {} ({} operators)",
                lock_path.display(),
                current.len()
            );
            Ok(())
        }
        Mode::Check => {
            let text = std::fs::read_to_string(lock_path).map_err(CliError::file(&lock_path))?;
            let changes = lock::check(&lock::parse(&text)?, &current);
            if changes.is_empty() {
                println!(
                    "{}: every operator's state signature matches",
                    lock_path.display()
                );
                return Ok(());
            }
            eprintln!("state signatures differ from {}:", lock_path.display());
            for change in &changes {
                eprintln!("  {change}");
            }
            Err(format!(
                "{} change(s): the operators' state would start afresh. If that is intended (or a migration carries it), run `keyway signatures --update`",
                changes.len()
            ).into())
        }
    }
}
