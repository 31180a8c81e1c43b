//! GBNF text, the grammar format of llama.cpp (its `grammars/README.md`):
//!
//! ```text
//! root  ::= "{" ws pair ("," ws pair)* "}"   # a comment
//! pair  ::= [a-z]+ ":" ws [0-9]{1,3}
//! ws    ::= [ \t\n]*
//! ```
//!
//! Rules `name ::= alternatives`; alternatives separated by `|`; sequences
//! of literals (`"..."`), character classes (`[a-z]`, `[^"\\]`), any
//! character (`.`), rule names and parenthesised groups, each optionally
//! followed by `*`, `+`, `?`, `{m}`, `{m,}` or `{m,n}`. Escapes `\n \r \t \\
//! \" \[ \] \- \xHH \uHHHH \UHHHHHHHH`. A rule ends at the end of its line
//! unless inside parentheses or right after `|` (or when the next line
//! starts with `|`). The grammar starts at `root`.

use crate::grammar::{Builder, CharClass, Grammar, Node};
use crate::GrammarError;

/// The largest `{m,n}` bound accepted.
pub const MAX_REPEAT: u32 = 100_000;

/// Parse GBNF text into a checked grammar.
pub fn parse(text: &str) -> Result<Grammar, GrammarError> {
    let mut p = Parser {
        src: text.as_bytes(),
        text,
        pos: 0,
    };
    let mut b = Builder::new();
    p.skip(true);
    if p.pos >= p.src.len() {
        return Err(p.err("the grammar is empty"));
    }
    while p.pos < p.src.len() {
        let (line, col) = p.line_col(p.pos);
        let name = p.name()?;
        p.skip(false);
        if !p.eat("::=") {
            return Err(p.err(format!("expected `::=` after the rule name `{name}`")));
        }
        p.skip(true);
        let alts = p.alternatives(false)?;
        if b.is_defined(&name) {
            return Err(GrammarError::Parse {
                line,
                col,
                message: format!("rule `{name}` is defined twice"),
            });
        }
        b.define(&name, alts)?;
        p.skip(true);
    }
    b.finish("root")
}

struct Parser<'a> {
    src: &'a [u8],
    text: &'a str,
    pos: usize,
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
}

