//! README's reqwest block is the example's client, to the letter: what a
//! user copies from the front page compiles, runs (`run.rs`) and is in the
//! order cpt asks for.

const README: &str = include_str!("../../../README.md");
const MAIN: &str = include_str!("../src/main.rs");

/// The lines between `// ANCHOR: name` and `// ANCHOR_END: name`, without
/// their common indentation (as mdBook's `{{#include file:name}}` shows them).
fn region(name: &str) -> String {
    let start = format!("// ANCHOR: {name}");
    let end = format!("// ANCHOR_END: {name}");
    let body: Vec<&str> = MAIN
        .lines()
        .skip_while(|l| l.trim() != start)
        .skip(1)
        .take_while(|l| l.trim() != end)
        .collect();
    assert!(!body.is_empty(), "no `{start}` region in the example");
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

/// The ```rust block after `<!-- reqwest:NAME -->` in README.
fn readme_block(name: &str) -> String {
    let marker = format!("<!-- reqwest:{name} -->");
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
fn readme_reqwest_block_is_the_examples_client() {
    assert_eq!(readme_block("client"), region("reqwest_client"));
}
