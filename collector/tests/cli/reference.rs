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

#[test]
fn collector_urls_in_the_help_use_the_port_cpt_serve_listens_on() {
    // `cpt serve --http` defaults to 127.0.0.1:7071 (gRPC: 7070); an
    // example URL of a local collector must name that port.
    let page = cpt_collector::cli::reference::markdown();
    let serve = page
        .split("## `cpt serve`")
        .nth(1)
        .expect("the reference has cpt serve");
    assert!(
        serve.contains("[default: 127.0.0.1:7071]"),
        "cpt serve's HTTP default moved: update this test"
    );
    let mut urls = 0;
    for (at, _) in page.match_indices("http://127.0.0.1:") {
        let port: String = page[at + "http://127.0.0.1:".len()..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        assert_eq!(
            port,
            "7071",
            "an example collector URL names port {port}: {}",
            &page[at..(at + 60).min(page.len())]
        );
        urls += 1;
    }
    assert!(urls >= 2, "the help shows collector URLs ({urls} found)");
}