impl Parser<'_> {
    fn line_col(&self, at: usize) -> (usize, usize) {
        let before = &self.text[..at.min(self.text.len())];
        let line = before.matches('\n').count() + 1;
        let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        (line, col)
    }

    fn err(&self, message: impl Into<String>) -> GrammarError {
        let (line, col) = self.line_col(self.pos);
        GrammarError::Parse {
            line,
            col,
            message: message.into(),
        }
    }

    fn peek(&self) -> Option<u8> {
        self.src.get(self.pos).copied()
    }

    fn eat(&mut self, s: &str) -> bool {
        if self.src[self.pos..].starts_with(s.as_bytes()) {
            self.pos += s.len();
            true
        } else {
            false
        }
    }

    /// Skip spaces and comments; newlines too when `newlines`.
    fn skip(&mut self, newlines: bool) {
        while let Some(b) = self.peek() {
            match b {
                b' ' | b'\t' | b'\r' => self.pos += 1,
                b'\n' if newlines => self.pos += 1,
                b'#' => {
                    while self.peek().is_some_and(|b| b != b'\n') {
                        self.pos += 1;
                    }
                }
                _ => return,
            }
        }
    }

    /// After a line break at the top level: does the rule go on (the next
    /// non-blank line starts with `|`)?
    fn continues(&self) -> bool {
        let mut q = Parser {
            src: self.src,
            text: self.text,
            pos: self.pos,
        };
        q.skip(true);
        q.peek() == Some(b'|')
    }

    fn name(&mut self) -> Result<String, GrammarError> {
        let start = self.pos;
        while self.peek().is_some_and(is_name_byte) {
            self.pos += 1;
        }
        if start == self.pos {
            return Err(self.err("expected a rule name"));
        }
        Ok(self.text[start..self.pos].to_string())
    }

    fn alternatives(&mut self, nested: bool) -> Result<Vec<Vec<Node>>, GrammarError> {
        let mut alts = vec![self.sequence(nested)?];
        loop {
            if !nested && self.peek() == Some(b'\n') && self.continues() {
                self.skip(true);
            }
            if self.peek() == Some(b'|') {
                self.pos += 1;
                self.skip(true);
                alts.push(self.sequence(nested)?);
            } else {
                return Ok(alts);
            }
        }
    }

    fn sequence(&mut self, nested: bool) -> Result<Vec<Node>, GrammarError> {
        let mut seq = Vec::new();
        loop {
            self.skip(nested);
            let Some(b) = self.peek() else {
                return Ok(seq);
            };
            let item = match b {
                b'"' => {
                    self.pos += 1;
                    let mut cps = Vec::new();
                    loop {
                        match self.peek() {
                            None | Some(b'\n') => {
                                return Err(self.err("unterminated string literal"))
                            }
                            Some(b'"') => {
                                self.pos += 1;
                                break;
                            }
                            _ => cps.push(self.char_in_literal()?),
                        }
                    }
                    Node::Literal(cps)
                }
                b'[' => self.class()?,
                b'.' => {
                    self.pos += 1;
                    Node::Class(CharClass::any())
                }
                b'(' => {
                    self.pos += 1;
                    self.skip(true);
                    let alts = self.alternatives(true)?;
                    self.skip(true);
                    if self.peek() != Some(b')') {
                        return Err(self.err("expected `)`"));
                    }
                    self.pos += 1;
                    Node::Group(alts)
                }
                _ if is_name_byte(b) => {
                    // A name followed by `::=` starts the next rule.
                    let save = self.pos;
                    let (line, col) = self.line_col(self.pos);
                    let name = self.name()?;
                    let after = self.pos;
                    self.skip(false);
                    if self.eat("::=") {
                        if nested {
                            return Err(self.err(format!(
                                "rule `{name}` starts inside parentheses: a `)` is missing"
                            )));
                        }
                        self.pos = save;
                        return Ok(seq);
                    }
                    self.pos = after;
                    Node::Ref { name, line, col }
                }
                b'|' | b')' | b'\n' => return Ok(seq),
                _ => {
                    return Err(self.err(format!(
                        "unexpected character `{}`",
                        self.text[self.pos..].chars().next().unwrap_or('?')
                    )))
                }
            };
            let item = self.repetition(item)?;
            seq.push(item);
        }
    }

    fn repetition(&mut self, mut item: Node) -> Result<Node, GrammarError> {
        loop {
            let (min, max) = match self.peek() {
                Some(b'*') => (0, None),
                Some(b'+') => (1, None),
                Some(b'?') => (0, Some(1)),
                Some(b'{') => {
                    self.pos += 1;
                    self.skip(false);
                    let min = self.number()?;
                    self.skip(false);
                    let max = if self.eat(",") {
                        self.skip(false);
                        if self.peek() == Some(b'}') {
                            None
                        } else {
                            Some(self.number()?)
                        }
                    } else {
                        Some(min)
                    };
                    self.skip(false);
                    if self.peek() != Some(b'}') {
                        return Err(self.err("expected `}` to close the repetition"));
                    }
                    if max.is_some_and(|m| m < min) {
                        return Err(self.err(format!(
                            "repetition {{{min},{}}}: the maximum is below the minimum",
                            max.unwrap_or(0)
                        )));
                    }
                    (min, max)
                }
                _ => return Ok(item),
            };
            self.pos += 1;
            item = Node::Repeat {
                node: Box::new(item),
                min,
                max,
            };
        }
    }

    fn number(&mut self) -> Result<u32, GrammarError> {
        let start = self.pos;
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.pos += 1;
        }
        let n: u64 = self.text[start..self.pos]
            .parse()
            .map_err(|_| self.err("expected a number"))?;
        if n > MAX_REPEAT as u64 {
            return Err(self.err(format!("repetition count {n} is over {MAX_REPEAT}")));
        }
        Ok(n as u32)
    }

    fn hex(&mut self, digits: usize) -> Result<u32, GrammarError> {
        let s = self.text.get(self.pos..self.pos + digits).unwrap_or("");
        let v = (s.len() == digits)
            .then(|| u32::from_str_radix(s, 16).ok())
            .flatten()
            .ok_or_else(|| self.err(format!("expected {digits} hex digits")))?;
        self.pos += digits;
        if char::from_u32(v).is_none() {
            return Err(self.err(format!("U+{v:X} is not a Unicode scalar value")));
        }
        Ok(v)
    }

    /// One character of a literal or class, escapes decoded.
    fn char_in_literal(&mut self) -> Result<u32, GrammarError> {
        let rest = &self.text[self.pos..];
        let c = rest
            .chars()
            .next()
            .ok_or_else(|| self.err("unexpected end"))?;
        if c != '\\' {
            self.pos += c.len_utf8();
            return Ok(c as u32);
        }
        self.pos += 1;
        let Some(e) = self.peek() else {
            return Err(self.err("unfinished escape"));
        };
        self.pos += 1;
        Ok(match e {
            b'n' => '\n' as u32,
            b'r' => '\r' as u32,
            b't' => '\t' as u32,
            b'\\' | b'"' | b'[' | b']' | b'-' | b'^' | b'/' => e as u32,
            b'x' => self.hex(2)?,
            b'u' => self.hex(4)?,
            b'U' => self.hex(8)?,
            _ => {
                self.pos -= 1;
                return Err(self.err(format!("unknown escape `\\{}`", e as char)));
            }
        })
    }

    fn class(&mut self) -> Result<Node, GrammarError> {
        self.pos += 1; // [
        let negated = self.eat("^");
        let mut ranges = Vec::new();
        loop {
            match self.peek() {
                None | Some(b'\n') => return Err(self.err("unterminated character class")),
                Some(b']') => {
                    self.pos += 1;
                    break;
                }
                _ => {}
            }
            let lo = self.char_in_literal()?;
            let hi = if self.peek() == Some(b'-') && self.src.get(self.pos + 1) != Some(&b']') {
                self.pos += 1;
                if matches!(self.peek(), None | Some(b'\n')) {
                    return Err(self.err("unterminated character class"));
                }
                let hi = self.char_in_literal()?;
                if hi < lo {
                    return Err(self.err("a class range ends below its start"));
                }
                hi
            } else {
                lo
            };
            ranges.push((lo, hi));
        }
        Ok(Node::Class(CharClass::new(ranges, negated)))
    }
}
