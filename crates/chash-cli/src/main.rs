//! `chash`: route keys to servers, print key hashes, and (as they land)
//! analyse, plan, benchmark and proxy.

use std::io::{self, Write};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod analyze;
mod bench;
mod config_cmd;
mod demo;
mod docs;
#[cfg(feature = "etcd")]
mod etcd;
#[cfg(feature = "etcd")]
mod etcd_migrate;
mod etcd_tls;
mod fleet;
mod hash;
mod keys;
mod migrate;
mod plan;
mod pool_args;
mod progress;
mod proxy;
mod route;
mod svg;

/// Consistent hashing: place keys on servers exactly as twemproxy,
/// libmemcached and nginx do, or on chash's own ring.
#[derive(Parser, Debug)]
#[command(name = "chash", version, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
// Parsed once per run: the proxy's many flags cost nothing worth boxing.
#[allow(clippy::large_enum_variant)]
enum Command {
    /// Print the server that owns each key (KEY<TAB>ID).
    Route(route::RouteArgs),
    /// Print the hash value of each key (KEY<TAB>VALUE).
    Hash(hash::HashArgs),
    /// Watch keys move: shards leave and join, ring against hash % n.
    Demo(demo::DemoArgs),
    /// Run the sharding proxy (memcached and Redis), configured and run like twemproxy.
    Proxy(proxy::ProxyArgs),
    /// Shares of the hash space and of sampled keys per server, against weights.
    Analyze(analyze::AnalyzeArgs),
    /// What a membership change will move, before anyone makes it.
    Plan(plan::PlanArgs),
    /// Lookups per second for a placement on this machine.
    Bench(bench::BenchArgs),
    /// Edit a config file's servers the way the proxy changes them live.
    Config(config_cmd::ConfigArgs),
    /// Check that a fleet of proxies places keys alike.
    Fleet(fleet::FleetArgs),
    /// A Redis pool's migration (a change made with --migrate): status, start, finish.
    Migrate(migrate::MigrateArgs),
    /// Print a shell completion script (bash, zsh, fish, ...).
    Completions(docs::CompletionsArgs),
    /// Write man pages for chash and every subcommand into a directory.
    Man(docs::ManArgs),
}

/// Called as `nutcracker` (a symlink to chash), the binary is
/// `chash proxy` with Debian's nutcracker defaults: a unit or init script
/// written for nutcracker runs it with only its path changed.
fn nutcracker_main() -> ExitCode {
    #[derive(Parser, Debug)]
    #[command(name = "nutcracker")]
    struct Nutcracker {
        #[command(flatten)]
        args: proxy::ProxyArgs,
    }
    let args = match Nutcracker::try_parse() {
        Ok(n) => n.args.with_nutcracker_defaults(),
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 1 } else { 0 });
        }
    };
    finish(proxy::run(args))
}

fn main() -> ExitCode {
    let called = std::env::args_os().next().unwrap_or_default();
    if std::path::Path::new(&called).file_name().is_some_and(|n| n == "nutcracker") {
        return nutcracker_main();
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // clap exits 2 on usage errors and 0 for --help/--version.
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let result = match cli.command {
        Command::Route(args) => route::run(args),
        Command::Hash(args) => hash::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Proxy(args) => proxy::run(args),
        Command::Analyze(args) => analyze::run(args),
        Command::Plan(args) => plan::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Config(args) => match config_cmd::run(args) {
            Ok(true) => Ok(()),
            Ok(false) => return ExitCode::from(1),
            Err(e) => Err(e),
        },
        Command::Completions(args) => docs::completions::<Cli>(args),
        Command::Man(args) => docs::man::<Cli>(args),
        Command::Migrate(args) => match migrate::run(args) {
            Ok(true) => Ok(()),
            Ok(false) => return ExitCode::from(1),
            Err(e) => Err(e),
        },
        Command::Fleet(args) => match fleet::run(args) {
            Ok(true) => Ok(()),
            Ok(false) => return ExitCode::from(1),
            Err(e) => Err(e),
        },
    };
    finish(result)
}

fn finish(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(io::stderr(), "chash: error: {}", one_line(&e));
            ExitCode::from(2)
        }
    }
}

/// A reader that stopped reading (`chash route | head`) is not an error.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        let kind = c.downcast_ref::<io::Error>().map(io::Error::kind);
        let kind = kind.or_else(|| c.downcast_ref::<serde_json::Error>().and_then(serde_json::Error::io_error_kind));
        kind == Some(io::ErrorKind::BrokenPipe)
    })
}

/// The error and its causes on one line. The proxy's errors end their
/// message with their cause and give it as `source()` too: a cause the
/// line already ends with is not said twice.
fn one_line(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out.replace('\n', " ")
}
