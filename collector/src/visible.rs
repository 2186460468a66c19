//! Recorded names as a reader sees them: every character that would be
//! invisible, reorder the text around it, or break the document it is
//! written into is shown as a visible stand-in instead. A service chooses
//! its names (frames, services, endpoints, labels), so one name must never
//! pose as another or hide in a page.
//!
//! | what | shown as |
//! |---|---|
//! | C0 controls U+0000–U+001F (NUL, tab, line feed, ESC…) | their control pictures U+2400–U+241F: `␀`, `␉`, `␊`, `␛` |
//! | DEL U+007F | `␡` (U+2421) |
//! | C1 controls U+0080–U+009F, bidirectional controls (U+202E…), zero-width and other invisible characters (U+200B, U+2060, U+FEFF…), line and paragraph separators (U+2028, U+2029), noncharacters (U+FFFE…) | the code point in brackets: `⟨U+202E⟩` |
//!
//! [`push_visible`] is the one place that decides; the web pages
//! (`server/ui`, after markup escaping) and the flame graphs (their frame
//! names, title and subtitle) write every recorded name through it.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether `c` is shown as `⟨U+XXXX⟩` (see the module docs).
fn bracketed(c: char) -> bool {
    matches!(
        c,
        '\u{80}'..='\u{9f}'
            // Soft hyphen, combining grapheme joiner, Arabic letter mark.
            | '\u{ad}' | '\u{34f}' | '\u{61c}'
            // Hangul fillers, Khmer inherent vowels, Mongolian selectors.
            | '\u{115f}' | '\u{1160}' | '\u{17b4}' | '\u{17b5}' | '\u{180b}'..='\u{180f}'
            // Zero-width space, joiners, LRM, RLM.
            | '\u{200b}'..='\u{200f}'
            // Line and paragraph separators, bidirectional embeddings and overrides.
            | '\u{2028}'..='\u{202e}'
            // Word joiner, invisible operators, bidirectional isolates, deprecated format characters.
            | '\u{2060}'..='\u{206f}'
            | '\u{3164}' | '\u{fe00}'..='\u{fe0f}' | '\u{feff}' | '\u{ffa0}'
            // Noncharacters (XML forbids U+FFFE and U+FFFF), interlinear annotations.
            | '\u{fdd0}'..='\u{fdef}' | '\u{fff0}'..='\u{fffb}'
            | '\u{1bca0}'..='\u{1bca3}' | '\u{1d173}'..='\u{1d17a}'
            // Tags and variation selectors supplement.
            | '\u{e0000}'..='\u{e0fff}'
    ) || (c as u32 & 0xfffe) == 0xfffe
}

/// Push `c` onto `out` as a reader is shown it (see the module docs).
pub(crate) fn push_visible(out: &mut String, c: char) {
    match c {
        // C0 controls map onto U+2400..U+241F, DEL onto U+2421.
        '\0'..='\x1f' => out.push(char::from_u32(0x2400 + c as u32).unwrap_or('\u{fffd}')),
        '\x7f' => out.push('\u{2421}'),
        c if bracketed(c) => {
            let _ = write!(out, "⟨U+{:04X}⟩", c as u32);
        }
        c => out.push(c),
    }
}

/// `s` as a reader is shown it: unchanged when every character is
/// visible, else with each stand-in of [`push_visible`].
pub(crate) fn visible(s: &str) -> Cow<'_, str> {
    if !s.chars().any(|c| c < ' ' || c == '\x7f' || bracketed(c)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        push_visible(&mut out, c);
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_hidden_or_breaking_character_gets_a_visible_stand_in() {
        // (case, name, as shown)
        #[rustfmt::skip]
        let cases: &[(&str, &str, &str)] = &[
            ("plain",            "handle (api)",     "handle (api)"),
            ("other scripts",    "größe ошибка 名前 🚀", "größe ошибка 名前 🚀"),
            ("nul",              "a\0b",             "a␀b"),
            ("escape sequence",  "\x1b[31mred",      "␛[31mred"),
            ("tab and newline",  "a\tb\nc\r",        "a␉b␊c␍"),
            ("del",              "a\x7f",            "a␡"),
            ("c1 control",       "a\u{85}b",         "a⟨U+0085⟩b"),
            ("right-to-left override", "txt.\u{202e}exe", "txt.⟨U+202E⟩exe"),
            ("isolate",          "\u{2067}x\u{2069}", "⟨U+2067⟩x⟨U+2069⟩"),
            ("rlm",              "a\u{200f}",        "a⟨U+200F⟩"),
            ("line separator",   "a\u{2028}b",       "a⟨U+2028⟩b"),
            ("zero-width space", "ad\u{200b}min",    "ad⟨U+200B⟩min"),
            ("byte order mark",  "\u{feff}x",        "⟨U+FEFF⟩x"),
            ("soft hyphen",      "ad\u{ad}min",      "ad⟨U+00AD⟩min"),
            ("tag character",    "x\u{e0041}",       "x⟨U+E0041⟩"),
            ("noncharacter",     "x\u{ffff}\u{1fffe}", "x⟨U+FFFF⟩⟨U+1FFFE⟩"),
        ];
        for (case, name, want) in cases {
            assert_eq!(visible(name), *want, "{case}");
        }
        assert!(matches!(visible("plain"), Cow::Borrowed(_)));
    }
}
