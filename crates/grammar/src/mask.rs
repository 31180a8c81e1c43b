//! Token masks: which tokens of a vocabulary keep a grammar alive.
//!
//! The vocabulary is a byte trie laid out in preorder (each node knows
//! where its subtree ends), so a walk that dies at a node skips every token
//! below it: a step costs the nodes the grammar allows, not 150k tries.
//!
//! Walks are cached. A stack's behaviour on a token, as long as the token
//! stays within the stack's top [`FRAME`] positions, depends on those
//! positions only; so a walk is made once per frame (a grammar has few)
//! and kept: the tokens it accepts, and the tokens that leave the frame
//! (with the byte offset where they do). At run time the mask of a state is
//! the union, over its stacks, of the cached accepted sets plus those
//! leaving tokens whose remaining bytes the rest of the stack accepts.
//! A state inside an unfinished UTF-8 character is walked whole, uncached.

use crate::matcher::{Matcher, Partial, Stepper, ACCEPT, FLOOR};
use crate::{Grammar, GrammarError};
use std::collections::HashMap;
use std::sync::Arc;

/// Positions per cached frame.
pub const FRAME: usize = 3;
/// Most cached frames per constraint (each holds a bit per token).
pub const MAX_CACHED: usize = 256;

#[derive(Clone, Copy, Debug)]
struct TrieNode {
    byte: u8,
    /// 1 for the first byte of a token.
    depth: u16,
    /// Index past this node's subtree.
    end: u32,
    /// The tokens ending here: `toks[tok_lo..tok_hi]`.
    tok_lo: u32,
    tok_hi: u32,
}

/// A vocabulary as byte strings, in a trie.
#[derive(Clone, Debug)]
pub struct Vocab {
    nodes: Vec<TrieNode>,
    toks: Vec<u32>,
    pieces: Vec<u8>,
    offs: Vec<u32>,
    n_vocab: usize,
    eog: Vec<u32>,
}

impl Vocab {
    /// `piece(id)`: the bytes token `id` stands for, or `None` for tokens
    /// the grammar must never produce (control tokens). `eog`: the
    /// end-of-generation tokens, allowed only once the grammar is complete.
    pub fn new<'a>(n_vocab: usize, piece: impl Fn(u32) -> Option<&'a [u8]>, eog: &[u32]) -> Vocab {
        let mut pieces = Vec::new();
        let mut offs = Vec::with_capacity(n_vocab + 1);
        let mut list: Vec<u32> = Vec::new();
        offs.push(0u32);
        for id in 0..n_vocab as u32 {
            if let Some(p) = piece(id).filter(|p| !p.is_empty() && !eog.contains(&id)) {
                pieces.extend_from_slice(p);
                list.push(id);
            }
            offs.push(pieces.len() as u32);
        }
        let bytes = |id: u32| &pieces[offs[id as usize] as usize..offs[id as usize + 1] as usize];
        list.sort_by(|&a, &b| bytes(a).cmp(bytes(b)).then(a.cmp(&b)));
        let mut nodes: Vec<TrieNode> = Vec::new();
        let mut toks = Vec::with_capacity(list.len());
        // path[d]: the node holding byte d of the previous token.
        let mut path: Vec<usize> = Vec::new();
        let mut prev: &[u8] = &[];
        for &id in &list {
            let b = bytes(id);
            let lcp = prev.iter().zip(b).take_while(|(x, y)| x == y).count();
            path.truncate(lcp);
            for (d, &byte) in b.iter().enumerate().skip(lcp) {
                let at = toks.len() as u32;
                nodes.push(TrieNode {
                    byte,
                    depth: (d + 1).min(u16::MAX as usize) as u16,
                    end: 0,
                    tok_lo: at,
                    tok_hi: at,
                });
                path.push(nodes.len() - 1);
            }
            let last = path[b.len() - 1];
            toks.push(id);
            nodes[last].tok_hi = toks.len() as u32;
            prev = b;
        }
        // Subtree ends: the next node at the same depth or shallower.
        let mut open: Vec<usize> = Vec::new();
        for i in 0..nodes.len() {
            while let Some(&j) = open.last() {
                if nodes[j].depth >= nodes[i].depth {
                    nodes[j].end = i as u32;
                    open.pop();
                } else {
                    break;
                }
            }
            open.push(i);
        }
        for j in open {
            nodes[j].end = nodes.len() as u32;
        }
        let mut eog = eog.to_vec();
        eog.sort_unstable();
        Vocab {
            nodes,
            toks,
            pieces,
            offs,
            n_vocab,
            eog,
        }
    }

    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// Trie nodes (one per distinct token prefix).
    pub fn trie_nodes(&self) -> usize {
        self.nodes.len()
    }

    /// The bytes of a token the grammar may produce (`None` for control and
    /// end-of-generation tokens).
    pub fn piece(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        if i >= self.n_vocab {
            return None;
        }
        let p = &self.pieces[self.offs[i] as usize..self.offs[i + 1] as usize];
        (!p.is_empty()).then_some(p)
    }

    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }
}

