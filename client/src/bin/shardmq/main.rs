//! `shardmq`: the everyday and admin command line: topics, sending, consuming, consumer
//! groups, message queries.
//!
//! Every command talks to the name server given by `--namesrv` (default 127.0.0.1:9876) and,
//! through it, to the brokers. `--json` prints machine-readable output (one JSON object per
//! line for `send` and `consume`). Results go to stdout; errors to stderr with exit status 1
//! (2 for a bad command line; 3 when a cluster-wide command got answers from some brokers and
//! not others: the output is theirs, each broker that failed is named on stderr).
//!
//! Owns: the process around a command: parsing the command line (`cli.rs`), logging, the
//! runtime, and turning the outcome into an exit status. The modules below it are layered
//! `cli < output < dlq < commands`.

mod acl;
mod cli;
mod commands;
mod console;
mod dlq;
mod output;

use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Command};

/// Like other Unix tools, ends quietly when the reader of its output goes away (`shardmq
/// consume … | head -2`): Rust starts programs with SIGPIPE ignored, so a write to the closed
/// pipe fails and `println!` panics (exit 101). With the default disposition the process ends
/// on SIGPIPE at that write instead.
fn end_quietly_on_closed_output() {
    // SAFETY: called first thing in `main`, before any other thread exists; it only restores
    // the default disposition of one signal.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Exit status of a cluster-wide command some brokers of which did not answer.
const PARTIAL_ANSWER_STATUS: u8 = 3;

/// An error and its causes, each cause added only when the text so far does not already
/// contain it (client errors name their cause in their own message).
fn error_text(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let part = cause.to_string();
        if text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

fn main() -> ExitCode {
    end_quietly_on_closed_output();
    let cli = Cli::parse();
    if let Some(ca) = &cli.tls_ca {
        // Without --tls-ca, clients read SHARDMQ_TLS_* themselves.
        let mut files = shardmq_client::TlsFiles::new(ca);
        files.cert_chain = cli.tls_cert.clone();
        files.key = cli.tls_key.clone();
        shardmq_client::set_default_tls(Some(files));
    } else if cli.tls_cert.is_some() {
        eprintln!("shardmq: --tls-cert and --tls-key need --tls-ca (the CA that signed the servers' certificates)");
        return ExitCode::from(2);
    }
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("shardmq: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let run = async {
        match commands::settings(cli)? {
            (context, Command::Console(args)) => console::run(context, args).await,
            (context, command) => commands::run(context, command).await,
        }
    };
    match runtime.block_on(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) if error.downcast_ref::<commands::PartialAnswer>().is_some() => {
            eprintln!("shardmq: {error}");
            ExitCode::from(PARTIAL_ANSWER_STATUS)
        }
        Err(error) => {
            eprintln!("shardmq: error: {}", error_text(&error));
            ExitCode::FAILURE
        }
    }
}
