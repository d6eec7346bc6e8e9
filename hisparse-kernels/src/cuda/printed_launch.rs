//! A kernel launch that records its own print. [`PrintedLaunch::arg`] pushes an argument to
//! cudarc's launch builder and its words (a buffer's device address and length, a value's
//! bits) to the launch's print in one call, and [`PrintedLaunch::launch`] folds the kernel,
//! grid, block, shared memory and those words into the running [`LaunchPrint`] as it launches:
//! no argument can reach a kernel without reaching its print, so two launch sequences with
//! equal prints pass the same arguments (`launch_graph.rs` relies on it to replay a graph).
//!
//! Invariant: every kernel launch of the CUDA backend that can be captured into a graph goes
//! through [`PrintedLaunch`].

use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DriverError, LaunchArgs, LaunchConfig,
    PushKernelArg,
};

/// The print of no launch.
pub(crate) const PRINT_SEED: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a step over one 64-bit word.
fn mix(h: u64, w: u64) -> u64 {
    w.to_le_bytes().iter().fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

/// The running print of a stream's launches since it was last taken.
#[derive(Debug)]
pub struct LaunchPrint(AtomicU64);

impl Default for LaunchPrint {
    fn default() -> Self {
        Self(AtomicU64::new(PRINT_SEED))
    }
}

impl LaunchPrint {
    /// Folds one operation's words (a launch, a copy) into the print; order matters.
    pub(crate) fn fold(&self, words: &[u64]) {
        let h = words.iter().fold(PRINT_SEED, |h, &w| mix(h, w));
        let _ = self.0.fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| Some(mix(p, h)));
    }

    /// Adds one device-to-device copy.
    pub(crate) fn copy(&self, src: u64, dst: u64, bytes: u64) {
        self.fold(&[0xc0de, src, dst, bytes]);
    }

    /// The print since the last call, which starts a new one.
    pub(crate) fn take(&self) -> u64 {
        self.0.swap(PRINT_SEED, Ordering::AcqRel)
    }
}

/// The device address of `buf`, for a print.
pub(crate) fn addr<T>(buf: &impl DevicePtr<T>, stream: &CudaStream) -> u64 {
    // Event tracking is off on the backend's device (`CudaDevice::with_own_stream`): the guard
    // records nothing.
    let (p, _guard) = buf.device_ptr(stream);
    p
}

/// What an argument contributes to a launch's print.
pub(crate) trait PrintWords {
    /// Appends this argument's words.
    fn print_words(&self, stream: &CudaStream, out: &mut Vec<u64>);
}

impl<T> PrintWords for CudaSlice<T> {
    fn print_words(&self, stream: &CudaStream, out: &mut Vec<u64>) {
        out.extend([addr(self, stream), self.len() as u64]);
    }
}

impl<T> PrintWords for CudaView<'_, T> {
    fn print_words(&self, stream: &CudaStream, out: &mut Vec<u64>) {
        out.extend([addr(self, stream), self.len() as u64]);
    }
}

impl<T> PrintWords for CudaViewMut<'_, T> {
    fn print_words(&self, stream: &CudaStream, out: &mut Vec<u64>) {
        out.extend([addr(self, stream), self.len() as u64]);
    }
}

macro_rules! print_scalar {
    ($($t:ty => $w:expr),* $(,)?) => {$(
        impl PrintWords for $t {
            fn print_words(&self, _: &CudaStream, out: &mut Vec<u64>) {
                let f: fn(&$t) -> u64 = $w;
                out.push(f(self));
            }
        }
    )*};
}

print_scalar!(u32 => |x| u64::from(*x), i32 => |x| u64::from(*x as u32), u64 => |x| *x, f32 => |x| u64::from(x.to_bits()));

/// A parameter struct passed by value: printed as its bytes (no padding: `Pod`).
pub(crate) fn pod_words<T: bytemuck::Pod>(v: &T, out: &mut Vec<u64>) {
    let bytes = bytemuck::bytes_of(v);
    out.extend(bytes.chunks(8).map(|c| {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        u64::from_le_bytes(w)
    }));
}

