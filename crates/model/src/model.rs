//! The loaded model: the file, the architecture, the thread pool and the
//! path switch.

use crate::arch::qwen3next_mtp::MtpHead;
use crate::arch::Arch;
use crate::exec::Exec;
use crate::session::Session;
use crate::ModelError;
use redlite_cpu::Pool;
use redlite_expertcache::plan::{
    plan, ExpertResidency, Plan, PlanError, PlanInput, DEFAULT_RESERVE,
};
use redlite_expertcache::residency::{advise, Advice};
use redlite_expertcache::{CacheConfig, ExpertCache, ExpertLayout, FileLoader, PolicyKind};
use redlite_gguf::GgufFile;
use std::collections::HashSet;
use std::sync::Arc;

/// How to load and run.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Worker threads (0: one per CPU).
    pub threads: usize,
    /// Force the reference path (also forced by the process's
    /// [`redlite_quant::ReferenceMode`], `REDLITE_REFERENCE=1`; `=f32` keeps
    /// f32 activations in its matmuls, see `exec`).
    pub reference: bool,
    /// Tokens per forward batch when a prompt is longer.
    pub ubatch: usize,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            threads: 0,
            reference: false,
            ubatch: 512,
        }
    }
}

/// A bounded expert cache for [`Model::set_expert_cache`].
#[derive(Clone, Copy, Debug)]
pub struct ExpertCacheOptions {
    /// Slots (each holds one expert of any layer).
    pub slots: usize,
    pub policy: PolicyKind,
    /// Threads reading misses and prefetches in parallel.
    pub io_threads: usize,
    /// Pre-gating: experts of the next MoE layer to prefetch per decode
    /// step (0: off).
    pub pregate: usize,
}

impl Default for ExpertCacheOptions {
    fn default() -> Self {
        ExpertCacheOptions {
            slots: 0,
            policy: PolicyKind::Lru,
            io_threads: 8,
            pregate: 0,
        }
    }
}

/// What a run asks of memory: the budgets, the context, and how to run a
/// cache if the plan makes one.
#[derive(Clone, Copy, Debug, Default)]
pub struct MemoryRequest {
    /// `--memory`: the whole run's budget (default: what is available).
    pub memory: Option<u64>,
    /// `--expert-cache`: the cache's size (default: what the budget leaves
    /// when the model does not fit).
    pub expert_cache: Option<u64>,
    /// Memory available to this process (MemAvailable / cgroup limit).
    pub available: Option<u64>,
    /// Context positions of one session.
    pub ctx: usize,
    /// Sessions' worth of state held at once (the server's prompt-cache
    /// checkpoints add to one); at least 1.
    pub sessions: usize,
    /// Cache settings (`slots` is ignored: the plan sets it); `pregate`
    /// `usize::MAX` means "the model's experts per token".
    pub cache: ExpertCacheOptions,
    /// Attention layers of a draft head whose KV each session keeps
    /// beside the model's own, at the same context (1 when the MTP head
    /// drafts: `--spec mtp`, or a server that keeps it in step).
    pub draft_kv_layers: usize,
}

/// A model ready to run.
#[derive(Debug)]
pub struct Model {
    file: Arc<GgufFile>,
    arch: Arch,
    pool: Pool,
    reference: bool,
    ubatch: usize,
    experts: Option<ExpertCache>,
    pregate: usize,
}

impl Model {
    /// Read the config from metadata, check every tensor against its spec.
    pub fn load(file: Arc<GgufFile>, opts: LoadOptions) -> Result<Model, ModelError> {
        let arch = Arch::load(&file)?;
        Ok(Model {
            arch,
            pool: Pool::new(opts.threads),
            // The process's mode (the binary sets it from REDLITE_REFERENCE).
            reference: opts.reference || redlite_quant::reference_mode().is_on(),
            ubatch: opts.ubatch.max(1),
            file,
            experts: None,
            pregate: 0,
        })
    }