fn words(n: usize) -> usize {
    n.div_ceil(64)
}

fn set(bits: &mut [u64], i: u32) {
    bits[i as usize / 64] |= 1 << (i % 64);
}

fn get(bits: &[u64], i: u32) -> bool {
    bits[i as usize / 64] >> (i % 64) & 1 == 1
}

#[derive(Hash, PartialEq, Eq, Clone, Copy, Debug)]
struct FrameKey {
    pos: [u32; FRAME],
    /// The stack ends within the frame (leaving it is completing the grammar).
    bottom: bool,
}

#[derive(Debug)]
struct Entry {
    accepted: Vec<u64>,
    /// (token, offset): the token leaves the frame after `offset` bytes.
    exits: Vec<(u32, u16)>,
}

/// Counters of the work masks took.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MaskStats {
    pub masks: u64,
    /// Frames walked over the trie (cache misses).
    pub walks: u64,
    /// Frames found in the cache.
    pub hits: u64,
    /// Walks of a whole state (inside an unfinished UTF-8 character).
    pub full_walks: u64,
    /// Trie nodes visited by walks.
    pub nodes: u64,
    /// Leaving tokens checked against the rest of a stack.
    pub exit_checks: u64,
}

/// A grammar applied to one generation: the matcher, the vocabulary and
/// the cache of frame walks.
#[derive(Debug)]
pub struct Constraint {
    m: Matcher,
    vocab: Arc<Vocab>,
    cache: HashMap<FrameKey, Arc<Entry>>,
    mask: Vec<u64>,
    pub stats: MaskStats,
}

impl Constraint {
    pub fn new(g: Arc<Grammar>, vocab: Arc<Vocab>) -> Result<Constraint, GrammarError> {
        let n = words(vocab.n_vocab);
        Ok(Constraint {
            m: Matcher::new(g)?,
            vocab,
            cache: HashMap::new(),
            mask: vec![0; n],
            stats: MaskStats::default(),
        })
    }

    pub fn vocab(&self) -> &Arc<Vocab> {
        &self.vocab
    }

    pub fn is_complete(&self) -> bool {
        self.m.is_complete()
    }

    /// Whether only end-of-generation can follow.
    pub fn is_finished(&self) -> bool {
        self.m.is_finished()
    }

    /// The allowed tokens now, one bit per token id.
    pub fn compute_mask(&mut self) -> Result<&[u64], GrammarError> {
        self.stats.masks += 1;
        self.mask.iter_mut().for_each(|w| *w = 0);
        let mut mask = std::mem::take(&mut self.mask);
        let r = self.fill(&mut mask);
        self.mask = mask;
        r?;
        if self.m.is_complete() {
            for &e in &self.vocab.eog {
                if (e as usize) < self.vocab.n_vocab {
                    set(&mut self.mask, e);
                }
            }
        }
        Ok(&self.mask)
    }

    fn fill(&mut self, mask: &mut [u64]) -> Result<(), GrammarError> {
        let vocab = self.vocab.clone();
        let mark = self.m.st.arena.len();
        if self.m.partial.rem != 0 {
            self.stats.full_walks += 1;
            let init = self.m.stacks.clone();
            let n = walk(&mut self.m.st, &vocab, init, self.m.partial, mask, None)?;
            self.stats.nodes += n;
            self.m.st.arena.truncate(mark);
            return Ok(());
        }
        let stacks = self.m.stacks.clone();
        for s in stacks {
            if s == ACCEPT {
                continue;
            }
            let (key, below) = self.frame(s);
            let entry = match self.cache.get(&key) {
                Some(e) => {
                    self.stats.hits += 1;
                    e.clone()
                }
                None => {
                    self.stats.walks += 1;
                    let e = Arc::new(self.walk_frame(&key)?);
                    if self.cache.len() >= MAX_CACHED {
                        self.cache.clear();
                    }
                    self.cache.insert(key, e.clone());
                    e
                }
            };
            for (w, a) in mask.iter_mut().zip(&entry.accepted) {
                *w |= a;
            }
            if entry.exits.is_empty() || below >= FLOOR {
                continue;
            }
            // Where the rest of the stack resumes once the frame is done.
            let b = self.m.st.arena[below as usize];
            let mut resume = Vec::new();
            self.m.st.closure(b.pos, b.parent, &mut resume)?;
            self.m.st.dedup(&mut resume, 0);
            let mark2 = self.m.st.arena.len();
            for &(tok, off) in &entry.exits {
                if get(mask, tok) {
                    continue;
                }
                self.stats.exit_checks += 1;
                let Some(p) = vocab.piece(tok) else { continue };
                let (alive, _) = self
                    .m
                    .st
                    .run(&resume, Partial::default(), &p[off as usize..])?;
                if !alive.is_empty() {
                    set(mask, tok);
                }
                self.m.st.arena.truncate(mark2);
            }
        }
        self.m.st.arena.truncate(mark);
        Ok(())
    }

