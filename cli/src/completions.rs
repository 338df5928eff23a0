//! Shell completions and the man page, generated from the command line's
//! own definition (clap's generators), so they never drift from `--help`.
//! Nothing installs them; the README's install section says where they go.

use std::io::Write;

use clap_complete::Shell;

/// Writes `shell`'s completion script for `cmd` to `out`.
///
/// # Errors
/// Writing to `out` failed (a closed pipe, say).
pub(crate) fn completions(
    shell: Shell,
    cmd: &clap::Command,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    let mut shown = without_hidden(cmd);
    let name = shown.get_name().to_owned();
    // The generators panic when a write fails: they write to memory here,
    // which cannot fail, and the error of the real write is returned.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut shown, name, &mut script);
    out.write_all(&script)
}

/// `cmd` rebuilt without its hidden subcommands (the processes the command
/// starts itself): clap's completion generators offer them, `hide` or not,
/// and clap cannot remove a subcommand once added.
fn without_hidden(cmd: &clap::Command) -> clap::Command {
    // This binary's own name and version: clap takes only `'static` text.
    let mut shown = clap::Command::new(env!("CARGO_BIN_NAME"))
        .version(env!("CARGO_PKG_VERSION"))
        .args(cmd.get_arguments().cloned())
        .subcommands(cmd.get_subcommands().filter(|c| !c.is_hide_set()).cloned());
    if let Some(about) = cmd.get_about() {
        shown = shown.about(about.clone());
    }
    shown
}

/// Writes `cmd`'s man page (roff, section 1) to `out`.
///
/// # Errors
/// Writing to `out` failed.
pub(crate) fn man_page(cmd: clap::Command, out: &mut dyn Write) -> std::io::Result<()> {
    clap_mangen::Man::new(cmd).render(out)
}

/// Writes a page for `cmd` and one for each of its subcommands that is not
/// hidden (`lockwright-run.1`, which the command's page refers to) into
/// `dir`, made if missing, and names each on `out`.
///
/// # Errors
/// Making `dir` or writing a page failed.
pub(crate) fn man_pages(
    cmd: clap::Command,
    dir: &std::path::Path,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    // The files clap_mangen names: `<name>.1` and `<name>-<sub>.1`.
    let name = cmd.get_name().to_owned();
    let mut pages = vec![format!("{name}.1")];
    pages.extend(
        cmd.get_subcommands()
            .filter(|s| !s.is_hide_set())
            .map(|s| format!("{name}-{}.1", s.get_name())),
    );
    std::fs::create_dir_all(dir)?;
    clap_mangen::generate_to(cmd, dir)?;
    for page in pages {
        writeln!(out, "{}", dir.join(page).display())?;
    }
    Ok(())
}
