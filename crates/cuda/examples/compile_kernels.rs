//! Compile every kernel file with NVRTC (no GPU needed) and write the PTX
//! to the folder given as the first argument, and the variant with the
//! early PDL trigger (`REDLITE_PDL_TRIGGER=early`) to its `early/`;
//! `scripts/check-cuda-kernels.sh` then assembles the first with
//! `ptxas -arch=sm_90`. Needs libnvrtc on the
//! library path (the script points it at PyPI's nvidia-cuda-nvrtc-cu12).
use anyhow::{Context, Result};

fn main() -> Result<()> {
    let dir = std::path::PathBuf::from(
        std::env::args()
            .nth(1)
            .context("usage: compile_kernels OUT_DIR")?,
    );
    use redlite_cuda::kernels::{compile, PdlTrigger, FILES};
    for (trigger, dir) in [
        (PdlTrigger::Late, dir.clone()),
        (PdlTrigger::Early, dir.join("early")),
    ] {
        std::fs::create_dir_all(&dir)?;
        for f in FILES {
            let ptx = compile(f, trigger, &[])?;
            let out = dir.join(f.name.replace(".cu", ".ptx"));
            std::fs::write(&out, ptx.to_src())?;
            println!("{} ({trigger:?} PDL trigger) -> {}", f.name, out.display());
        }
    }
    Ok(())
}
