//! Host decisions of the batched prefill under a bounded expert cache
//! (issue 19, item 3): which of a chunk's experts a MoE layer must upload,
//! where in the staging image each goes, how the uploads coalesce into
//! copies, how the routed tiles split between the cache's slots and the
//! staging image, and how large a chunk the memory plan allows. Pure (no
//! device), so the unit tests below pin every rule.
//!
//! The scheme: per MoE layer per chunk the router runs over the whole
//! chunk on the GPU and its top-k comes to the host (as at full
//! residency, for the tile list). The experts the chunk routes to that sit
//! in one of the layer's cache slots are read there, through the cache's
//! own `slot_of` table; the others are copied once, from their pinned host
//! copies, into a staging image (a device buffer of `n_expert - n_slots`
//! entries: room for every expert that can be missing) and read there
//! through a second table, `stage_of`. The grouped GEMMs run once over the
//! tiles of resident experts and once over the staged ones: the same
//! kernel and tiles as full residency, only the weights' addresses differ,
//! so the output is the same bit for bit.
//!
//! Two images alternate between MoE layers so the upload of layer L+1's
//! experts (those pre-gating predicts: layer L+1's router on layer L's
//! input, the decode's predictor) runs on a copy stream beside layer L's
//! compute; whatever the real routing of L+1 adds is uploaded when it is
//! known, before L+1's GEMMs.

use crate::error::{ensure, Result};
use crate::expert_cache::SLOT_NONE;

/// `stage_of` value of an expert not in the staging image.
pub const NOT_STAGED: u32 = u32::MAX;

/// Entries a staging image needs: every expert that can be missing from a
/// layer of `n_slots` slots.
pub fn staging_entries(n_expert: usize, n_slots: usize) -> usize {
    n_expert.saturating_sub(n_slots)
}

/// Which experts of `0..n_expert` the (token, choice) list `experts` names.
pub fn distinct(experts: &[u32], n_expert: usize) -> Result<Vec<bool>> {
    let mut want = vec![false; n_expert];
    for &e in experts {
        ensure!(
            (e as usize) < n_expert,
            "router chose expert {e} of {n_expert}"
        );
        want[e as usize] = true;
    }
    Ok(want)
}

/// Whether a chunk of `n` tokens routing `k` experts each over
/// `n_expert` likely touches nearly every expert of a layer, so that
/// uploading all of its non-resident experts ahead (before its routing is
/// known, where no pre-gating predicts it) wastes little: from
/// `n * k >= 4 * n_expert` on, a uniform router misses an expert with
/// probability below e^-4 (1.8%).
pub fn upload_all_ahead(n: usize, k: usize, n_expert: usize) -> bool {
    n * k >= 4 * n_expert
}

/// Which expert sits in which entry of one staging image, for one MoE
/// layer (the image's owner) at a time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageTable {
    /// Per expert its entry, or [`NOT_STAGED`].
    pub stage_of: Vec<u32>,
    /// Entries given out.
    pub n: usize,
    /// Entries the image holds.
    pub cap: usize,
    /// The MoE layer whose experts the image holds (None: nobody's).
    pub owner: Option<usize>,
}

impl StageTable {
    pub fn new(n_expert: usize, cap: usize) -> Self {
        Self {
            stage_of: vec![NOT_STAGED; n_expert],
            n: 0,
            cap,
            owner: None,
        }
    }

    /// Empty the image for MoE layer `layer` (a layer of `n_expert`
    /// experts, at most the table's).
    pub fn reset(&mut self, layer: usize, n_expert: usize) -> Result<()> {
        ensure!(
            n_expert <= self.stage_of.len(),
            "staging table of {} experts for a layer of {n_expert}",
            self.stage_of.len()
        );
        self.stage_of.truncate(0);
        self.stage_of.resize(n_expert, NOT_STAGED);
        self.n = 0;
        self.owner = Some(layer);
        Ok(())
    }

    /// Give entries, in expert order, to the experts `want`ed that are
    /// neither resident (`slot_of[e] != SLOT_NONE`) nor staged already;
    /// returns them as (expert, entry): what to upload.
    pub fn add(&mut self, want: &[bool], slot_of: &[u32]) -> Result<Vec<(u32, u32)>> {
        ensure!(
            want.len() == self.stage_of.len() && slot_of.len() == want.len(),
            "staging: {} wanted, {} slot entries, table of {}",
            want.len(),
            slot_of.len(),
            self.stage_of.len()
        );
        let mut up = Vec::new();
        for (e, &w) in want.iter().enumerate() {
            if !w || slot_of[e] != SLOT_NONE || self.stage_of[e] != NOT_STAGED {
                continue;
            }
            ensure!(
                self.n < self.cap,
                "staging image of {} entries is full (expert {e})",
                self.cap
            );
            self.stage_of[e] = self.n as u32;
            up.push((e as u32, self.n as u32));
            self.n += 1;
        }
        Ok(up)
    }
}

