//! The speculative-decoding options, parsed once: the shared clap flags of
//! `generate`, `bench model` and `serve`, and the typed options they give.

/// Where drafts come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SpecMode {
    /// No speculation: one token per forward pass.
    #[default]
    None,
    /// N-gram matches in the sequence so far (prompt and generated text).
    Lookup,
    /// The model's multi-token-prediction layer as a built-in draft model.
    Mtp,
}

impl SpecMode {
    pub fn name(self) -> &'static str {
        match self {
            SpecMode::None => "none",
            SpecMode::Lookup => "lookup",
            SpecMode::Mtp => "mtp",
        }
    }

    /// The mode a request names (`"none"`, `"lookup"`, `"mtp"`).
    pub fn parse(s: &str) -> Option<SpecMode> {
        match s {
            "none" => Some(SpecMode::None),
            "lookup" => Some(SpecMode::Lookup),
            "mtp" => Some(SpecMode::Mtp),
            _ => None,
        }
    }
}

/// Typed speculative-decoding options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpecOptions {
    pub mode: SpecMode,
    /// Most draft tokens per verify pass.
    pub draft_max: usize,
    /// Fewer draft tokens than this are not verified (a plain step runs).
    pub draft_min: usize,
    /// N-gram sizes prompt lookup matches, longest first.
    pub ngram_min: usize,
    pub ngram_max: usize,
    /// Take plain steps while verify passes cost more per token than plain
    /// decoding (measured as the run goes; off: draft every step, for tests
    /// that must exercise every pass).
    pub adaptive: bool,
}

/// The largest `--draft-max`: a verify pass of more tokens is a prompt
/// chunk, and acceptance runs that long are rare.
pub const DRAFT_MAX_LIMIT: usize = 64;

impl Default for SpecOptions {
    fn default() -> Self {
        SpecOptions {
            mode: SpecMode::None,
            draft_max: 16,
            draft_min: 0,
            ngram_min: 2,
            ngram_max: 4,
            adaptive: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        spec: SpecArgs,
    }

    #[test]
    fn the_flags_default_to_the_options_default_and_bad_values_are_named() {
        let c = Cli::parse_from(["x"]);
        assert_eq!(c.spec.options().unwrap(), SpecOptions::default());
        assert_eq!(
            SpecArgs::default().options().unwrap(),
            SpecOptions::default()
        );
        let c = Cli::parse_from([
            "x",
            "--spec",
            "lookup",
            "--draft-max",
            "8",
            "--draft-min",
            "2",
        ]);
        let o = c.spec.options().unwrap();
        assert_eq!((o.mode, o.draft_max, o.draft_min), (SpecMode::Lookup, 8, 2));
        let e = Cli::parse_from(["x", "--draft-max", "0"])
            .spec
            .options()
            .unwrap_err();
        assert!(e.contains("--draft-max 0"), "{e}");
        let e = Cli::parse_from(["x", "--draft-min", "20"])
            .spec
            .options()
            .unwrap_err();
        assert!(
            e.contains("--draft-min 20") && e.contains("--draft-max 16"),
            "{e}"
        );
        assert!(Cli::try_parse_from(["x", "--spec", "eagle"]).is_err());
    }
}

impl SpecOptions {
    /// A clear error for options that cannot work together.
    pub fn check(&self) -> Result<(), String> {
        if self.draft_max == 0 || self.draft_max > DRAFT_MAX_LIMIT {
            return Err(format!(
                "--draft-max {} is outside 1..={DRAFT_MAX_LIMIT}",
                self.draft_max
            ));
        }
        if self.draft_min > self.draft_max {
            return Err(format!(
                "--draft-min {} is above --draft-max {}",
                self.draft_min, self.draft_max
            ));
        }
        if self.ngram_min == 0 || self.ngram_min > self.ngram_max || self.ngram_max > 64 {
            return Err(format!(
                "--lookup-ngram-min {} / --lookup-ngram-max {}: want 1 <= min <= max <= 64",
                self.ngram_min, self.ngram_max
            ));
        }
        Ok(())
    }
}

/// The speculative-decoding flags (llama.cpp's names where it has them).
#[derive(clap::Args, Debug, Clone)]
pub struct SpecArgs {
    /// Speculative decoding: draft tokens from n-gram matches in the
    /// sequence (lookup) or the model's MTP layer (mtp), verify them in one
    /// pass, keep what the model itself would have produced.
    #[arg(long = "spec", value_enum, default_value_t = SpecMode::None)]
    pub spec: SpecMode,
    /// Most draft tokens per verify pass.
    #[arg(long, default_value_t = 16)]
    pub draft_max: usize,
    /// Fewer draft tokens than this run a plain step instead.
    #[arg(long, default_value_t = 0)]
    pub draft_min: usize,
    /// Shortest n-gram prompt lookup matches.
    #[arg(long, default_value_t = 2)]
    pub lookup_ngram_min: usize,
    /// Longest n-gram prompt lookup matches (tried first).
    #[arg(long, default_value_t = 4)]
    pub lookup_ngram_max: usize,
    /// Draft every step, even while verify passes cost more per token than
    /// plain decoding (by default such stretches take plain steps).
    #[arg(long)]
    pub spec_always: bool,
}

impl Default for SpecArgs {
    /// What the command line gives without these flags.
    fn default() -> Self {
        let o = SpecOptions::default();
        SpecArgs {
            spec: o.mode,
            draft_max: o.draft_max,
            draft_min: o.draft_min,
            lookup_ngram_min: o.ngram_min,
            lookup_ngram_max: o.ngram_max,
            spec_always: !o.adaptive,
        }
    }
}

impl SpecArgs {
    pub fn options(&self) -> Result<SpecOptions, String> {
        let o = SpecOptions {
            mode: self.spec,
            draft_max: self.draft_max,
            draft_min: self.draft_min,
            ngram_min: self.lookup_ngram_min,
            ngram_max: self.lookup_ngram_max,
            adaptive: !self.spec_always,
        };
        o.check()?;
        Ok(o)
    }
}
