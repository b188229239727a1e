//! `shardmq-broker`: the broker binary. Subcommands: `verify` (offline data directory check).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use shardmq_broker::store::verify::verify_data_dir;

#[derive(Parser, Debug)]
#[command(name = "shardmq-broker", version, about = "ShardMQ broker")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Check every record's CRC and the derived files' consistency; exit 0 only when clean.
    Verify {
        /// Broker data directory (or one shard directory).
        #[arg(long)]
        data_dir: PathBuf,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Verify { data_dir, json } => run_verify(&data_dir, json),
    }
}

fn run_verify(data_dir: &std::path::Path, json: bool) -> ExitCode {
    let report = match verify_data_dir(data_dir) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("verify: cannot read {}: {e}", data_dir.display());
            return ExitCode::from(2);
        }
    };
    if json {
        println!("{}", shardmq_broker::store::verify::report_json(&report));
    } else {
        for shard in &report.shards {
            println!(
                "shard {}: segments {}, records {}, commitlog [{}, {}), queues {}, consume queue entries {}, index entries {}",
                shard.dir.display(),
                shard.segments,
                shard.records,
                shard.first_offset,
                shard.last_valid_offset,
                shard.queues,
                shard.consume_queue_entries,
                shard.index_entries
            );
        }
        for problem in &report.problems {
            println!(
                "PROBLEM {} at offset {}: {}",
                problem.file.display(),
                problem.offset,
                problem.what
            );
        }
        if report.is_clean() {
            println!("verify: clean");
        } else {
            println!("verify: {} problem(s)", report.problems.len());
        }
    }
    if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