    /// The top positions of stack `s`, and the node below them (`FLOOR`
    /// upward when the stack ends inside the frame).
    fn frame(&self, s: u32) -> (FrameKey, u32) {
        let mut pos = [u32::MAX; FRAME];
        let mut cur = s;
        for p in pos.iter_mut() {
            if cur >= FLOOR {
                break;
            }
            let n = self.m.st.arena[cur as usize];
            *p = n.pos;
            cur = n.parent;
        }
        (
            FrameKey {
                pos,
                bottom: cur == ACCEPT,
            },
            cur,
        )
    }

    fn walk_frame(&mut self, key: &FrameKey) -> Result<Entry, GrammarError> {
        let vocab = self.vocab.clone();
        let st = &mut self.m.st;
        let mark = st.arena.len();
        let mut parent = if key.bottom { ACCEPT } else { FLOOR };
        for &p in key.pos.iter().rev().filter(|&&p| p != u32::MAX) {
            parent = st.node(p, parent)?;
        }
        let mut accepted = vec![0u64; words(vocab.n_vocab)];
        let mut exits = Vec::new();
        let n = walk(
            st,
            &vocab,
            vec![parent],
            Partial::default(),
            &mut accepted,
            Some(&mut exits),
        );
        st.arena.truncate(mark);
        self.stats.nodes += n?;
        Ok(Entry { accepted, exits })
    }

    /// Set disallowed logits to -inf. Fails when no token is allowed.
    pub fn apply(&mut self, logits: &mut [f32]) -> Result<(), GrammarError> {
        let mask = self.compute_mask()?;
        let mut any = false;
        for (i, l) in logits.iter_mut().enumerate() {
            if i < mask.len() * 64 && get(mask, i as u32) {
                any |= *l > f32::NEG_INFINITY;
            } else {
                *l = f32::NEG_INFINITY;
            }
        }
        if !any {
            return Err(GrammarError::Invalid(
                "no token of the vocabulary can continue the grammar".into(),
            ));
        }
        Ok(())
    }

    /// Advance with the chosen token. `Ok(false)`: the grammar does not
    /// allow it (state unchanged). An end-of-generation token is allowed
    /// when the grammar is complete.
    pub fn accept_token(&mut self, id: u32) -> Result<bool, GrammarError> {
        if self.vocab.is_eog(id) {
            return Ok(self.m.is_complete());
        }
        let vocab = self.vocab.clone();
        match vocab.piece(id) {
            Some(p) => self.m.advance(p),
            None => Ok(false),
        }
    }
}

/// Walk the trie from `init`, setting the bit of every token the state
/// accepts; with `exits`, tokens that leave a frame (a [`FLOOR`] stack) are
/// listed there with their offset. Returns the nodes visited.
fn walk(
    st: &mut Stepper,
    vocab: &Vocab,
    init: Vec<u32>,
    partial: Partial,
    accepted: &mut [u64],
    mut exits: Option<&mut Vec<(u32, u16)>>,
) -> Result<u64, GrammarError> {
    let nodes = &vocab.nodes;
    let mut buf = init;
    // (start, end) in buf, pending character, arena length.
    let mut levels: Vec<(usize, usize, Partial, usize)> =
        vec![(0, buf.len(), partial, st.arena.len())];
    let mut out = Vec::new();
    let mut visited = 0u64;
    let mut i = 0usize;
    while i < nodes.len() {
        let n = nodes[i];
        let d = n.depth as usize;
        levels.truncate(d);
        let Some(&(s, e, p, alen)) = levels.last() else {
            break;
        };
        buf.truncate(e);
        st.arena.truncate(alen);
        out.clear();
        let next = st.step(&buf[s..e], p, n.byte, &mut out)?;
        let Some(np) = next.filter(|_| !out.is_empty()) else {
            i = n.end as usize;
            continue;
        };
        visited += 1;
        for &t in &vocab.toks[n.tok_lo as usize..n.tok_hi as usize] {
            set(accepted, t);
        }
        let leaf = n.end as usize == i + 1;
        if let Some(k) = out.iter().position(|&x| x == FLOOR) {
            out.swap_remove(k);
            if let (Some(ex), false) = (exits.as_deref_mut(), leaf) {
                let hi = nodes[n.end as usize - 1].tok_hi as usize;
                for &t in &vocab.toks[n.tok_hi as usize..hi] {
                    ex.push((t, d as u16));
                }
            }
        }
        if out.is_empty() || leaf {
            i = n.end as usize;
            continue;
        }
        let start = buf.len();
        buf.extend_from_slice(&out);
        levels.push((start, buf.len(), np, st.arena.len()));
        i += 1;
    }
    Ok(visited)
}
