//! The pushdown matcher. A *stack* is a chain of positions in
//! [`Grammar::elems`]: its top is the character class to match next, the
//! positions below are where each enclosing rule resumes. A matcher state
//! is a set of stacks (one per way the input so far can be read) and, when
//! the input ends inside a multi-byte UTF-8 character, that character's
//! first bytes.
//!
//! Stacks share their lower parts: they are nodes in an arena (position,
//! parent). A reference in tail position pushes nothing (its alternative
//! would only pop), so `x*` loops keep the stack flat.
//!
//! Bounds: at most [`MAX_STACKS`] stacks per state and [`MAX_DEPTH`] nested
//! rules; past them the step fails with an error instead of allocating
//! without end.

use crate::grammar::{Elem, Grammar};
use crate::GrammarError;
use std::sync::Arc;

/// The empty stack: everything matched, the grammar is complete.
pub const ACCEPT: u32 = u32::MAX;
/// The bottom of a partial stack (see [`crate::mask`]): reaching it means
/// the frame below decides what follows.
pub(crate) const FLOOR: u32 = u32::MAX - 1;

/// Most stacks one state may hold.
pub const MAX_STACKS: usize = 4096;
/// Most nested rules (a stack's depth).
pub const MAX_DEPTH: u32 = 2048;

#[derive(Clone, Copy, Debug)]
pub(crate) struct Node {
    pub pos: u32,
    pub parent: u32,
    pub depth: u32,
    pub hash: u64,
}

/// The first bytes of an incomplete UTF-8 character: `bits` so far and how
/// many continuation bytes are still due (0: none pending).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Partial {
    pub bits: u32,
    pub rem: u8,
    /// The character's length in bytes.
    pub len: u8,
}

impl Partial {
    /// The code points this prefix can still become.
    /// Overlong forms (a code point in more bytes than it needs) are not
    /// UTF-8: the range starts at the smallest code point of this length.
    fn range(self) -> (u32, u32) {
        let shift = 6 * self.rem as u32;
        let lo = self.bits << shift;
        let min = match self.len {
            2 => 0x80,
            3 => 0x800,
            _ => 0x10000,
        };
        (lo.max(min), (lo | ((1u32 << shift) - 1)).min(0x10ffff))
    }
}

fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn special_hash(id: u32) -> u64 {
    mix(id as u64, 0x5151)
}

/// The grammar and an arena of stack nodes: the steps every matcher state
/// is made by.
#[derive(Clone, Debug)]
pub(crate) struct Stepper {
    pub g: Arc<Grammar>,
    pub arena: Vec<Node>,
    tmp: Vec<u32>,
}

impl Stepper {
    pub fn new(g: Arc<Grammar>) -> Stepper {
        Stepper {
            g,
            arena: Vec::new(),
            tmp: Vec::new(),
        }
    }

    pub fn hash_of(&self, id: u32) -> u64 {
        if id >= FLOOR {
            special_hash(id)
        } else {
            self.arena[id as usize].hash
        }
    }

    fn depth_of(&self, id: u32) -> u32 {
        if id >= FLOOR {
            0
        } else {
            self.arena[id as usize].depth
        }
    }

    pub fn node(&mut self, pos: u32, parent: u32) -> Result<u32, GrammarError> {
        let depth = self.depth_of(parent) + 1;
        if depth > MAX_DEPTH {
            return Err(GrammarError::TooDeep(MAX_DEPTH));
        }
        let hash = mix(pos as u64 + 1, self.hash_of(parent));
        self.arena.push(Node {
            pos,
            parent,
            depth,
            hash,
        });
        Ok(self.arena.len() as u32 - 1)
    }

    /// The stacks that continue at `pos` with `parent` below, each with a
    /// character class on top (or [`ACCEPT`] / [`FLOOR`] when the input
    /// may end or leave the frame here), appended to `out`.
    pub fn closure(
        &mut self,
        pos: u32,
        parent: u32,
        out: &mut Vec<u32>,
    ) -> Result<(), GrammarError> {
        if out.len() > MAX_STACKS {
            return Err(GrammarError::TooAmbiguous(MAX_STACKS));
        }
        match self.g.elems[pos as usize] {
            Elem::Class(_) => {
                let n = self.node(pos, parent)?;
                out.push(n);
            }
            Elem::End => {
                if parent >= FLOOR {
                    out.push(parent);
                } else {
                    let p = self.arena[parent as usize];
                    self.closure(p.pos, p.parent, out)?;
                }
            }
            Elem::Ref(r) => {
                let cont = pos + 1;
                let below = if self.g.elems[cont as usize] == Elem::End {
                    parent
                } else {
                    self.node(cont, parent)?
                };
                if self.depth_of(below) > MAX_DEPTH {
                    return Err(GrammarError::TooDeep(MAX_DEPTH));
                }
                let g = self.g.clone();
                for &alt in &g.rules[r as usize].alts {
                    self.closure(alt, below, out)?;
                }
            }
        }
        Ok(())
    }

