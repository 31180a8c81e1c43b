//! A compiled grammar: every rule's alternatives laid out in one flat array
//! of elements (character classes and rule references), each alternative
//! ended by [`Elem::End`]. A matcher position is an index into that array.
//!
//! Repetitions and groups are lowered to plain rules at build time
//! (`x*` becomes `r ::= x r |`), so the matcher only knows sequences,
//! alternatives and references. Rules are checked once: every reference is
//! defined, and no rule can reach itself without consuming a character (left
//! recursion would make the matcher's expansion loop forever).

use crate::GrammarError;
use std::collections::HashMap;

/// A set of code points: ranges, possibly negated, with a bitmap for ASCII.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CharClass {
    /// Inclusive ranges as written.
    pub ranges: Vec<(u32, u32)>,
    pub negated: bool,
    ascii: [u64; 2],
}

impl CharClass {
    pub fn new(ranges: Vec<(u32, u32)>, negated: bool) -> CharClass {
        let mut c = CharClass {
            ranges,
            negated,
            ascii: [0; 2],
        };
        let mut ascii = [0u64; 2];
        for b in 0u32..128 {
            if c.contains_slow(b) {
                ascii[(b / 64) as usize] |= 1 << (b % 64);
            }
        }
        c.ascii = ascii;
        c
    }

    /// Any code point (`.`).
    pub fn any() -> CharClass {
        CharClass::new(Vec::new(), true)
    }

    fn contains_slow(&self, cp: u32) -> bool {
        self.ranges.iter().any(|&(a, b)| a <= cp && cp <= b) != self.negated
    }

    pub fn contains(&self, cp: u32) -> bool {
        if cp < 128 {
            return self.ascii[(cp / 64) as usize] >> (cp % 64) & 1 == 1;
        }
        self.contains_slow(cp)
    }

    /// Whether some code point in `lo..=hi` is in the class (used while a
    /// UTF-8 sequence is incomplete: its first bytes fix such a range).
    pub fn intersects(&self, lo: u32, hi: u32) -> bool {
        if !self.negated {
            return self.ranges.iter().any(|&(a, b)| a <= hi && lo <= b);
        }
        // Negated: some point of lo..=hi lies outside every range.
        let mut r: Vec<(u32, u32)> = self
            .ranges
            .iter()
            .filter(|&&(a, b)| a <= hi && lo <= b)
            .copied()
            .collect();
        r.sort_unstable();
        let mut next = lo;
        for (a, b) in r {
            if a > next {
                return true;
            }
            next = next.max(b.saturating_add(1));
            if next > hi {
                return false;
            }
        }
        next <= hi
    }
}

/// One element of an alternative.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    /// One code point from `classes[i]`.
    Class(u32),
    /// The rule `rules[i]`.
    Ref(u32),
    /// The end of an alternative.
    End,
}

#[derive(Clone, Debug)]
pub struct Rule {
    pub name: String,
    /// Where each alternative starts in [`Grammar::elems`].
    pub alts: Vec<u32>,
}

/// A checked grammar, ready for [`crate::Matcher`].
#[derive(Clone, Debug)]
pub struct Grammar {
    pub elems: Vec<Elem>,
    pub classes: Vec<CharClass>,
    pub rules: Vec<Rule>,
    pub root: u32,
}

/// The most elements a grammar may lower to: bounds what a request can
/// make the server allocate (`x{1,100000}` lowers to 100000 rules).
pub const MAX_ELEMS: usize = 1 << 20;

/// A grammar as parsed, before lowering (see [`crate::gbnf`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Node {
    /// A sequence of code points.
    Literal(Vec<u32>),
    Class(CharClass),
    Ref {
        name: String,
        line: usize,
        col: usize,
    },
    /// Alternatives, each a sequence.
    Group(Vec<Vec<Node>>),
    Repeat {
        node: Box<Node>,
        min: u32,
        /// `None`: unbounded.
        max: Option<u32>,
    },
}

/// Builds a [`Grammar`] from named rules of [`Node`]s.
pub(crate) struct Builder {
    g: Grammar,
    names: HashMap<String, u32>,
    defined: Vec<bool>,
    /// Anonymous rules made for groups and repetitions.
    anon: usize,
    /// Rules made by lowering, whose bodies wait to be laid out.
    pending: Vec<(u32, Vec<Vec<Node>>)>,
    /// (rule, line, col) of the first use of each rule, for errors.
    uses: HashMap<u32, (usize, usize)>,
}

