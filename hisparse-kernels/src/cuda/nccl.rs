//! `NcclRank`: one GPU's side of a group's [`Collectives`] through NCCL (cudarc's `nccl`), on the
//! rank's own stream so that the exchange is ordered with (and capturable beside) its kernels.
//! The group is one process with a thread per GPU: one thread makes the [`NcclId`], every rank's
//! thread joins with it ([`NcclRank::join`] blocks until all have).
//!
//! Invariant: the ranks of a group agree on every call's lengths (they come from one plan, as
//! the [`Collectives`] contract says); each rank checks its own buffers against them before
//! NCCL is called, so no call reads or writes outside its buffers.

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use cudarc::nccl::{Comm, Id, ReduceOp};
use half::bf16;
use hisparse_memory::cuda::CudaMemory;

use super::device::CudaDevice;
use super::libs::nccl_available;
use crate::collectives::{Collectives, NcclId};
use crate::error::{KernelError, Result, check_len};

/// `len` elements from each of `ranks` ranks.
fn times_ranks(len: usize, ranks: usize) -> Result<usize> {
    len.checked_mul(ranks).ok_or_else(|| KernelError::invalid("len", len, format!("times {ranks} ranks overflows")))
}

fn nccl_error(context: &'static str) -> impl FnOnce(cudarc::nccl::result::NcclError) -> KernelError {
    move |e| KernelError::Cuda { context: context.to_owned(), message: format!("{e:?}") }
}

fn require_nccl() -> Result<()> {
    if nccl_available() {
        Ok(())
    } else {
        Err(KernelError::CudaUnavailable { reason: "the NCCL library (libnccl.so.2) cannot be loaded".into() })
    }
}

impl NcclId {
    /// A fresh identity (needs NCCL).
    pub fn new() -> Result<Self> {
        require_nccl()?;
        let id = Id::new().map_err(nccl_error("ncclGetUniqueId"))?;
        Ok(Self(*id.internal()))
    }
}

/// One GPU's rank of a group.
pub struct NcclRank {
    comm: Comm,
    dev: Arc<CudaDevice>,
}

impl NcclRank {
    /// Joins the group `id` as `rank` of `ranks` on `dev`'s stream; returns once every rank has
    /// joined.
    pub fn join(dev: &Arc<CudaDevice>, rank: usize, ranks: usize, id: &NcclId) -> Result<Self> {
        require_nccl()?;
        if ranks == 0 || rank >= ranks || i32::try_from(ranks).is_err() {
            return Err(KernelError::invalid("rank", rank, format!("not a rank of a group of {ranks}")));
        }
        let comm = Comm::from_rank(Arc::clone(dev.stream()), rank, ranks, Id::uninit(id.0))
            .map_err(nccl_error("ncclCommInitRank"))?;
        Ok(Self { comm, dev: Arc::clone(dev) })
    }

    /// The device the rank runs on.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.dev
    }
}

impl Collectives<CudaMemory> for NcclRank {
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn ranks(&self) -> usize {
        self.comm.world_size()
    }

    fn all_gather(&mut self, send: &CudaSlice<bf16>, recv: &mut CudaSlice<bf16>) -> Result<()> {
        check_len("recv", times_ranks(send.len(), self.ranks())?, recv.len())?;
        self.comm.all_gather(send, recv).map_err(nccl_error("ncclAllGather"))?;
        Ok(())
    }

    fn reduce_scatter(&mut self, send: &CudaSlice<bf16>, recv: &mut CudaSlice<bf16>) -> Result<()> {
        check_len("send", times_ranks(recv.len(), self.ranks())?, send.len())?;
        self.comm.reduce_scatter(send, recv, &ReduceOp::Sum).map_err(nccl_error("ncclReduceScatter"))?;
        Ok(())
    }

    fn max(&mut self, value: u32) -> Result<u32> {
        let s = self.dev.stream();
        let cuda = |c: &'static str| {
            move |e: cudarc::driver::DriverError| KernelError::Cuda { context: c.into(), message: e.to_string() }
        };
        let send = s.clone_htod(&[value]).map_err(cuda("rank max upload"))?;
        let mut recv = s.alloc_zeros::<u32>(1).map_err(cuda("rank max buffer"))?;
        self.comm.all_reduce(&send, &mut recv, &ReduceOp::Max).map_err(nccl_error("ncclAllReduce"))?;
        let out = s.clone_dtoh(&recv).map_err(cuda("rank max download"))?;
        out.first().copied().ok_or_else(|| KernelError::invalid("max", 0, "no value came back"))
    }
}
