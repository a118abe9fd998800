//! `chash completions SHELL` and `chash man DIR`: shell completions and
//! man pages made from the command's own definitions (the packages ship
//! them; `scripts/package` calls these).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, CommandFactory};

#[derive(Args, Debug)]
#[command(after_help = "\
Examples:
  chash completions bash > /usr/share/bash-completion/completions/chash
  chash completions zsh  > /usr/share/zsh/vendor-completions/_chash
  chash completions fish > /usr/share/fish/vendor_completions.d/chash.fish")]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

#[derive(Args, Debug)]
#[command(after_help = "\
Writes chash.1 and one page per subcommand (chash-proxy.1, chash-config-add.1,
...), and nutcracker.1 for the proxy called by that name. Example:
  chash man target/man && man -l target/man/chash-proxy.1")]
pub struct ManArgs {
    /// Where to write them (made if missing).
    #[arg(value_name = "DIR")]
    dir: PathBuf,
}

/// The completion script for `args.shell`, on standard output.
pub fn completions<C: CommandFactory>(args: CompletionsArgs) -> Result<()> {
    use std::io::Write as _;
    let mut cmd = C::command();
    let mut out = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, "chash", &mut out);
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&out)?;
    stdout.flush()?;
    Ok(())
}

/// The man pages, one per command and subcommand, into `args.dir`.
pub fn man<C: CommandFactory>(args: ManArgs) -> Result<()> {
    std::fs::create_dir_all(&args.dir).with_context(|| format!("cannot make {}", args.dir.display()))?;
    let mut cmd = C::command();
    cmd.build();
    let mut written = 0;
    write_pages(&cmd, "chash", &args.dir, &mut written)?;
    // The proxy as Debian's nutcracker is run (`/usr/sbin/nutcracker`).
    if let Some(proxy) = cmd.find_subcommand("proxy") {
        let page = proxy.clone().name("nutcracker").display_name("nutcracker").bin_name("nutcracker");
        write_page(&page, &args.dir.join("nutcracker.1"))?;
        written += 1;
    }
    eprintln!("chash man: {written} pages in {}", args.dir.display());
    Ok(())
}

fn write_pages(cmd: &clap::Command, name: &str, dir: &std::path::Path, written: &mut usize) -> Result<()> {
    let page = cmd.clone().name(name.to_owned()).display_name(name.to_owned()).bin_name(name.replace('-', " "));
    write_page(&page, &dir.join(format!("{name}.1")))?;
    *written += 1;
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        write_pages(sub, &format!("{name}-{}", sub.get_name()), dir, written)?;
    }
    Ok(())
}

fn write_page(cmd: &clap::Command, path: &std::path::Path) -> Result<()> {
    let mut out = Vec::new();
    clap_mangen::Man::new(cmd.clone()).render(&mut out).with_context(|| format!("cannot render {}", path.display()))?;
    std::fs::write(path, out).with_context(|| format!("cannot write {}", path.display()))
}
