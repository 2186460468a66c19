//! README's "Instrument your service" shows the quickstart's code, so what a
//! user copies from it compiles and runs: the `install` block is the
//! quickstart's `install` region to the letter, and every line of the
//! layers block is a line of the quickstart.

const README: &str = include_str!("../../../README.md");
const MAIN: &str = include_str!("../src/main.rs");

/// The lines between `// ANCHOR: name` and `// ANCHOR_END: name`, without
/// nested anchor lines (as mdBook's `{{#include file:name}}` shows them).
fn region(name: &str) -> String {
    let start = format!("// ANCHOR: {name}");
    let end = format!("// ANCHOR_END: {name}");
    let mut lines = MAIN.lines().skip_while(|l| l.trim() != start);
    assert!(lines.next().is_some(), "no `{start}` in the quickstart");
    let body: Vec<&str> = lines
        .take_while(|l| l.trim() != end)
        .filter(|l| !l.trim().starts_with("// ANCHOR"))
        .collect();
    body.join("\n")
}

/// The ```rust block after `<!-- quickstart:NAME -->` in README.
fn readme_block(name: &str) -> String {
    let marker = format!("<!-- quickstart:{name} -->");
    let after = README
        .split_once(&marker)
        .unwrap_or_else(|| panic!("README has no {marker}"))
        .1;
    let code = after
        .trim_start()
        .strip_prefix("```rust\n")
        .unwrap_or_else(|| panic!("{marker} is not followed by a ```rust block"));
    code.split_once("\n```")
        .expect("unterminated block")
        .0
        .to_owned()
}

#[test]
fn readme_install_block_is_the_quickstarts_code() {
    assert_eq!(readme_block("install"), region("install"));
}

#[test]
fn readme_layers_block_is_made_of_the_quickstarts_lines() {
    let main_lines: Vec<&str> = MAIN.lines().map(str::trim).collect();
    for line in readme_block("layers").lines().map(str::trim) {
        if line.is_empty() || line.starts_with("//") {
            continue;
        }
        assert!(
            main_lines.contains(&line),
            "README shows `{line}`, which the quickstart does not have"
        );
    }
}
