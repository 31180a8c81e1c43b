//! Prompt lookup: draft the tokens that followed the last time the
//! sequence's most recent n-gram occurred.
//!
//! When an agent rewrites a file, the output copies long runs of the
//! prompt; the n-gram just generated usually occurred in the prompt, and
//! what followed it there is what comes next. The index maps every n-gram
//! (for each size from `ngram_min` to `ngram_max`) to the position after
//! its latest occurrence, and grows as tokens arrive, so a lookup costs a
//! few hash probes whatever the length of the sequence.

use std::collections::HashMap;

/// The n-gram index of one sequence.
#[derive(Debug, Clone)]
pub struct PromptLookup {
    ngram_min: usize,
    ngram_max: usize,
    /// Per size (index `n - ngram_min`): n-gram hash → end of its latest
    /// occurrence (the position of the token after it).
    index: Vec<HashMap<u64, usize>>,
    /// Tokens indexed so far (a prefix of the sequence).
    tokens: Vec<u32>,
}

fn hash(gram: &[u32]) -> u64 {
    // FNV-1a over the ids: collisions are checked against the tokens.
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &t in gram {
        for b in t.to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

impl PromptLookup {
    /// An index of n-grams of `ngram_min..=ngram_max` tokens (both ≥ 1).
    pub fn new(ngram_min: usize, ngram_max: usize) -> PromptLookup {
        let ngram_min = ngram_min.max(1);
        let ngram_max = ngram_max.max(ngram_min);
        PromptLookup {
            ngram_min,
            ngram_max,
            index: vec![HashMap::new(); ngram_max - ngram_min + 1],
            tokens: Vec::new(),
        }
    }

    /// Bring the index up to `history` (the whole sequence so far). A
    /// history that is not an extension of what was indexed (another
    /// conversation) rebuilds it.
    pub fn sync(&mut self, history: &[u32]) {
        if history.len() < self.tokens.len() || history[..self.tokens.len()] != self.tokens[..] {
            self.index.iter_mut().for_each(HashMap::clear);
            self.tokens.clear();
        }
        for &t in &history[self.tokens.len()..] {
            self.tokens.push(t);
            // Index the n-grams ending before the new token: an n-gram is
            // only useful once a token follows it.
            let end = self.tokens.len() - 1;
            for n in self.ngram_min..=self.ngram_max {
                if end >= n {
                    let h = hash(&self.tokens[end - n..end]);
                    self.index[n - self.ngram_min].insert(h, end);
                }
            }
        }
    }

    /// Up to `max` tokens that followed the latest earlier occurrence of
    /// the longest n-gram ending the sequence (empty when none occurred).
    pub fn draft(&mut self, history: &[u32], max: usize) -> Vec<u32> {
        self.sync(history);
        let len = self.tokens.len();
        if max == 0 {
            return Vec::new();
        }
        for n in (self.ngram_min..=self.ngram_max).rev() {
            if len < n + 1 {
                continue;
            }
            let suffix = &self.tokens[len - n..];
            let Some(&end) = self.index[n - self.ngram_min].get(&hash(suffix)) else {
                continue;
            };
            // `end <= len - 1`: the occurrence ends before the suffix does,
            // so at least one token follows it.
            if end < n || self.tokens[end - n..end] != *suffix {
                continue;
            }
            let stop = (end + max).min(len);
            return self.tokens[end..stop].to_vec();
        }
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The naive definition: scan backwards for the latest earlier
    /// occurrence of the longest suffix n-gram.
    fn naive(h: &[u32], nmin: usize, nmax: usize, max: usize) -> Vec<u32> {
        for n in (nmin..=nmax).rev() {
            if h.len() < n + 1 {
                continue;
            }
            let suffix = &h[h.len() - n..];
            for end in (n..h.len()).rev() {
                if &h[end - n..end] == suffix {
                    return h[end..(end + max).min(h.len())].to_vec();
                }
            }
        }
        Vec::new()
    }

    #[test]
    fn matches_the_naive_scan_on_random_sequences() {
        let mut seed = 7u64;
        let mut next = |m: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 33) % m) as u32
        };
        for trial in 0..50 {
            let vocab = 3 + (trial % 5) as u64;
            let mut lk = PromptLookup::new(1, 4);
            let mut h = Vec::new();
            for _ in 0..200 {
                h.push(next(vocab));
                let want = naive(&h, 1, 4, 6);
                assert_eq!(lk.draft(&h, 6), want, "trial {trial} len {}", h.len());
            }
        }
    }

    #[test]
    fn a_rewrite_drafts_the_rest_of_the_copied_line() {
        // "fn add ( a , b )" in the prompt; the output has begun to copy it.
        let prompt = [10, 11, 12, 13, 14, 15, 16, 99, 20, 21];
        let mut h = prompt.to_vec();
        h.extend([50, 10, 11, 12]);
        let mut lk = PromptLookup::new(2, 4);
        assert_eq!(lk.draft(&h, 4), vec![13, 14, 15, 16]);
        assert_eq!(
            lk.draft(&h, 16),
            vec![13, 14, 15, 16, 99, 20, 21, 50, 10, 11, 12]
        );
        // No n-gram of two or more tokens matches: nothing to draft.
        h.push(77);
        assert!(lk.draft(&h, 4).is_empty());
        // Another conversation: the index starts again.
        assert_eq!(lk.draft(&[1, 2, 3, 1, 2], 3), vec![3, 1, 2]);
    }
}