    /// Whether two stacks hold the same positions.
    fn same(&self, mut a: u32, mut b: u32) -> bool {
        loop {
            if a == b {
                return true;
            }
            if a >= FLOOR || b >= FLOOR {
                return false;
            }
            let (x, y) = (self.arena[a as usize], self.arena[b as usize]);
            if x.pos != y.pos || x.hash != y.hash {
                return false;
            }
            a = x.parent;
            b = y.parent;
        }
    }

    /// Drop repeated stacks from `v[from..]`.
    pub fn dedup(&self, v: &mut Vec<u32>, from: usize) {
        if v.len() - from < 2 {
            return;
        }
        let mut items: Vec<u32> = v.drain(from..).collect();
        items.sort_by_key(|&s| self.hash_of(s));
        let mut i = 0;
        while i < items.len() {
            let h = self.hash_of(items[i]);
            let start = v.len();
            let mut j = i;
            while j < items.len() && self.hash_of(items[j]) == h {
                let s = items[j];
                if !v[start..].iter().any(|&t| self.same(s, t)) {
                    v.push(s);
                }
                j += 1;
            }
            i = j;
        }
    }

    /// The start state: the closure of every root alternative.
    pub fn start(&mut self) -> Result<Vec<u32>, GrammarError> {
        let mut out = Vec::new();
        let g = self.g.clone();
        for &alt in &g.rules[g.root as usize].alts {
            self.closure(alt, ACCEPT, &mut out)?;
        }
        self.dedup(&mut out, 0);
        Ok(out)
    }

    fn class_of(&self, s: u32) -> Option<u32> {
        if s >= FLOOR {
            return None;
        }
        match self.g.elems[self.arena[s as usize].pos as usize] {
            Elem::Class(c) => Some(c),
            _ => None,
        }
    }

    /// Consume one byte: the stacks that live on are appended to `out`,
    /// and the new pending-character state returned (`None`: the byte is
    /// not valid UTF-8 here).
    pub fn step(
        &mut self,
        input: &[u32],
        partial: Partial,
        b: u8,
        out: &mut Vec<u32>,
    ) -> Result<Option<Partial>, GrammarError> {
        let next = if partial.rem == 0 {
            match b {
                0x00..=0x7f => {
                    self.step_cp(input, b as u32, out)?;
                    return Ok(Some(Partial::default()));
                }
                0xc2..=0xdf => Partial {
                    bits: (b & 0x1f) as u32,
                    rem: 1,
                    len: 2,
                },
                0xe0..=0xef => Partial {
                    bits: (b & 0x0f) as u32,
                    rem: 2,
                    len: 3,
                },
                0xf0..=0xf4 => Partial {
                    bits: (b & 0x07) as u32,
                    rem: 3,
                    len: 4,
                },
                _ => return Ok(None),
            }
        } else {
            if b & 0xc0 != 0x80 {
                return Ok(None);
            }
            let p = Partial {
                bits: partial.bits << 6 | (b & 0x3f) as u32,
                rem: partial.rem - 1,
                len: partial.len,
            };
            if p.rem == 0 {
                let (lo, hi) = Partial { rem: 0, ..p }.range();
                if lo != hi || (0xd800..=0xdfff).contains(&p.bits) {
                    // Overlong, past U+10FFFF, or a surrogate.
                    return Ok(None);
                }
                self.step_cp(input, p.bits, out)?;
                return Ok(Some(Partial::default()));
            }
            p
        };
        let (lo, hi) = next.range();
        if lo > hi || (lo >= 0xd800 && hi <= 0xdfff) {
            return Ok(None);
        }
        for &s in input {
            if let Some(c) = self.class_of(s) {
                if self.g.classes[c as usize].intersects(lo, hi) {
                    out.push(s);
                }
            }
        }
        Ok(Some(next))
    }

