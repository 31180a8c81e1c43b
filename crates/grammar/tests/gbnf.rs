//! GBNF parsing and matching against strings whose membership follows from
//! the format's definition in llama.cpp's `grammars/README.md`.

use redlite_grammar::{gbnf, GrammarError, Matcher};
use std::sync::Arc;

fn g(text: &str) -> Arc<redlite_grammar::Grammar> {
    Arc::new(gbnf::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}")))
}

fn check(text: &str, yes: &[&str], no: &[&str]) {
    let gr = g(text);
    for s in yes {
        assert!(
            Matcher::matches(&gr, s).unwrap(),
            "{text:?} should accept {s:?}"
        );
    }
    for s in no {
        assert!(
            !Matcher::matches(&gr, s).unwrap(),
            "{text:?} should reject {s:?}"
        );
    }
}

#[test]
fn literals_classes_and_repetitions() {
    check(
        r#"root ::= "a" [b-d]+ "e"?"#,
        &["ab", "abe", "abcd", "adcbe"],
        &["a", "ae", "abf", "abee", ""],
    );
    check(r#"root ::= "x"{2,3}"#, &["xx", "xxx"], &["x", "xxxx", ""]);
    check(r#"root ::= "x"{2}"#, &["xx"], &["x", "xxx"]);
    check(r#"root ::= "x"{2,} "y""#, &["xxy", "xxxxxxy"], &["xy", "y"]);
    check(r#"root ::= "x"{0,2}"#, &["", "x", "xx"], &["xxx"]);
    check(
        r#"root ::= [^"\\]* "\"""#,
        &["\"", "ab c\""],
        &["a\\\"", "a\"b\"", "a"],
    );
    check(r#"root ::= . . "!""#, &["ab!", "é中!"], &["a!", "abc!"]);
    check(
        r#"root ::= "a" | "b" "c" | """#,
        &["a", "bc", ""],
        &["b", "ac"],
    );
}

#[test]
fn escapes_and_unicode() {
    check(
        r#"root ::= "\x41\u00e9\t\n\\\"""#,
        &["Aé\t\n\\\""],
        &["Ae\t\n\\\""],
    );
    check(r#"root ::= [à-ÿ]+"#, &["éè", "ÿ"], &["e", "Ā"]);
    // Four-byte characters, a range across them, negation of a range.
    check(
        r#"root ::= [\U0001F600-\U0001F64F] [^a-z]"#,
        &["😀A", "🙏é"],
        &["😀a", "🚀A"],
    );
    check(r#"root ::= [a\-z]+"#, &["a-z", "-"], &["b"]);
}

#[test]
fn rules_groups_comments_and_lines() {
    let text = r#"
# a list of pairs, llama.cpp style
root   ::= "{" ws ( pair ( "," ws pair )* )? "}"
pair   ::=
    key ":" ws val     # a key and a value
key    ::= [a-z]+
val    ::= [0-9]+ | "true"
         | "false"
ws     ::= [ ]*
"#;
    check(
        text,
        &["{}", "{a:1}", "{a: 1, bc:true,d:false}"],
        &["{a}", "{a:1,}", "{A:1}", "{a:1 }"],
    );
}

#[test]
fn errors_name_the_line_and_column() {
    let e = gbnf::parse("root ::= foo\n").unwrap_err();
    assert_eq!(
        e,
        GrammarError::Undefined {
            name: "foo".into(),
            line: 1,
            col: 10
        }
    );
    let e = gbnf::parse("root ::= \"a\"\nx = \"b\"\n").unwrap_err();
    assert!(matches!(e, GrammarError::Parse { line: 2, .. }), "{e}");
    let e = gbnf::parse("root ::= \"abc\n").unwrap_err();
    assert!(e.to_string().contains("unterminated string"), "{e}");
    let e = gbnf::parse("root ::= [a-\n").unwrap_err();
    assert!(e.to_string().contains("line 1"), "{e}");
    let e = gbnf::parse("root ::= (\"a\"\n").unwrap_err();
    assert!(e.to_string().contains("`)`"), "{e}");
    let e = gbnf::parse("x ::= \"a\"\n").unwrap_err();
    assert_eq!(e, GrammarError::NoRoot("root".into()));
    let e = gbnf::parse("root ::= \"a\"\nroot ::= \"b\"").unwrap_err();
    assert!(e.to_string().contains("defined twice"), "{e}");
    let e = gbnf::parse("root ::= \"x\"{5,2}").unwrap_err();
    assert!(e.to_string().contains("below the minimum"), "{e}");
    let e = gbnf::parse("root ::= \"x\"{1,1000000}").unwrap_err();
    assert!(e.to_string().contains("over"), "{e}");
    assert!(matches!(
        gbnf::parse("").unwrap_err(),
        GrammarError::Parse { .. }
    ));
    assert!(gbnf::parse("root ::= \"\\q\"")
        .unwrap_err()
        .to_string()
        .contains("unknown escape"));
}

#[test]
fn left_recursion_is_refused() {
    for text in [
        "root ::= root \"a\" | \"a\"",
        "root ::= x\nx ::= y \"a\"\ny ::= \"\" | root",
        "root ::= (\"\")*",
    ] {
        let e = gbnf::parse(text).unwrap_err();
        assert!(matches!(e, GrammarError::LeftRecursion(_)), "{text}: {e}");
    }
    // Right recursion is fine.
    check("root ::= \"a\" root | \"b\"", &["b", "aaab"], &["a", "ba"]);
}

#[test]
fn pathological_grammars_stop_with_an_error() {
    // Every `x` doubles the ways to finish: 2^n parses alive.
    let gr = g("root ::= a\na ::= \"x\" a \"y\" | \"x\" a \"z\" | \"\"");
    let mut m = Matcher::new(gr).unwrap();
    let mut err = None;
    for _ in 0..64 {
        match m.advance(b"x") {
            Ok(true) => {}
            Ok(false) => panic!("x is always allowed"),
            Err(e) => {
                err = Some(e);
                break;
            }
        }
    }
    assert!(
        matches!(err, Some(GrammarError::TooAmbiguous(_))),
        "{err:?}"
    );
    // Unbounded nesting stops at the depth limit.
    let gr = g("root ::= \"(\" root \")\" | \"\"");
    let mut m = Matcher::new(gr).unwrap();
    let mut err = None;
    for _ in 0..10_000 {
        if let Err(e) = m.advance(b"(") {
            err = Some(e);
            break;
        }
    }
    assert!(matches!(err, Some(GrammarError::TooDeep(_))), "{err:?}");
}

#[test]
fn bytes_split_anywhere_in_a_character() {
    let gr = g(r#"root ::= "é" [一-龥] "!""#);
    let text = "é中!".as_bytes();
    for cut in 0..text.len() {
        let mut m = Matcher::new(gr.clone()).unwrap();
        assert!(m.advance(&text[..cut]).unwrap());
        assert!(m.advance(&text[cut..]).unwrap());
        assert!(m.is_complete());
    }
    // A wrong first byte of a character is refused at once.
    let mut m = Matcher::new(gr).unwrap();
    assert!(!m.advance(&[0xc3, 0xa8]).unwrap()); // è
    assert!(!m.advance(&[0xff]).unwrap());
    assert!(m.advance(&[0xc3]).unwrap());
    assert!(!m.advance(b"a").unwrap(), "a continuation byte is due");
}

/// Mutated grammars (characters inserted, deleted, swapped, multi-byte ones
/// included) never panic: each parses or is an error, and a grammar that
/// parses runs over random bytes without panicking.
#[test]
fn mutated_grammars_parse_or_fail_cleanly() {
    let seeds = [
        "root ::= \"{\" ws (pair (\",\" ws pair)*)? \"}\"\npair ::= [a-z]+ \":\" ws [0-9]{1,3}\nws ::= [ \\t\\n]*",
        "root ::= (\"a\" | [^\"\\\\] | \"\\x41\\u00e9\")+ . \"é\"{2,} # c\n",
        &redlite_grammar::schema::json_object_grammar(),
    ];
    let alphabet: Vec<char> = "ab:=|()[]{}*+?.\"\\^-,#\n 0129xué中😀".chars().collect();
    let mut state = 0x1234_5678_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut parsed = 0;
    for seed in seeds {
        for _ in 0..400 {
            let mut chars: Vec<char> = seed.chars().collect();
            for _ in 0..(1 + next() % 4) {
                let at = (next() % (chars.len() as u64 + 1)) as usize;
                match next() % 3 {
                    0 => chars.insert(at, alphabet[(next() % alphabet.len() as u64) as usize]),
                    1 if at < chars.len() => {
                        chars.remove(at);
                    }
                    _ if at < chars.len() => {
                        chars[at] = alphabet[(next() % alphabet.len() as u64) as usize]
                    }
                    _ => {}
                }
            }
            let text: String = chars.into_iter().collect();
            if let Ok(gr) = gbnf::parse(&text) {
                parsed += 1;
                let bytes: Vec<u8> = (0..32).map(|_| next() as u8).collect();
                if let Ok(mut m) = Matcher::new(Arc::new(gr)) {
                    for b in bytes {
                        let _ = m.advance(&[b]);
                    }
                }
            }
        }
    }
    assert!(parsed > 50, "some mutations stay valid: {parsed}");
}