/// Runs of consecutive experts in consecutive entries, as (first expert,
/// first entry, length): one copy each per projection (the host copies
/// and the image both lay expert after expert at the projection's
/// stride). `list` in the order [`StageTable::add`] gives.
pub fn runs(list: &[(u32, u32)]) -> Vec<(u32, u32, u32)> {
    let mut out: Vec<(u32, u32, u32)> = Vec::new();
    for &(e, i) in list {
        match out.last_mut() {
            Some(r) if r.0 + r.2 == e && r.1 + r.2 == i => r.2 += 1,
            _ => out.push((e, i, 1)),
        }
    }
    out
}

/// A chunk's tile list (`(expert, p0, p1)` triples) split by where each
/// tile's expert is read: (tiles of resident experts, tiles of staged
/// ones), each in the original order; the largest slot and the largest
/// staging entry the two name (for the GEMMs' bounds checks). Every
/// expert must be in one of the two places.
pub fn split_tiles(tiles: &[i32], slot_of: &[u32], stage_of: &[u32]) -> Result<SplitTiles> {
    ensure!(tiles.len().is_multiple_of(3), "tile list of triples");
    let mut s = SplitTiles::default();
    for t in tiles.chunks_exact(3) {
        let e = t[0] as usize;
        ensure!(
            t[0] >= 0 && e < slot_of.len() && e < stage_of.len(),
            "tile of expert {}",
            t[0]
        );
        if slot_of[e] != SLOT_NONE {
            s.resident.extend_from_slice(t);
            s.max_slot = s.max_slot.max(slot_of[e] as usize);
        } else {
            ensure!(
                stage_of[e] != NOT_STAGED,
                "expert {e} is neither in a slot nor staged"
            );
            s.staged.extend_from_slice(t);
            s.max_entry = s.max_entry.max(stage_of[e] as usize);
        }
    }
    Ok(s)
}

/// See [`split_tiles`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SplitTiles {
    pub resident: Vec<i32>,
    pub staged: Vec<i32>,
    pub max_slot: usize,
    pub max_entry: usize,
}

/// The prefill chunk under a bounded cache: the largest of `want`, `want
/// / 2`, `want / 4`, ... (at least `min`) whose scratch (`bytes(cap)`)
/// fits in `allowance`; None when not even `min` tokens fit (prompts then
/// run token by token). Why halving from the requested size rather than
/// a fixed 512: every chunk streams about a whole layer's non-resident
/// experts per MoE layer over PCIe whatever its length (2048 tokens x
/// top-10 touch nearly all 512 experts, 512 tokens most of them), so the
/// PCIe bytes per prompt token fall as 1 / chunk, and the largest chunk
/// the memory plan set aside room for is the fastest.
pub fn fit_chunk(
    want: usize,
    min: usize,
    allowance: u64,
    bytes: impl Fn(usize) -> u64,
) -> Option<usize> {
    // A requested chunk below `min` is taken as it is (a small --ubatch
    // is a choice); `min` bounds only the halving.
    let floor = min.min(want).max(1);
    let mut c = want;
    while c >= floor {
        if bytes(c) <= allowance {
            return Some(c);
        }
        c /= 2;
    }
    None
}

/// An estimate of the batched prefill's scratch per chunk token for the
/// memory plan, from shapes the model file gives before anything is
/// built: hidden size `d`, `k` experts a token of `ff` rows each, and
/// `layer_rows`, the most rows of one layer's 2-D weights together (a
/// bound on every stacked projection's output width, the attention and
/// DeltaNet widths and the shared expert's). The f32 rows of the chunk
/// (residual, norm, mixer and FFN output), five layer-wide rows
/// (projections, q, o, conv, raw), the routed pairs' gate, up and down
/// rows, the f16 copies, routing and tile words. The decoder fits its
/// chunk to the exact sizes within what the plan set aside, so an estimate
/// off by some percent moves the chunk size, never the budget.
pub fn scratch_per_token(d: u64, k: u64, ff: u64, layer_rows: u64) -> u64 {
    let floats = 4 * d + 5 * layer_rows + k * (2 * ff + d) + 2 * k;
    let halves = d + layer_rows.max(k * ff);
    let words = 4 * k + 3 * k + 6;
    4 * floats + 2 * halves + 4 * words
}

