//! The book's command reference is the command's own help: generated from
//! the clap definition, compared here so it cannot drift.

#[test]
fn reference_page_is_the_commands_own_help() {
    let page = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/src/reference/cli.md");
    let want = cpt_collector::cli::reference::markdown();
    if std::env::var_os("CPT_BLESS").is_some() {
        std::fs::write(page, &want).unwrap();
        return;
    }
    let have = std::fs::read_to_string(page).unwrap_or_default();
    assert!(
        have == want,
        "docs/src/reference/cli.md differs from the command's help: regenerate it with \
         `CPT_BLESS=1 cargo test -p cpt-collector --test cli reference`"
    );
}

#[test]
fn reference_page_covers_every_subcommand() {
    let page = cpt_collector::cli::reference::markdown();
    for command in [
        "cpt profile",
        "cpt serve",
        "cpt show",
        "cpt force",
        "cpt traces convert",
        "cpt traces predict",
        "cpt traces slack",
    ] {
        assert!(page.contains(&format!("## `{command}`")), "{command}");
    }
    assert!(
        page.contains("Usage: cpt traces predict"),
        "each section is that command's help"
    );
}