impl Builder {
    pub fn new() -> Builder {
        Builder {
            g: Grammar {
                elems: Vec::new(),
                classes: Vec::new(),
                rules: Vec::new(),
                root: 0,
            },
            names: HashMap::new(),
            defined: Vec::new(),
            anon: 0,
            pending: Vec::new(),
            uses: HashMap::new(),
        }
    }

    fn rule_id(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.names.get(name) {
            return id;
        }
        let id = self.g.rules.len() as u32;
        self.g.rules.push(Rule {
            name: name.to_string(),
            alts: Vec::new(),
        });
        self.defined.push(false);
        self.names.insert(name.to_string(), id);
        id
    }

    pub fn is_defined(&self, name: &str) -> bool {
        self.names
            .get(name)
            .is_some_and(|&id| self.defined[id as usize])
    }

    /// Define `name ::= alts`.
    pub fn define(&mut self, name: &str, alts: Vec<Vec<Node>>) -> Result<(), GrammarError> {
        let id = self.rule_id(name);
        self.defined[id as usize] = true;
        self.lay_out(id, alts)?;
        while let Some((id, alts)) = self.pending.pop() {
            self.lay_out(id, alts)?;
        }
        Ok(())
    }

    fn fresh(&mut self, base: &str) -> u32 {
        loop {
            self.anon += 1;
            let name = format!("{base}-{}", self.anon);
            if !self.names.contains_key(&name) {
                let id = self.rule_id(&name);
                self.defined[id as usize] = true;
                return id;
            }
        }
    }

    fn lay_out(&mut self, id: u32, alts: Vec<Vec<Node>>) -> Result<(), GrammarError> {
        let base = self.g.rules[id as usize].name.clone();
        for seq in alts {
            let mut elems = Vec::new();
            for node in seq {
                self.lower(&base, node, &mut elems)?;
            }
            let start = self.g.elems.len() as u32;
            self.g.elems.extend(elems);
            self.g.elems.push(Elem::End);
            if self.g.elems.len() > MAX_ELEMS {
                return Err(GrammarError::TooLarge(MAX_ELEMS));
            }
            self.g.rules[id as usize].alts.push(start);
        }
        Ok(())
    }

    fn class(&mut self, c: CharClass) -> Elem {
        // Literals repeat the same few characters: share their classes.
        if let Some(i) = self.g.classes.iter().rposition(|x| *x == c) {
            return Elem::Class(i as u32);
        }
        self.g.classes.push(c);
        Elem::Class(self.g.classes.len() as u32 - 1)
    }

    /// A rule standing for `alts`, laid out later.
    fn anon_rule(&mut self, base: &str, alts: Vec<Vec<Node>>) -> u32 {
        let id = self.fresh(base);
        self.pending.push((id, alts));
        id
    }

    fn lower(&mut self, base: &str, node: Node, out: &mut Vec<Elem>) -> Result<(), GrammarError> {
        if out.len() > MAX_ELEMS {
            return Err(GrammarError::TooLarge(MAX_ELEMS));
        }
        match node {
            Node::Literal(cps) => {
                for cp in cps {
                    let e = self.class(CharClass::new(vec![(cp, cp)], false));
                    out.push(e);
                }
            }
            Node::Class(c) => {
                let e = self.class(c);
                out.push(e);
            }
            Node::Ref { name, line, col } => {
                let id = self.rule_id(&name);
                self.uses.entry(id).or_insert((line, col));
                out.push(Elem::Ref(id));
            }
            Node::Group(mut alts) => {
                if alts.len() == 1 {
                    for n in alts.pop().unwrap_or_default() {
                        self.lower(base, n, out)?;
                    }
                } else {
                    let id = self.anon_rule(base, alts);
                    out.push(Elem::Ref(id));
                }
            }
            Node::Repeat { node, min, max } => {
                if max.is_some_and(|m| m < min) {
                    return Err(GrammarError::Invalid(format!(
                        "repetition {{{min},{}}} has max below min",
                        max.unwrap_or(0)
                    )));
                }
                let total = max.unwrap_or(min) as usize;
                if total > MAX_ELEMS / 4 {
                    return Err(GrammarError::TooLarge(MAX_ELEMS));
                }
                for _ in 0..min {
                    self.lower(base, (*node).clone(), out)?;
                }
                match max {
                    // x*: r ::= x r | (the reference in tail position
                    // keeps the matcher's stack flat however many repeats).
                    None => {
                        let id = self.fresh(base);
                        self.pending
                            .push((id, vec![vec![*node, self.self_ref(id)], Vec::new()]));
                        out.push(Elem::Ref(id));
                    }
                    // x{0,k}: r1 ::= x r2 |, …, rk ::= x |.
                    Some(m) if m > min => {
                        let mut next: Option<u32> = None;
                        for _ in min..m {
                            let id = self.fresh(base);
                            let mut seq = vec![(*node).clone()];
                            if let Some(n) = next {
                                seq.push(self.self_ref(n));
                            }
                            self.pending.push((id, vec![seq, Vec::new()]));
                            next = Some(id);
                        }
                        if let Some(n) = next {
                            out.push(Elem::Ref(n));
                        }
                    }
                    Some(_) => {}
                }
            }
        }
        Ok(())
    }

