//! Text rules the validators share with the API document, so that what the
//! document's `\S` patterns accept (JSON Schema regexes are ECMA-262) is
//! exactly what the validators accept.

/// Whitespace as ECMA-262's `\s` defines it. Rust's `char::is_whitespace`
/// differs (it includes U+0085 and excludes U+FEFF), so a text the
/// document allows could otherwise be refused as blank.
pub fn is_schema_space(c: char) -> bool {
    matches!(
        c,
        '\t' | '\n' | '\u{b}' | '\u{c}' | '\r' | ' ' | '\u{a0}' | '\u{1680}' | '\u{2000}'
            ..='\u{200a}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202f}'
                | '\u{205f}'
                | '\u{3000}'
                | '\u{feff}'
    )
}

/// `text` without schema whitespace at either end.
pub fn trim(text: &str) -> &str {
    text.trim_matches(is_schema_space)
}

/// Whether `text` has nothing but schema whitespace (fails `\S`).
pub fn is_blank(text: &str) -> bool {
    trim(text).is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blank_means_what_the_document_pattern_means() {
        for blank in ["", " ", "\t\n\r", "\u{a0}\u{3000}", "\u{feff}", "\u{2028}"] {
            assert!(is_blank(blank), "{blank:?}");
        }
        // Not ECMA-262 whitespace, so `\S` matches them: not blank.
        for text in ["\u{85}", "\u{180e}", "x", " x ", "\u{200b}"] {
            assert!(!is_blank(text), "{text:?}");
        }
        assert_eq!(trim("\u{feff} a b \u{3000}"), "a b");
    }
}
