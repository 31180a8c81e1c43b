//! The expert slot table: which device slot holds which expert.
//!
//! Routing, residency and compute stay apart: the router yields expert ids,
//! this table maps them to slots of an [`crate::gemv::ExpertStack`], and the
//! kernels see only slot indices. At full residency the table is the
//! identity; issue 8 bounds the slots and evicts (the table already keeps
//! both directions so that an eviction is O(1)).

use crate::error::{bail, Result};

#[derive(Clone, Debug)]
pub struct SlotTable {
    slot_of: Vec<Option<u32>>,
    expert_in: Vec<Option<u32>>,
}

impl SlotTable {
    /// `n_slots` empty slots for experts `0..n_experts`.
    pub fn new(n_experts: usize, n_slots: usize) -> Self {
        Self {
            slot_of: vec![None; n_experts],
            expert_in: vec![None; n_slots],
        }
    }

    /// Full residency: expert e in slot e.
    pub fn identity(n_experts: usize) -> Self {
        let mut t = Self::new(n_experts, n_experts);
        for e in 0..n_experts {
            t.assign(e, e).expect("fresh table");
        }
        t
    }

    pub fn n_slots(&self) -> usize {
        self.expert_in.len()
    }

    pub fn n_experts(&self) -> usize {
        self.slot_of.len()
    }

    pub fn slot(&self, expert: usize) -> Option<u32> {
        self.slot_of.get(expert).copied().flatten()
    }

    pub fn expert_in(&self, slot: usize) -> Option<u32> {
        self.expert_in.get(slot).copied().flatten()
    }

    /// Put `expert` into the free `slot`.
    pub fn assign(&mut self, expert: usize, slot: usize) -> Result<()> {
        if expert >= self.n_experts() || slot >= self.n_slots() {
            bail!("expert {expert} / slot {slot} out of range");
        }
        if let Some(e) = self.expert_in[slot] {
            bail!("slot {slot} holds expert {e}");
        }
        if let Some(s) = self.slot_of[expert] {
            bail!("expert {expert} is already in slot {s}");
        }
        self.slot_of[expert] = Some(slot as u32);
        self.expert_in[slot] = Some(expert as u32);
        Ok(())
    }

    /// Empty `slot`, returning the expert it held.
    pub fn evict(&mut self, slot: usize) -> Option<u32> {
        let e = self.expert_in.get_mut(slot)?.take()?;
        self.slot_of[e as usize] = None;
        Some(e)
    }

    /// The slots of the routed `experts`, in order; an error names the first
    /// one that is not resident.
    pub fn map(&self, experts: &[u32]) -> Result<Vec<u32>> {
        experts
            .iter()
            .map(|&e| match self.slot(e as usize) {
                Some(s) => Ok(s),
                None => bail!("expert {e} is not resident"),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_assign_evict_map() {
        let t = SlotTable::identity(8);
        assert_eq!(t.map(&[7, 0, 3]).unwrap(), vec![7, 0, 3]);

        let mut t = SlotTable::new(512, 4);
        t.assign(100, 2).unwrap();
        t.assign(7, 0).unwrap();
        assert!(t.assign(8, 2).is_err(), "slot taken");
        assert!(t.assign(100, 1).is_err(), "expert already resident");
        assert!(t.assign(600, 1).is_err(), "expert out of range");
        assert_eq!(t.map(&[7, 100]).unwrap(), vec![0, 2]);
        assert!(t.map(&[7, 5]).is_err());
        assert_eq!(t.evict(2), Some(100));
        assert_eq!(t.evict(2), None);
        assert_eq!(t.slot(100), None);
        t.assign(5, 2).unwrap();
        assert_eq!(t.expert_in(2), Some(5));
    }
}