    /// Where the routed experts lie in the file.
    pub fn expert_layout(&self) -> Result<ExpertLayout, ModelError> {
        self.arch.expert_layout()
    }

    /// Experts a token uses per MoE layer (0: a dense model).
    pub fn n_expert_used(&self) -> usize {
        self.arch.n_expert_used()
    }

    /// (dense bytes, routed expert bytes) of the file's tensors.
    pub fn weight_split(&self) -> Result<(u64, u64), ModelError> {
        weight_split(&self.file, &self.arch)
    }

    /// Serve routed experts from a bounded cache of `opts.slots` slots,
    /// read from the file on misses, instead of from the mapped file.
    /// Results are the same bit for bit; only residency changes. The
    /// experts' part of the mapping gets `MADV_RANDOM`: nothing should
    /// fault there any more, and if something does it reads one page, not
    /// a read-ahead window.
    pub fn set_expert_cache(&mut self, opts: ExpertCacheOptions) -> Result<(), ModelError> {
        let layout = Arc::new(self.expert_layout()?);
        let path = self.file.path().ok_or(ModelError::NoFilePath)?;
        let loader = FileLoader::open(path, layout.clone(), true)?;
        let cache = ExpertCache::new(
            CacheConfig {
                slots: opts.slots,
                slot_bytes: layout.slot_bytes() as usize,
                policy: opts.policy,
                io_threads: opts.io_threads,
            },
            Arc::new(loader),
        )?;
        let bytes = self.file.bytes();
        for r in layout.file_ranges() {
            if let Err(e) = advise(bytes, r.start as usize..r.end as usize, Advice::Random) {
                tracing::debug!("madvise(RANDOM) on expert bytes: {e}");
            }
        }
        self.experts = Some(cache);
        self.pregate = opts.pregate;
        Ok(())
    }

    /// Plan what is resident for `req` and install the expert cache when
    /// the plan has one. Reads no weights: a refusal comes before loading.
    pub fn plan_memory(&mut self, req: &MemoryRequest) -> Result<Plan, ModelError> {
        let p = plan_for(&self.file, &self.arch, req)?;
        if let ExpertResidency::Cached { slots } = p.experts {
            let mut opts = req.cache;
            opts.slots = slots as usize;
            if opts.pregate == usize::MAX {
                opts.pregate = self.n_expert_used();
            }
            self.set_expert_cache(opts)?;
        }
        Ok(p)
    }

    /// The plan `plan_memory` would make for `req`, without installing
    /// anything (to compare contexts before choosing one).
    pub fn preview_plan(&self, req: &MemoryRequest) -> Result<Plan, ModelError> {
        plan_for(&self.file, &self.arch, req)
    }

    /// The bounded expert cache, when there is one.
    pub fn expert_cache(&self) -> Option<&ExpertCache> {
        self.experts.as_ref()
    }

    /// Experts prefetched per next MoE layer (0: off).
    pub fn pregate(&self) -> usize {
        self.pregate
    }

    /// Change pre-gating (experts prefetched per next MoE layer; 0: off).
    pub fn set_pregate(&mut self, k: usize) {
        self.pregate = k;
    }

    pub fn arch(&self) -> &Arch {
        &self.arch
    }

    /// The first NextN (MTP) head, when the file has one (a Qwen3-Next
    /// converted without `--no-mtp`); see [`MtpHead::forward`].
    pub fn mtp(&self) -> Option<&MtpHead> {
        self.mtp_heads().first()
    }

    /// Bytes of the NextN (MTP) blocks' tensors (`blk.{b}.*` of each
    /// head; 0 without). [`Model::weight_split`] counts them as dense bytes
    /// (on the CPU the head reads them from the mapped file when it runs);
    /// a backend that runs only the trunk subtracts them.
    pub fn mtp_bytes(&self) -> u64 {
        let prefixes: Vec<String> = self
            .mtp_heads()
            .iter()
            .map(|h| format!("blk.{}.", h.block))
            .collect();
        self.file
            .tensors()
            .iter()
            .filter(|t| prefixes.iter().any(|p| t.name.starts_with(p.as_str())))
            .map(|t| t.n_bytes)
            .sum()
    }

