//! A binary trace whose positions stay encoded until they are read: the records' framing,
//! checksums, fields, counts and score-part lengths are checked as the trace is read; each
//! record's positions are decoded (and checked) into a caller's buffer when asked. A replay then
//! holds the trace at about a byte per position instead of four, and reads each selection while
//! it is still in cache.

use rayon::prelude::*;

pub use super::binary::head::EncodedRecord;
use super::{TraceHeader, TraceRecord};
use crate::error::{PolicyError, Result};

/// A binary trace read without scores, its positions still encoded. Made by
/// [`read_trace_file_encoded`](super::read_trace_file_encoded).
#[derive(Clone, Debug)]
pub struct EncodedTrace {
    pub(in crate::trace) header: TraceHeader,
    /// The header as the trace stores it (its scores' flags as written).
    pub(in crate::trace) stored: TraceHeader,
    pub(in crate::trace) bytes: Vec<u8>,
    pub(in crate::trace) records: Vec<EncodedRecord>,
}

impl EncodedTrace {
    /// The header (without scores: they were not read).
    pub fn header(&self) -> &TraceHeader {
        &self.header
    }

    /// The header as the trace stores it: whether it holds scores and near-cut candidates
    /// (which were not read).
    pub fn stored_header(&self) -> &TraceHeader {
        &self.stored
    }

    /// The records, in file order.
    pub fn records(&self) -> &[EncodedRecord] {
        &self.records
    }

    /// The positions of record `i` into `out` (cleared first), decoded and checked as the
    /// trace's reader checks them: strictly ascending, as many as the record says, ending where
    /// it says, each below its `seq_len`. On an error `out` holds no meaningful positions.
    pub fn positions_into(&self, i: usize, out: &mut Vec<u32>) -> Result<()> {
        let r = self.records.get(i).ok_or_else(|| PolicyError::Invalid {
            field: "record",
            value: i.to_string(),
            reason: format!("the trace has {} records", self.records.len()),
        })?;
        super::binary::positions_of(&self.bytes, r, out)
    }

    /// [`positions_into`](Self::positions_into) of `r`, one of this trace's records.
    pub(crate) fn positions_of(&self, r: &EncodedRecord, out: &mut Vec<u32>) -> Result<()> {
        super::binary::positions_of(&self.bytes, r, out)
    }

    /// Record `i` decoded (without scores).
    pub fn record(&self, i: usize) -> Result<TraceRecord> {
        let mut selected = Vec::new();
        self.positions_into(i, &mut selected)?;
        // `positions_into` found record i.
        let r = &self.records[i];
        Ok(TraceRecord {
            step: r.step,
            request: r.request,
            layer: r.layer,
            seq_len: r.seq_len,
            selected,
            scores: None,
            near: None,
        })
    }

    /// Checks every record's positions as [`positions_into`](Self::positions_into) does,
    /// keeping none (on every core); the error is the first in file order.
    pub fn check_positions(&self) -> Result<()> {
        let errors: Vec<Option<PolicyError>> = (0..self.records.len())
            .into_par_iter()
            .map_init(Vec::new, |scratch, i| self.positions_into(i, scratch).err())
            .collect();
        errors.into_iter().flatten().next().map_or(Ok(()), Err)
    }

    /// Every record decoded, on every core; the error is the first in file order.
    pub fn decode(&self) -> Result<(TraceHeader, Vec<TraceRecord>)> {
        let records = (0..self.records.len()).into_par_iter().map(|i| self.record(i)).collect::<Result<Vec<_>>>()?;
        Ok((self.header.clone(), records))
    }
}

/// What the simulator reads of a record besides its positions: a decoded [`TraceRecord`] or an
/// [`EncodedRecord`].
pub trait RecordHead: Sync {
    /// The request's decode step.
    fn step(&self) -> u32;
    /// Request id.
    fn request(&self) -> u64;
    /// Layer.
    fn layer(&self) -> u32;
    /// Tokens in the sequence.
    fn seq_len(&self) -> u32;
    /// Positions selected.
    fn count(&self) -> usize;
    /// Checks the record against `header` before a replay: a decoded record whole
    /// ([`TraceRecord::check`]); an encoded one was checked as it was read, and its positions
    /// are checked as they are decoded.
    fn validate(&self, header: &TraceHeader) -> Result<()>;
}

/// The getters of the fields both record forms hold under the same names.
macro_rules! shared_fields {
    () => {
        fn step(&self) -> u32 {
            self.step
        }
        fn request(&self) -> u64 {
            self.request
        }
        fn layer(&self) -> u32 {
            self.layer
        }
        fn seq_len(&self) -> u32 {
            self.seq_len
        }
    };
}

impl RecordHead for TraceRecord {
    shared_fields!();
    fn count(&self) -> usize {
        self.selected.len()
    }
    fn validate(&self, header: &TraceHeader) -> Result<()> {
        self.check(header, 0)
    }
}

impl RecordHead for EncodedRecord {
    shared_fields!();
    fn count(&self) -> usize {
        self.count as usize
    }
    fn validate(&self, _header: &TraceHeader) -> Result<()> {
        Ok(())
    }
}