    fn step_cp(&mut self, input: &[u32], cp: u32, out: &mut Vec<u32>) -> Result<(), GrammarError> {
        let from = out.len();
        for &s in input {
            let Some(c) = self.class_of(s) else { continue };
            if self.g.classes[c as usize].contains(cp) {
                let n = self.arena[s as usize];
                self.closure(n.pos + 1, n.parent, out)?;
            }
        }
        self.dedup(out, from);
        Ok(())
    }

    /// Consume `bytes` from `stacks`; the stacks after (empty: rejected).
    pub fn run(
        &mut self,
        stacks: &[u32],
        mut partial: Partial,
        bytes: &[u8],
    ) -> Result<(Vec<u32>, Partial), GrammarError> {
        let mut cur = stacks.to_vec();
        let mut out = std::mem::take(&mut self.tmp);
        for &b in bytes {
            out.clear();
            match self.step(&cur, partial, b, &mut out)? {
                Some(p) if !out.is_empty() => partial = p,
                _ => {
                    cur.clear();
                    break;
                }
            }
            std::mem::swap(&mut cur, &mut out);
        }
        self.tmp = out;
        Ok((cur, partial))
    }

    /// Copy the stacks into a fresh arena (what earlier steps left behind
    /// is dropped); returns the stacks' new ids.
    pub fn compact(&mut self, stacks: &[u32]) -> Vec<u32> {
        let old = std::mem::take(&mut self.arena);
        let mut map = std::collections::HashMap::new();
        let mut out = Vec::with_capacity(stacks.len());
        for &s in stacks {
            out.push(copy_chain(&old, &mut self.arena, &mut map, s));
        }
        out
    }
}

fn copy_chain(
    old: &[Node],
    new: &mut Vec<Node>,
    map: &mut std::collections::HashMap<u32, u32>,
    s: u32,
) -> u32 {
    if s >= FLOOR {
        return s;
    }
    if let Some(&n) = map.get(&s) {
        return n;
    }
    // Walk down to the first copied node, then copy upwards.
    let mut chain = Vec::new();
    let mut cur = s;
    while cur < FLOOR && !map.contains_key(&cur) {
        chain.push(cur);
        cur = old[cur as usize].parent;
    }
    let mut parent = if cur >= FLOOR { cur } else { map[&cur] };
    for &id in chain.iter().rev() {
        let mut n = old[id as usize];
        n.parent = parent;
        new.push(n);
        parent = new.len() as u32 - 1;
        map.insert(id, parent);
    }
    parent
}

/// A grammar matched against bytes as they come.
#[derive(Clone, Debug)]
pub struct Matcher {
    pub(crate) st: Stepper,
    pub(crate) stacks: Vec<u32>,
    pub(crate) partial: Partial,
}

impl Matcher {
    pub fn new(g: Arc<Grammar>) -> Result<Matcher, GrammarError> {
        let mut st = Stepper::new(g);
        let stacks = st.start()?;
        Ok(Matcher {
            st,
            stacks,
            partial: Partial::default(),
        })
    }

    pub fn grammar(&self) -> &Arc<Grammar> {
        &self.st.g
    }

    /// Consume `bytes`. `Ok(false)` (state unchanged) when the grammar
    /// cannot continue with them.
    pub fn advance(&mut self, bytes: &[u8]) -> Result<bool, GrammarError> {
        let (next, partial) = self.st.run(&self.stacks, self.partial, bytes)?;
        if next.is_empty() {
            return Ok(false);
        }
        self.stacks = next;
        self.partial = partial;
        if self.st.arena.len() > 1 << 16 {
            self.stacks = self.st.compact(&self.stacks);
        }
        Ok(true)
    }

    /// Whether the input so far is a whole sentence of the grammar.
    pub fn is_complete(&self) -> bool {
        self.partial.rem == 0 && self.stacks.contains(&ACCEPT)
    }

    /// Whether nothing more can follow (complete and no stack left open).
    pub fn is_finished(&self) -> bool {
        self.stacks.iter().all(|&s| s == ACCEPT)
    }

    /// Whether the whole of `text` is a sentence of the grammar.
    pub fn matches(g: &Arc<Grammar>, text: &str) -> Result<bool, GrammarError> {
        let mut m = Matcher::new(g.clone())?;
        Ok(m.advance(text.as_bytes())? && m.is_complete())
    }
}
