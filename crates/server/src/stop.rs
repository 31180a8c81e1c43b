//! Stop strings over streamed text: a stop string split across chunks is
//! still found, and text that might be the start of one is held back until
//! the next chunk decides.

/// Cuts a text stream at the first stop string.
#[derive(Debug, Default, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
    stopped: bool,
    /// The stop string that ended the stream.
    matched: Option<String>,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            pending: String::new(),
            stopped: false,
            matched: None,
        }
    }

    /// Whether a stop string was seen.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// The stop string that ended the stream, once one has.
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// Add text; returns what can be emitted now, and whether a stop string
    /// ended the stream (everything from it on is dropped).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        if self.stopped {
            return (String::new(), true);
        }
        self.pending.push_str(text);
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|(at, _)| *at);
        if let Some((at, s)) = first {
            self.matched = Some(s.clone());
            let out = self.pending[..at].to_string();
            self.pending.clear();
            self.stopped = true;
            return (out, true);
        }
        let keep = self.held_back();
        let cut = self.pending.len() - keep;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        (out, false)
    }

    /// End of stream: what was held back is text after all.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Bytes at the end of `pending` that are a proper prefix of some stop
    /// string (the longest such suffix, on a char boundary).
    fn held_back(&self) -> usize {
        let p = &self.pending;
        let mut best = 0;
        for s in &self.stops {
            let max = (s.len() - 1).min(p.len());
            for k in (best + 1..=max).rev() {
                let start = p.len() - k;
                if p.is_char_boundary(start) && s.starts_with(&p[start..]) {
                    best = k;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], chunks: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for c in chunks {
            let (t, stop) = m.push(c);
            out.push_str(&t);
            if stop {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn no_stops_passes_through() {
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
    }

    #[test]
    fn stop_within_a_chunk() {
        assert_eq!(run(&["END"], &["abcENDdef"]), ("abc".into(), true));
    }

    #[test]
    fn stop_across_chunks_is_cut_and_nothing_leaks() {
        let mut m = StopMatcher::new(vec!["STOP".into()]);
        assert_eq!(m.push("hello S"), ("hello ".into(), false));
        assert_eq!(m.push("TO"), ("".into(), false));
        assert_eq!(m.push("P and more"), ("".into(), true));
        assert!(m.stopped());
    }

    #[test]
    fn false_start_is_released() {
        assert_eq!(
            run(&["STOP"], &["a S", "TOx", "y"]),
            ("a STOxy".into(), false)
        );
        assert_eq!(run(&["STOP"], &["a ST"]), ("a ST".into(), false));
    }

    #[test]
    fn earliest_of_several_wins() {
        assert_eq!(run(&["bb", "a"], &["xxbba"]), ("xx".into(), true));
        assert_eq!(run(&["\n\n", "."], &["one.", "\n\n"]), ("one".into(), true));
    }

    #[test]
    fn multibyte_text_is_safe() {
        assert_eq!(run(&["é!"], &["caféé", "!x"]), ("café".into(), true));
        assert_eq!(
            run(&["日本"], &["今日は日", "曜"]),
            ("今日は日曜".into(), false)
        );
    }

    #[test]
    fn the_matched_stop_string_is_the_earliest() {
        let mut m = StopMatcher::new(vec!["END".into(), "b".into()]);
        assert_eq!(m.matched(), None);
        assert_eq!(m.push("aEN"), ("a".to_string(), false));
        assert_eq!(m.push("Dxb"), (String::new(), true));
        // "END" starts at 1, "b" at 5: the earlier one ended it.
        assert_eq!(m.matched(), Some("END"));
    }
}
