//! The command reference as Markdown, made from the command line's own
//! definition (every subcommand's `--help`), so that the book's page
//! `docs/src/reference/cli.md` cannot drift from the binary: a test compares
//! the two.

use clap::CommandFactory as _;

/// The page: an introduction, then each command's long help, depth first.
pub fn markdown() -> String {
    let mut out = String::from(
        "# The `cpt` command\n\n\
         Every subcommand's full help, as `cpt help <command>` prints it. This page is \
         generated from the command's definition and a test fails when the two differ; \
         regenerate it with `CPT_BLESS=1 cargo test -p cpt-collector --test cli reference`.\n",
    );
    let mut cmd = super::Cli::command();
    cmd.build();
    section(&mut out, &mut cmd, "cpt");
    out
}

fn section(out: &mut String, cmd: &mut clap::Command, path: &str) {
    let help = cmd.render_long_help().to_string();
    out.push_str(&format!("\n## `{path}`\n\n```text\n"));
    for line in help.trim_end().lines() {
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out.push_str("```\n");
    let names: Vec<String> = cmd
        .get_subcommands()
        .filter(|c| !c.is_hide_set() && c.get_name() != "help")
        .map(|c| c.get_name().to_owned())
        .collect();
    for name in names {
        let sub = cmd
            .find_subcommand_mut(&name)
            .expect("a listed subcommand exists");
        section(out, sub, &format!("{path} {name}"));
    }
}