/// A launch being assembled: arguments go to the builder and to the print together.
pub(crate) struct PrintedLaunch<'a> {
    print: &'a LaunchPrint,
    stream: &'a CudaStream,
    func: &'a CudaFunction,
    args: LaunchArgs<'a>,
    words: Vec<u64>,
}

impl<'a> PrintedLaunch<'a> {
    /// A launch of `func` on `stream`, printed into `print`.
    pub(crate) fn new(print: &'a LaunchPrint, stream: &'a std::sync::Arc<CudaStream>, func: &'a CudaFunction) -> Self {
        Self { print, stream, func, args: stream.launch_builder(func), words: Vec::with_capacity(24) }
    }

    /// Passes `a` (a buffer, a view or a value) to the kernel and to the print.
    pub(crate) fn arg<A: PrintWords>(&mut self, a: &'a A) -> &mut Self
    where
        LaunchArgs<'a>: PushKernelArg<&'a A>,
    {
        a.print_words(self.stream, &mut self.words);
        self.args.arg(a);
        self
    }

    /// Passes the buffer or view `a` for the kernel to write.
    pub(crate) fn arg_mut<A: PrintWords>(&mut self, a: &'a mut A) -> &mut Self
    where
        LaunchArgs<'a>: PushKernelArg<&'a mut A>,
    {
        a.print_words(self.stream, &mut self.words);
        self.args.arg(a);
        self
    }

    /// Passes the `#[repr(C)]` parameter struct `p` by value.
    pub(crate) fn params<P: bytemuck::Pod + cudarc::driver::DeviceRepr>(&mut self, p: &'a P) -> &mut Self {
        pod_words(p, &mut self.words);
        self.args.arg(p);
        self
    }

    /// Folds the launch into the print and launches it.
    ///
    /// # Safety
    /// As cudarc's `LaunchArgs::launch`: the arguments must be what the kernel expects, and every
    /// access the kernel makes through them must lie within their buffers.
    pub(crate) unsafe fn launch(&mut self, cfg: LaunchConfig) -> Result<(), DriverError> {
        let (g, b) = (cfg.grid_dim, cfg.block_dim);
        let head = [
            self.func.cu_function() as usize as u64,
            u64::from(g.0),
            u64::from(g.1),
            u64::from(g.2),
            u64::from(b.0),
            u64::from(b.1),
            u64::from(b.2),
            u64::from(cfg.shared_mem_bytes),
        ];
        self.print.fold(&[&head[..], &self.words].concat());
        // SAFETY: the caller's.
        unsafe { self.args.launch(cfg) }.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[repr(C)]
    #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
    struct P {
        a: u32,
        b: u32,
        c: u64,
        d: f32,
        pad: u32,
    }

    #[test]
    fn every_field_of_a_parameter_struct_reaches_the_print() {
        let base = P { a: 1, b: 2, c: 3, d: 0.5, pad: 0 };
        let words = |p: &P| {
            let mut w = Vec::new();
            pod_words(p, &mut w);
            w
        };
        assert_eq!(words(&base).len(), 3);
        for changed in [P { a: 9, ..base }, P { b: 9, ..base }, P { c: 9, ..base }, P { d: 0.25, ..base }] {
            assert_ne!(words(&changed), words(&base));
        }
    }

    #[test]
    fn the_print_follows_order_and_restarts_when_taken() {
        let p = LaunchPrint::default();
        p.fold(&[1, 2]);
        p.fold(&[3]);
        let ab = p.take();
        p.fold(&[3]);
        p.fold(&[1, 2]);
        let ba = p.take();
        assert_ne!(ab, ba, "a sequence, not a set");
        p.fold(&[1, 2]);
        p.fold(&[3]);
        assert_eq!(p.take(), ab);
        assert_eq!(p.take(), PRINT_SEED);
        p.copy(1, 2, 3);
        assert_ne!(p.take(), PRINT_SEED);
    }
}