    /// Every NextN (MTP) head of the file, in block order.
    pub fn mtp_heads(&self) -> &[MtpHead] {
        match &self.arch {
            Arch::Qwen3Next(q) => &q.mtp,
            Arch::Qwen2(_) => &[],
        }
    }

    /// Bytes one session holds: (f32 K and V per position over all
    /// attention layers, fixed recurrent state over all DeltaNet layers).
    /// Callers multiply the first by the context length to size a session.
    pub fn state_bytes(&self) -> (u64, u64) {
        state_bytes(&self.arch)
    }

    /// The state of `sessions` sessions of `ctx` positions, in bytes; an
    /// error naming the context size when that does not fit 64 bits.
    pub fn session_state_bytes(&self, ctx: usize, sessions: usize) -> Result<u64, ModelError> {
        session_state_bytes(&self.arch, ctx, sessions, 0)
    }

    /// The KV bytes a position of one draft attention layer holds (f32
    /// K and V rows of the model's attention shape: the MTP head's).
    pub fn draft_kv_bytes_per_position(&self) -> u64 {
        draft_kv_per_position(&self.arch)
    }

    /// Touch every page of the mapped weights so the first token is not
    /// timed on page faults (with an expert cache: the dense weights only,
    /// asked for with `MADV_WILLNEED` first, so they are read in large
    /// requests). `progress` gets the bytes covered so far and the total,
    /// about once per MiB.
    pub fn touch_weights(&self, mut progress: impl FnMut(u64, u64)) {
        let skip: HashSet<String> = match (&self.experts, self.expert_layout()) {
            (Some(_), Ok(layout)) => layout
                .layers
                .iter()
                .flatten()
                .flat_map(|l| l.parts.iter().map(|p| p.tensor.clone()))
                .collect(),
            _ => HashSet::new(),
        };
        let tensors: Vec<_> = self
            .file
            .tensors()
            .iter()
            .filter(|t| !skip.contains(&t.name))
            .collect();
        let total: u64 = tensors.iter().map(|t| t.n_bytes).sum();
        if self.experts.is_some() {
            let base = self.file.bytes().as_ptr() as usize;
            for t in &tensors {
                if let Ok(v) = self.file.tensor(&t.name) {
                    let start = v.data.as_ptr() as usize - base;
                    let _ = advise(
                        self.file.bytes(),
                        start..start + v.data.len(),
                        Advice::WillNeed,
                    );
                }
            }
        }
        let (mut done, mut sink) = (0u64, 0u8);
        for t in tensors {
            if let Ok(v) = self.file.tensor(&t.name) {
                for chunk in v.data.chunks(1 << 20) {
                    for page in chunk.iter().step_by(4096) {
                        sink = sink.wrapping_add(*page);
                    }
                    done += chunk.len() as u64;
                    progress(done, total);
                }
            }
        }
        std::hint::black_box(sink);
    }

    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    pub fn n_vocab(&self) -> usize {
        self.arch.n_vocab()
    }

    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    /// Whether this model runs the float reference path.
    pub fn is_reference(&self) -> bool {
        self.reference
    }

    /// Switch between the reference and the fast path.
    pub fn set_reference(&mut self, on: bool) {
        self.reference = on;
    }

    pub fn ubatch(&self) -> usize {
        self.ubatch
    }

    pub fn set_ubatch(&mut self, n: usize) {
        self.ubatch = n.max(1);
    }

    /// A session with room for `ctx_len` positions (0: the model's trained context).
    pub fn new_session(&self, ctx_len: usize) -> Session {
        let ctx = if ctx_len == 0 {
            self.arch.context_length()
        } else {
            ctx_len
        };
        Session::new(self.arch.new_states(), ctx)
    }