    fn self_ref(&self, id: u32) -> Node {
        Node::Ref {
            name: self.g.rules[id as usize].name.clone(),
            line: 0,
            col: 0,
        }
    }

    /// Check and return the grammar rooted at `root`.
    pub fn finish(mut self, root: &str) -> Result<Grammar, GrammarError> {
        for (i, r) in self.g.rules.iter().enumerate() {
            if !self.defined[i] {
                let (line, col) = self.uses.get(&(i as u32)).copied().unwrap_or((0, 0));
                return Err(GrammarError::Undefined {
                    name: r.name.clone(),
                    line,
                    col,
                });
            }
        }
        let Some(&root) = self.names.get(root) else {
            return Err(GrammarError::NoRoot(root.to_string()));
        };
        self.g.root = root;
        check_left_recursion(&self.g)?;
        Ok(self.g)
    }
}

/// Which rules can match the empty string.
fn nullable(g: &Grammar) -> Vec<bool> {
    let mut n = vec![false; g.rules.len()];
    loop {
        let mut changed = false;
        for (r, rule) in g.rules.iter().enumerate() {
            if n[r] {
                continue;
            }
            let any = rule.alts.iter().any(|&start| {
                let mut p = start as usize;
                loop {
                    match g.elems[p] {
                        Elem::End => return true,
                        Elem::Class(_) => return false,
                        Elem::Ref(x) if n[x as usize] => p += 1,
                        Elem::Ref(_) => return false,
                    }
                }
            });
            if any {
                n[r] = true;
                changed = true;
            }
        }
        if !changed {
            return n;
        }
    }
}

/// Refuse rules that reach themselves before consuming a character.
fn check_left_recursion(g: &Grammar) -> Result<(), GrammarError> {
    let null = nullable(g);
    // left[r]: rules referenced at a position only nullable refs precede.
    let left: Vec<Vec<u32>> = g
        .rules
        .iter()
        .map(|rule| {
            let mut v = Vec::new();
            for &start in &rule.alts {
                let mut p = start as usize;
                while let Elem::Ref(x) = g.elems[p] {
                    v.push(x);
                    if !null[x as usize] {
                        break;
                    }
                    p += 1;
                }
            }
            v
        })
        .collect();
    // Iterative DFS with colours: 1 on the path, 2 done.
    let mut colour = vec![0u8; g.rules.len()];
    for s in 0..g.rules.len() {
        if colour[s] != 0 {
            continue;
        }
        let mut stack = vec![(s as u32, 0usize)];
        colour[s] = 1;
        while let Some(&mut (r, ref mut i)) = stack.last_mut() {
            if let Some(&x) = left[r as usize].get(*i) {
                *i += 1;
                match colour[x as usize] {
                    0 => {
                        colour[x as usize] = 1;
                        stack.push((x, 0));
                    }
                    1 => {
                        return Err(GrammarError::LeftRecursion(
                            g.rules[x as usize].name.clone(),
                        ))
                    }
                    _ => {}
                }
            } else {
                colour[r as usize] = 2;
                stack.pop();
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_with_ranges_negation_and_partial_ranges() {
        let c = CharClass::new(vec![('a' as u32, 'z' as u32), (0x4e00, 0x9fff)], false);
        assert!(c.contains('q' as u32) && c.contains(0x4e2d) && !c.contains('A' as u32));
        let n = CharClass::new(vec![('"' as u32, '"' as u32), (0, 0x1f)], true);
        assert!(n.contains('a' as u32) && !n.contains('"' as u32) && !n.contains(10));
        assert!(n.contains(0x4e2d));
        // A 3-byte UTF-8 prefix E4 B8 fixes 0x4E00..=0x4E3F.
        assert!(c.intersects(0x4e00, 0x4e3f));
        assert!(!c.intersects(0x100, 0x13f));
        let only = CharClass::new(vec![(0x100, 0x13f)], true);
        assert!(!only.intersects(0x100, 0x13f));
        assert!(only.intersects(0x100, 0x140));
        assert!(CharClass::any().intersects(0x10000, 0x3ffff));
    }
}
