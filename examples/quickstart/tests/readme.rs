//! README's "Instrument your service" shows the quickstart's code, so what a
//! user copies from it compiles and runs: the `install` block is the
//! quickstart's `install` region to the letter, and every line of the
//! layers block is a line of the quickstart; the reqwest block is
//! `examples/reqwest`'s client region to the letter. Every other page sets the SDK
//! up the same way, and the book says truly which examples set TCP nodelay.

const README: &str = include_str!("../../../README.md");
const MAIN: &str = include_str!("../src/main.rs");

/// The lines between `// ANCHOR: name` and `// ANCHOR_END: name` of
/// `source`, without nested anchor lines and without their common
/// indentation (as mdBook's `{{#include file:name}}` shows them).
fn region_of(source: &str, name: &str) -> String {
    let start = format!("// ANCHOR: {name}");
    let end = format!("// ANCHOR_END: {name}");
    let mut lines = source.lines().skip_while(|l| l.trim() != start);
    assert!(lines.next().is_some(), "no `{start}` in the example");
    let body: Vec<&str> = lines
        .take_while(|l| l.trim() != end)
        .filter(|l| !l.trim().starts_with("// ANCHOR"))
        .collect();
    let indent = body
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    body.iter()
        .map(|l| l.get(indent..).unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The quickstart's region `name`.
fn region(name: &str) -> String {
    region_of(MAIN, name)
}

/// The ```rust block after `<!-- quickstart:NAME -->` in README.
fn readme_block(name: &str) -> String {
    readme_block_after(&format!("<!-- quickstart:{name} -->"))
}

/// The ```rust block after `marker` in README.
fn readme_block_after(marker: &str) -> String {
    let after = README
        .split_once(marker)
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

/// README's reqwest block is `examples/reqwest`'s client to the letter:
/// what a user copies compiles, runs, and is in the order cpt asks for.
#[test]
fn readme_reqwest_block_is_the_reqwest_examples_client() {
    const REQWEST: &str = include_str!("../../reqwest/src/main.rs");
    assert_eq!(
        readme_block_after("<!-- reqwest:client -->"),
        region_of(REQWEST, "reqwest_client")
    );
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

#[test]
fn the_book_says_which_examples_set_tcp_nodelay() {
    const PROFILES: &str = include_str!("../../../docs/src/guide/profiles.md");
    const SYSTEM: &str = include_str!("../../src/system.rs");
    let calls = [
        ".with_nodelay(Some(true))",
        ".tcp_nodelay(true)",
        ".set_nodelay(true)",
    ];
    assert!(
        PROFILES.contains("(`examples/src/system.rs`) does all three")
            && PROFILES.contains("the quickstart, whose calls are\nall unary, sets none"),
        "guide/profiles.md must say which examples set TCP nodelay"
    );
    for call in calls {
        assert!(SYSTEM.contains(call), "examples/src/system.rs lacks {call}");
        assert!(
            !MAIN.contains(call),
            "the quickstart sets {call}: guide/profiles.md says it sets none"
        );
    }
}

/// The ```rust blocks of README and every book page, with where they are.
fn book_rust_blocks() -> Vec<(String, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut pages = vec![root.join("README.md")];
    let mut dirs = vec![root.join("docs/src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    let mut blocks = Vec::new();
    for page in pages {
        let text = std::fs::read_to_string(&page).unwrap();
        for (i, piece) in text.split("```rust\n").enumerate().skip(1) {
            let code = piece.split_once("\n```").map_or(piece, |(c, _)| c);
            blocks.push((format!("{} block {i}", page.display()), code.to_owned()));
        }
    }
    blocks
}

#[test]
fn every_page_sets_up_the_sdk_as_the_quickstart_does() {
    // The quickstart: `CptEnv::from_env()?` once and `with_env(&env)` on the
    // layer builder and the collector client; `Exporter::builder().build(
    // JsonLines::append(..)?)` for a file.
    let blocks = book_rust_blocks();
    assert!(blocks.len() > 10, "found {} blocks", blocks.len());
    for (at, code) in &blocks {
        assert!(
            !code.contains("json_lines_file("),
            "{at}: use Exporter::builder().build(JsonLines::append(path)?), as the quickstart does"
        );
        for builder in ["CriticalPathLayer::builder()", "CollectorClient::builder("] {
            for (start, _) in code.match_indices(builder) {
                let chain = &code[start..];
                let chain = chain.split_once(';').map_or(chain, |(c, _)| c);
                assert!(
                    !chain.contains("with_default_env()"),
                    "{at}: `{builder}…with_default_env()`; parse CptEnv::from_env()? once and \
                     pass it to with_env(&env), as the quickstart does"
                );
            }
        }
    }
}