/// Host-side count of what batched prefills uploaded under a bounded
/// cache: per (chunk, MoE layer), the distinct experts read from cache
/// slots (`resident`) and those copied over PCIe into the staging image
/// (`uploaded`, of which `ahead` before the layer's routing was known,
/// pre-gated or all-ahead, and `ahead_used` of those then routed to), and
/// the bytes those copies moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefillUploads {
    pub resident: u64,
    pub uploaded: u64,
    pub ahead: u64,
    pub ahead_used: u64,
    pub bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    const N: u32 = SLOT_NONE;

    #[test]
    fn staging_gives_entries_to_missing_experts_once_in_expert_order() {
        // 8 experts; 1, 4 and 6 resident.
        let slot_of = [N, 0, N, N, 2, N, 1, N];
        let mut t = StageTable::new(8, staging_entries(8, 3));
        assert_eq!(t.cap, 5);
        t.reset(7, 8).unwrap();
        let want = distinct(&[3, 1, 0, 4, 3, 7], 8).unwrap();
        assert_eq!(
            t.add(&want, &slot_of).unwrap(),
            vec![(0, 0), (3, 1), (7, 2)]
        );
        // Again with more: only the new ones, after the old entries.
        let want = distinct(&[2, 3, 5, 6], 8).unwrap();
        assert_eq!(t.add(&want, &slot_of).unwrap(), vec![(2, 3), (5, 4)]);
        assert_eq!(t.stage_of, vec![0, N, 3, 1, N, 4, N, 2]);
        assert_eq!((t.n, t.owner), (5, Some(7)));
        // Full: every missing expert has an entry, nothing more fits.
        let mut small = StageTable::new(8, 1);
        small.reset(0, 8).unwrap();
        assert!(small.add(&distinct(&[0, 2], 8).unwrap(), &slot_of).is_err());
        // A new owner starts empty; a layer wider than the table is refused.
        t.reset(8, 8).unwrap();
        assert_eq!((t.n, t.stage_of[0]), (0, NOT_STAGED));
        assert!(t.reset(9, 9).is_err());
        assert!(distinct(&[8], 8).is_err());
    }

    #[test]
    fn uploads_coalesce_into_runs() {
        let list = [(0, 0), (1, 1), (2, 2), (5, 3), (6, 4), (9, 5)];
        assert_eq!(runs(&list), vec![(0, 0, 3), (5, 3, 2), (9, 5, 1)]);
        // An expert after a gap in entries (a second add) breaks the run.
        assert_eq!(runs(&[(3, 0), (4, 2)]), vec![(3, 0, 1), (4, 2, 1)]);
        assert!(runs(&[]).is_empty());
    }

    #[test]
    fn tiles_split_by_where_the_expert_is_read() {
        let slot_of = [N, 3, N, 0];
        let stage_of = [1, NOT_STAGED, 0, NOT_STAGED];
        let tiles = [0, 0, 5, 1, 5, 69, 1, 69, 70, 2, 70, 72, 3, 72, 80];
        let s = split_tiles(&tiles, &slot_of, &stage_of).unwrap();
        assert_eq!(s.resident, vec![1, 5, 69, 1, 69, 70, 3, 72, 80]);
        assert_eq!(s.staged, vec![0, 0, 5, 2, 70, 72]);
        assert_eq!((s.max_slot, s.max_entry), (3, 1));
        // Every pair row in exactly one of the two lists.
        let mut rows: Vec<i32> = s
            .resident
            .chunks(3)
            .chain(s.staged.chunks(3))
            .flat_map(|t| t[1]..t[2])
            .collect();
        rows.sort();
        assert_eq!(rows, (0..80).collect::<Vec<_>>());
        // An expert in neither place is an error, not a wild read.
        let lost = [NOT_STAGED; 4];
        assert!(split_tiles(&tiles, &slot_of, &lost).is_err());
        assert!(split_tiles(&[9, 0, 1], &slot_of, &stage_of).is_err());
    }

    #[test]
    fn chunk_fits_by_halving() {
        // 1 KiB a token + 1 MiB fixed; 1.5 MiB allowed: 512 tokens.
        let bytes = |c: usize| (1 << 20) + 1024 * c as u64;
        assert_eq!(fit_chunk(2048, 8, 3 << 19, bytes), Some(512));
        assert_eq!(fit_chunk(2048, 8, 4 << 20, bytes), Some(2048));
        assert_eq!(fit_chunk(2048, 8, 1 << 20, bytes), None);
        assert_eq!(fit_chunk(0, 8, u64::MAX, bytes), None);
        // A requested chunk under the minimum is taken when it fits (the
        // parity table's 5-token chunks), never halved below it.
        assert_eq!(fit_chunk(5, 8, u64::MAX, bytes), Some(5));
        assert_eq!(fit_chunk(5, 8, 1 << 10, bytes), None);
    }

    #[test]
    fn scratch_estimate_of_the_80b_shapes() {
        // Shapes of the kind of the 80B file (d 2048, top-10 of 512-row
        // experts, 14,400 rows of 2-D weights in a layer): about 0.43 MiB
        // a token, above the ~0.6 GiB for 2048 tokens docs/cuda.md gives
        // for the decoder's exact scratch.
        let b = scratch_per_token(2048, 10, 512, 14400);
        assert_eq!(
            b,
            4 * (8192 + 72000 + 30720 + 20) + 2 * (2048 + 14400) + 4 * 76
        );
        assert!(b * 2048 > 600 << 20);
    }

    #[test]
    fn all_ahead_only_when_nearly_every_expert_is_hit() {
        assert!(upload_all_ahead(2048, 10, 512));
        assert!(upload_all_ahead(205, 10, 512));
        assert!(!upload_all_ahead(204, 10, 512));
        assert!(!upload_all_ahead(8, 10, 512));
    }
}
