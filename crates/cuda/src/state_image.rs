//! The CUDA sequence's state in the layout every backend shares
//! ([`redlite_model::StateImage`]): the host-side conversions between the
//! device buffers' layout and the CPU's.
//!
//! What differs and what does not, per layer:
//!
//! - KV rows: the device caches are `[ctx][n_kv][hd]` (`ops::KvCache`,
//!   `attn_prep.cu`), K after its norm and RoPE, as the CPU's `KvCache`
//!   keeps `pos × (n_kv · hd)`: the first `pos` rows are the image as
//!   they are (f16 as its bits).
//! - The recurrent state: `[n_v][dk][dv]`, `S[i][j]` with key index `i`
//!   and value index `j` (`deltanet.cu`, `deltanet_chunk.cu`), which is
//!   the CPU's layout (`redlite_cpu::deltanet`): copied as it is, no
//!   transposition.
//! - The conv window: the CPU keeps the last `K - 1` inputs oldest first
//!   (`(K-1) × conv_dim`, `redlite_cpu::conv`); the device keeps a ring of
//!   `K` slots, position `p` in slot `p % K` (this token's input goes to
//!   slot `pos % K`, which the step does not read). [`ring_to_window`] and
//!   [`window_to_ring`] convert; the channel order (q | k | v, value heads
//!   in order) is the projection's on both.

use crate::error::{ensure, Result};

/// Conv channels and kernel size of a ring of `ring_len` values holding
/// a window of `window_len` (`K × cd` against `(K - 1) × cd`).
fn ring_shape(ring_len: usize, window_len: usize) -> Result<(usize, usize)> {
    ensure!(
        ring_len > window_len,
        "a conv ring of {ring_len} values for a window of {window_len}"
    );
    let cd = ring_len - window_len;
    let k = ring_len / cd;
    ensure!(
        k >= 2 && k * cd == ring_len && (k - 1) * cd == window_len,
        "a conv ring of {ring_len} values does not hold a window of {window_len} ({cd} channels)"
    );
    Ok((cd, k))
}

/// The CPU's conv window (`(K - 1) × cd`, oldest first) at position `pos`
/// from the device ring (`K × cd`, position `p` in slot `p % K`). Rows of
/// positions before 0 are zero, as on the CPU (and as the batched prefill
/// reads them).
pub fn ring_to_window(ring: &[f32], window_len: usize, pos: usize) -> Result<Vec<f32>> {
    let (cd, k) = ring_shape(ring.len(), window_len)?;
    let mut window = vec![0f32; window_len];
    for (r, row) in window.chunks_exact_mut(cd).enumerate() {
        // Window row r holds position pos - (K - 1) + r.
        if let Some(q) = (pos + r + 1).checked_sub(k) {
            let slot = q % k;
            row.copy_from_slice(&ring[slot * cd..(slot + 1) * cd]);
        }
    }
    Ok(window)
}

/// The device ring (`K × cd`) of conv kernel `k` at position `pos` from
/// the CPU's window (`(K - 1) × cd`, oldest first): window row `r` goes to
/// the slot the decode step reads for it, `(pos + 1 + r) % K`; the slot of
/// `pos` itself (written by the next step before it is read) is zero.
pub fn window_to_ring(window: &[f32], k: usize, pos: usize) -> Result<Vec<f32>> {
    ensure!(k >= 2, "conv kernel {k}");
    ensure!(
        window.len().is_multiple_of(k - 1),
        "a conv window of {} values for kernel {k}",
        window.len()
    );
    let cd = window.len() / (k - 1);
    let mut ring = vec![0f32; k * cd];
    for (r, row) in window.chunks_exact(cd).enumerate() {
        let slot = (pos + 1 + r) % k;
        ring[slot * cd..(slot + 1) * cd].copy_from_slice(row);
    }
    Ok(ring)
}

#[cfg(test)]
mod tests {
    use super::*;
    use redlite_cpu::conv::conv1d_causal;

    fn inputs(n: usize, cd: usize) -> Vec<f32> {
        (0..n * cd)
            .map(|i| ((i * 7919 + 13) % 1000) as f32 / 1000.0 - 0.5)
            .collect()
    }

