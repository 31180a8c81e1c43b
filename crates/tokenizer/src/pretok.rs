//! The Qwen2 pre-tokenizer, hand-written over chars.
//!
//! It gives the same pieces as the regex in Qwen2's `tokenizer.json`, tried
//! alternative by alternative at each position (first alternative that
//! matches wins, as in a backtracking regex engine):
//!
//! ```text
//! (?i:'s|'t|'re|'ve|'m|'ll|'d)      contractions (case-insensitive)
//! [^\r\n\p{L}\p{N}]?\p{L}+          letters, with one optional leading non-letter
//! \p{N}                             one digit / numeric char
//!  ?[^\s\p{L}\p{N}]+[\r\n]*         punctuation run, optional leading space, newlines
//! \s*[\r\n]+                        whitespace ending in newlines
//! \s+(?!\S)                         whitespace not followed by a non-space
//! \s+                               any other whitespace
//! ```

use unicode_general_category::{get_general_category, GeneralCategory as Gc};

const LETTER: u8 = 1;
const NUMBER: u8 = 2;
const SPACE: u8 = 4;
/// `\r` or `\n` (also SPACE).
const NEWLINE: u8 = 8;

fn classify(c: char) -> u8 {
    if c.is_ascii() {
        return match c {
            'a'..='z' | 'A'..='Z' => LETTER,
            '0'..='9' => NUMBER,
            '\r' | '\n' => SPACE | NEWLINE,
            ' ' | '\t' | '\x0b' | '\x0c' => SPACE,
            _ => 0,
        };
    }
    // `\s` in the reference engine (Oniguruma) is the Unicode White_Space
    // property, which is what `char::is_whitespace` tests.
    if c.is_whitespace() {
        return SPACE;
    }
    match get_general_category(c) {
        Gc::UppercaseLetter
        | Gc::LowercaseLetter
        | Gc::TitlecaseLetter
        | Gc::ModifierLetter
        | Gc::OtherLetter => LETTER,
        Gc::DecimalNumber | Gc::LetterNumber | Gc::OtherNumber => NUMBER,
        _ => 0,
    }
}

/// Case-insensitive char compare for the contraction letters; `ſ` (U+017F)
/// case-folds to `s` in Unicode, and the reference regex's `(?i:...)` honours
/// that.
fn fold_eq(c: char, lower: char) -> bool {
    c.to_ascii_lowercase() == lower || (lower == 's' && c == '\u{17F}')
}

/// Reusable buffers for [`split`].
#[derive(Default)]
pub(crate) struct Scratch {
    chars: Vec<char>,
    cls: Vec<u8>,
    offs: Vec<usize>,
}

/// Split `text` into pre-token pieces; calls `f` with each piece in order.
/// The pieces cover `text` exactly.
pub(crate) fn split<'t>(text: &'t str, scratch: &mut Scratch, mut f: impl FnMut(&'t str)) {
    // All-ASCII-letter fast path would be possible, but the general path is
    // already linear; keep one implementation.
    let Scratch { chars, cls, offs } = scratch;
    chars.clear();
    cls.clear();
    offs.clear();
    for (o, c) in text.char_indices() {
        chars.push(c);
        cls.push(classify(c));
        offs.push(o);
    }
    offs.push(text.len());
    let n = chars.len();
    let mut i = 0;
    while i < n {
        let end = match_at(chars, cls, i);
        debug_assert!(end > i && end <= n);
        let end = end.clamp(i + 1, n);
        f(&text[offs[i]..offs[end]]);
        i = end;
    }
}

/// End (exclusive, in chars) of the piece starting at `i`.
fn match_at(chars: &[char], cls: &[u8], i: usize) -> usize {
    let n = chars.len();
    let is = |k: usize, m: u8| k < n && cls[k] & m != 0;
    let is_punct = |k: usize| k < n && cls[k] & (SPACE | LETTER | NUMBER) == 0;
    let c = chars[i];

    // 1. contractions
    if c == '\'' && i + 1 < n {
        let a = chars[i + 1];
        if fold_eq(a, 's') || fold_eq(a, 't') || fold_eq(a, 'm') || fold_eq(a, 'd') {
            return i + 2;
        }
        if i + 2 < n {
            let b = chars[i + 2];
            if (fold_eq(a, 'r') && fold_eq(b, 'e'))
                || (fold_eq(a, 'v') && fold_eq(b, 'e'))
                || (fold_eq(a, 'l') && fold_eq(b, 'l'))
            {
                return i + 3;
            }
        }
    }

    // 2. [^\r\n\p{L}\p{N}]?\p{L}+
    let letters_from = if is(i, LETTER) {
        Some(i + 1)
    } else if !is(i, LETTER | NUMBER | NEWLINE) && is(i + 1, LETTER) {
        Some(i + 2)
    } else {
        None
    };
    if let Some(mut j) = letters_from {
        while is(j, LETTER) {
            j += 1;
        }
        return j;
    }

    // 3. \p{N}
    if is(i, NUMBER) {
        return i + 1;
    }

    // 4. ' ?[^\s\p{L}\p{N}]+[\r\n]*'
    let p = if c == ' ' && is_punct(i + 1) {
        i + 1
    } else {
        i
    };
    if is_punct(p) {
        let mut j = p + 1;
        while is_punct(j) {
            j += 1;
        }
        while is(j, NEWLINE) {
            j += 1;
        }
        return j;
    }

    // Only whitespace is left here.
    let mut j = i;
    while is(j, SPACE) {
        j += 1;
    }
    if j == i {
        // Unreachable: every char is a letter, number, punctuation or space.
        return i + 1;
    }
    // 5. \s*[\r\n]+ : up to the last newline of the run.
    if let Some(k) = (i..j).rev().find(|&k| cls[k] & NEWLINE != 0) {
        return k + 1;
    }
    // 6. \s+(?!\S)
    if j == n {
        return j;
    }
    if j - 1 > i {
        return j - 1;
    }
    // 7. \s+
    j
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(s: &str) -> Vec<&str> {
        let mut out = Vec::new();
        split(s, &mut Scratch::default(), |p| out.push(p));
        out
    }

    #[test]
    fn basic_pieces() {
        assert_eq!(pieces("Hello world"), ["Hello", " world"]);
        assert_eq!(pieces("I'm don't"), ["I", "'m", " don", "'t"]);
        assert_eq!(pieces("WE'LL 'sup"), ["WE", "'LL", " '", "sup"]);
        assert_eq!(pieces("a'ſt"), ["a", "'ſ", "t"]);
        assert_eq!(pieces("x123"), ["x", "1", "2", "3"]);
        assert_eq!(pieces("  hi"), [" ", " hi"]);
        assert_eq!(pieces("a  \n\n  b"), ["a", "  \n\n", " ", " b"]);
        assert_eq!(pieces("end   "), ["end", "   "]);
        assert_eq!(pieces("f(x);\n"), ["f", "(x", ");\n"]);
        assert_eq!(pieces(" ... ok"), [" ...", " ok"]);
        assert_eq!(pieces("\tfoo"), ["\tfoo"]);
        assert_eq!(pieces("中文 テスト"), ["中文", " テスト"]);
        assert_eq!(pieces(""), Vec::<&str>::new());
    }

    #[test]
    fn pieces_cover_input() {
        let s = "a\u{3000}b \u{85}\r\n\t 😀👍🏽 x'Re ½ ①";
        assert_eq!(pieces(s).concat(), s);
    }
}