    /// The worker pool the kernels run on.
    pub(crate) fn pool(&self) -> &redlite_cpu::Pool {
        &self.pool
    }

    pub(crate) fn exec(&self) -> Exec<'_> {
        Exec {
            file: &self.file,
            pool: &self.pool,
            reference: self.reference,
            experts: self.experts.as_ref(),
            pregate: self.pregate,
            batching: Default::default(),
        }
    }
}

/// (dense bytes, routed expert bytes) of the file's tensors.
pub(crate) fn weight_split(file: &GgufFile, arch: &Arch) -> Result<(u64, u64), ModelError> {
    // The parser checked that every tensor lies inside the file without
    // overlap, so these sums are at most the file's size.
    let total: u64 = file.tensors().iter().map(|t| t.n_bytes).sum();
    let experts = arch.expert_layout()?.total_bytes();
    Ok((total.saturating_sub(experts), experts))
}

/// See [`Model::state_bytes`].
pub(crate) fn state_bytes(arch: &Arch) -> (u64, u64) {
    // From the checked config: every factor is capped (arch::limits), so
    // these products cannot overflow.
    let (n_kv, head_dim) = arch.kv_dims();
    let (mut per_position, mut fixed) = (0u64, 0u64);
    for state in arch.new_states() {
        match state {
            crate::LayerState::Kv(_) => per_position += (n_kv * head_dim * 2 * 4) as u64,
            crate::LayerState::Recurrent(r) => fixed += (r.conv.len() + r.ssm.len()) as u64 * 4,
        }
    }
    (per_position, fixed)
}

fn draft_kv_per_position(arch: &Arch) -> u64 {
    let (n_kv, head_dim) = arch.kv_dims();
    (n_kv * head_dim * 2 * 4) as u64
}

/// See [`Model::session_state_bytes`]; `draft_kv_layers` as in
/// [`MemoryRequest`].
pub(crate) fn session_state_bytes(
    arch: &Arch,
    ctx: usize,
    sessions: usize,
    draft_kv_layers: usize,
) -> Result<u64, ModelError> {
    let (per_position, fixed) = state_bytes(arch);
    // draft_kv_layers is 0 or 1 from the front ends; the product is
    // checked anyway, as every factor here.
    let per_position = (draft_kv_layers as u64)
        .checked_mul(draft_kv_per_position(arch))
        .and_then(|d| d.checked_add(per_position))
        .ok_or(ModelError::Plan(PlanError::StateOverflow {
            ctx: ctx as u64,
            sessions: sessions.max(1) as u64,
        }))?;
    (ctx as u64)
        .checked_mul(per_position)
        .and_then(|b| b.checked_add(fixed))
        .and_then(|b| b.checked_mul(sessions.max(1) as u64))
        .ok_or(ModelError::Plan(PlanError::StateOverflow {
            ctx: ctx as u64,
            sessions: sessions.max(1) as u64,
        }))
}

/// The memory plan for `req` (no cache installed).
pub(crate) fn plan_for(
    file: &GgufFile,
    arch: &Arch,
    req: &MemoryRequest,
) -> Result<Plan, ModelError> {
    let layout = arch.expert_layout()?;
    let (dense, experts) = weight_split(file, arch)?;
    Ok(plan(PlanInput {
        dense_bytes: dense,
        expert_bytes: experts,
        n_experts: layout.n_experts(),
        slot_bytes: layout.slot_bytes(),
        n_used: arch.n_expert_used() as u64,
        state_bytes: session_state_bytes(arch, req.ctx, req.sessions, req.draft_kv_layers)?,
        ctx: req.ctx as u64,
        available: req.available,
        memory: req.memory,
        expert_cache: req.expert_cache,
        reserve: DEFAULT_RESERVE,
    })?)
}