    /// The window the decode step (`deltanet.cu`, step 1) reads at `pos`:
    /// slots `(pos + 1 + r) % K`, oldest first.
    fn kernel_window(ring: &[f32], k: usize, cd: usize, pos: usize) -> Vec<f32> {
        let s0 = (pos + 1) % k;
        let mut w = Vec::with_capacity((k - 1) * cd);
        for r in 0..k - 1 {
            let slot = (s0 + r) % k;
            w.extend_from_slice(&ring[slot * cd..(slot + 1) * cd]);
        }
        w
    }

    /// The ring as the device steps leave it: input `p` in slot `p % K`
    /// (`deltanet.cu`'s store; `gdn_ring_chunk` writes the same slots).
    fn device_ring(x: &[f32], k: usize, cd: usize, upto: usize) -> Vec<f32> {
        let mut ring = vec![0f32; k * cd];
        for p in 0..upto {
            let slot = p % k;
            ring[slot * cd..(slot + 1) * cd].copy_from_slice(&x[p * cd..(p + 1) * cd]);
        }
        ring
    }

    /// Expected values: the CPU backend's own conv state after the same
    /// inputs (`redlite_cpu::conv::conv1d_causal`, the layout CPU state
    /// files hold), at every position from 0 past a few ring turns, for
    /// kernels 2, 4 (the models') and 5.
    #[test]
    fn the_ring_converts_to_the_cpu_conv_window_at_every_position() {
        for k in [2usize, 4, 5] {
            let cd = 6;
            let n = 3 * k + 2;
            let x = inputs(n, cd);
            let w: Vec<f32> = (0..cd * k).map(|i| 0.1 * i as f32).collect();
            let mut cpu = vec![0f32; (k - 1) * cd];
            for pos in 0..=n {
                let ring = device_ring(&x, k, cd, pos);
                let got = ring_to_window(&ring, cpu.len(), pos).unwrap();
                assert_eq!(got, cpu, "k {k} pos {pos}: ring to window");
                let back = window_to_ring(&cpu, k, pos).unwrap();
                assert_eq!(
                    kernel_window(&back, k, cd, pos),
                    cpu,
                    "k {k} pos {pos}: the decode step reads the CPU window"
                );
                assert_eq!(
                    ring_to_window(&back, cpu.len(), pos).unwrap(),
                    cpu,
                    "k {k} pos {pos}: round trip"
                );
                if pos < n {
                    let mut out = vec![0f32; cd];
                    conv1d_causal(&mut cpu, &w, k, &x[pos * cd..(pos + 1) * cd], &mut out).unwrap();
                }
            }
        }
    }

    /// A window imported into the ring and then stepped as the device does
    /// gives the CPU's window after the same step (the slot of `pos` is
    /// overwritten before it is read).
    #[test]
    fn an_imported_ring_continues_as_the_cpu_window_does() {
        let (k, cd) = (4usize, 5usize);
        let x = inputs(20, cd);
        let w: Vec<f32> = (0..cd * k).map(|i| 0.05 * i as f32).collect();
        let mut cpu = vec![0f32; (k - 1) * cd];
        let mut out = vec![0f32; 9 * cd];
        conv1d_causal(&mut cpu, &w, k, &x[..9 * cd], &mut out).unwrap();
        let mut ring = window_to_ring(&cpu, k, 9).unwrap();
        for p in 9..20 {
            let slot = p % k;
            ring[slot * cd..(slot + 1) * cd].copy_from_slice(&x[p * cd..(p + 1) * cd]);
            let mut o = vec![0f32; cd];
            conv1d_causal(&mut cpu, &w, k, &x[p * cd..(p + 1) * cd], &mut o).unwrap();
            assert_eq!(ring_to_window(&ring, cpu.len(), p + 1).unwrap(), cpu, "{p}");
        }
    }

    #[test]
    fn mismatched_ring_and_window_sizes_are_errors() {
        assert!(ring_to_window(&[0.0; 12], 12, 0).is_err());
        assert!(ring_to_window(&[0.0; 12], 7, 0).is_err());
        assert!(ring_to_window(&[0.0; 4], 0, 0).is_err());
        assert!(window_to_ring(&[0.0; 7], 4, 0).is_err());
        assert!(window_to_ring(&[0.0; 6], 1, 0).is_err());
    }
}
