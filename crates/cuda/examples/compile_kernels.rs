//! Compile every kernel file with NVRTC (no GPU needed) and write the PTX
//! to the folder given as the first argument; `scripts/check-cuda-kernels.sh`
//! then assembles each with `ptxas -arch=sm_90`, and checks every kernel
//! entry of a PTX against the names the engine loads from that file
//! (written beside it as NAME.kernels, one a line). Needs libnvrtc on the
//! library path (the script points it at PyPI's nvidia-cuda-nvrtc-cu12).
use anyhow::{Context, Result};

fn main() -> Result<()> {
    let dir = std::path::PathBuf::from(
        std::env::args()
            .nth(1)
            .context("usage: compile_kernels OUT_DIR")?,
    );
    std::fs::create_dir_all(&dir)?;
    for f in redlite_cuda::kernels::FILES {
        let ptx = redlite_cuda::kernels::compile(f, &[])?;
        let out = dir.join(f.name.replace(".cu", ".ptx"));
        std::fs::write(&out, ptx.to_src())?;
        let mut names = f.kernels.join("\n");
        names.push('\n');
        std::fs::write(dir.join(f.name.replace(".cu", ".kernels")), names)?;
        println!("{} -> {}", f.name, out.display());
    }
    Ok(())
}
