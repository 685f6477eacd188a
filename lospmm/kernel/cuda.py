"""The CUDA backend: load a cubin, launch it, check and time it (cuda-python driver bindings), and
the `cuda` timer. Nothing here runs at import, and `gpu_present()` is safe on a machine without a
GPU or driver.

Timing: warm-up launches, then for each repeat an L2 flush (a memset over twice the L2 size), a
busy-wait kernel so that the host's enqueueing is hidden, CUDA events around one launch, and the
median of the repeats (`timed_launch`); or, host out of the figure entirely, launches captured in a
CUDA graph between event-record nodes (`graph_timed`, torch 2.8+). Dynamic shared memory above
48 KB is enabled per function by attribute before launch.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping, Sequence

import numpy as np

from lospmm.devices import Device
from lospmm.kernel.spec import KernelSpec
from lospmm.kernel.timing import LaunchUnderTest, Timing
from lospmm.status import Status

NAME = "cuda"


# errors after which the process's CUDA context is lost: every later call in it fails the same way
# (CUDA's sticky errors: a kernel's bad access, trap or fault), so nothing after one says anything
STICKY_ERRORS = frozenset({
    "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_ILLEGAL_INSTRUCTION", "CUDA_ERROR_MISALIGNED_ADDRESS",
    "CUDA_ERROR_INVALID_ADDRESS_SPACE", "CUDA_ERROR_INVALID_PC", "CUDA_ERROR_LAUNCH_FAILED",
    "CUDA_ERROR_HARDWARE_STACK_ERROR", "CUDA_ERROR_ASSERT", "CUDA_ERROR_LAUNCH_TIMEOUT"})
_lost: list[str] = []  # the sticky error that lost this process's context, once one has


class CudaError(RuntimeError):
    """A driver call failed; the message names the call and the error. `context_lost`: this process's
    CUDA context is gone (by this error or an earlier sticky one); `transient`: it was gone before
    this call, so the failure says nothing of the kernel or data at hand (a fresh process retries it)."""

    def __init__(self, message: str, context_lost: bool = False, transient: bool = False):
        super().__init__(message)
        self.context_lost, self.transient = context_lost, transient


def context_lost(probe: bool = False) -> str:
    """The sticky error that lost this process's CUDA context ("" while it is whole). `probe`: ask
    the driver first (a synchronize), for a fault that surfaced elsewhere (torch's own calls)."""
    if probe and not _lost and gpu_present():
        from cuda.bindings import driver

        try:
            _context()
            _ck(driver.cuCtxSynchronize(), "cuCtxSynchronize")
        except CudaError:
            pass
    return _lost[0] if _lost else ""


def _ck(result, what: str):
    from cuda.bindings import driver

    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        name = getattr(err, "name", None)  # the enum's own name: no driver call (one may not answer)
        if name is None:
            _, name = driver.cuGetErrorName(err)
            name = name.decode() if isinstance(name, bytes) else str(name)
        before = _lost[0] if _lost else ""
        if name in STICKY_ERRORS and not before:
            _lost.append(f"{what}: {name}")
        raise CudaError(f"{what}: {name}" + (f" (the CUDA context was lost before, at {before})" if before else ""),
                        context_lost=bool(_lost), transient=bool(before))
    return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)


@lru_cache(maxsize=1)
def gpu_present() -> bool:
    """Whether a CUDA device can be used here (driver loads, at least one device)."""
    try:
        from cuda.bindings import driver

        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return False
        err, count = driver.cuDeviceGetCount()
        return err == driver.CUresult.CUDA_SUCCESS and count > 0
    except Exception:
        return False


@lru_cache(maxsize=None)
def _primary_context(ordinal: int = 0):
    from cuda.bindings import driver

    _ck(driver.cuInit(0), "cuInit")
    dev = _ck(driver.cuDeviceGet(ordinal), "cuDeviceGet")
    return dev, _ck(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")


def _context(ordinal: int = 0):
    """The device's primary context (torch and CuPy share it), made current on the calling thread:
    a context is current per thread, and Prefect runs tasks in worker threads (on an H100, a
    timer made on one thread failed with CUDA_ERROR_INVALID_CONTEXT on another)."""
    dev, ctx = _primary_context(ordinal)
    if getattr(_made_current, "ctx", None) is not ctx:  # once per thread: a launch pays no driver call for it
        from cuda.bindings import driver

        _ck(driver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        _made_current.ctx = ctx
    return dev, ctx


_made_current = threading.local()  # the context this thread made current (torch and CuPy keep the primary one)
_ARG_MASKS = {"ptr": (1 << 64) - 1, "int": (1 << 32) - 1, "long": (1 << 64) - 1}


def device_facts(ordinal: int = 0) -> dict:
    """Name, compute capability, SMs, L2 and shared memory of the present GPU."""
    from cuda.bindings import driver

    dev, _ = _context(ordinal)
    a = driver.CUdevice_attribute
    get = lambda attr: _ck(driver.cuDeviceGetAttribute(attr, dev), "cuDeviceGetAttribute")  # noqa: E731
    name = _ck(driver.cuDeviceGetName(256, dev), "cuDeviceGetName")
    major = get(a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
    minor = get(a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
    return {"name": name.split(b"\0")[0].decode(), "arch": f"sm_{major}{minor}",
            "sms": get(a.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT), "l2_bytes": get(a.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE),
            "smem_per_sm": get(a.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)}


class DeviceBuffer:
    """A device allocation (freed on close)."""

    def __init__(self, nbytes: int):
        from cuda.bindings import driver

        _context()
        self.nbytes = max(int(nbytes), 4)
        self.ptr = int(_ck(driver.cuMemAlloc(self.nbytes), "cuMemAlloc"))

    @classmethod
    def of(cls, array: np.ndarray) -> "DeviceBuffer":
        from cuda.bindings import driver

        a = np.ascontiguousarray(array)
        buf = cls(a.nbytes)
        if a.nbytes:
            _ck(driver.cuMemcpyHtoD(buf.ptr, a.ctypes.data, a.nbytes), "cuMemcpyHtoD")
        return buf

    def to_host(self, dtype, count: int) -> np.ndarray:
        from cuda.bindings import driver

        out = np.empty(count, dtype=dtype)
        _ck(driver.cuMemcpyDtoH(out.ctypes.data, self.ptr, out.nbytes), "cuMemcpyDtoH")
        return out

    def close(self) -> None:
        from cuda.bindings import driver

        if self.ptr:
            driver.cuMemFree(self.ptr)
            self.ptr = 0


DEFAULT_SHARED_BYTES = 48 * 1024  # a block's shared memory, static and dynamic together, without the opt-in


def shared_opt_in(static_bytes: int, dynamic_bytes: int, already_set: int) -> bool:
    """Whether a launch with `dynamic_bytes` of dynamic shared memory, on a function declaring
    `static_bytes` itself, must first raise the function's dynamic limit (to `dynamic_bytes`; one set
    to `already_set` or more serves it): the two together above 48 KB need the opt-in."""
    return static_bytes + dynamic_bytes > DEFAULT_SHARED_BYTES and dynamic_bytes > already_set


class LoadedKernel:
    """A cubin's (or NUL-terminated PTX's) kernel function, ready to launch with (device pointers |
    ints) arguments."""

    def __init__(self, cubin: bytes, name: str):
        from cuda.bindings import driver

        _context()
        self._image = np.frombuffer(cubin, dtype=np.uint8).copy()
        self.module = _ck(driver.cuModuleLoadData(self._image.ctypes.data), f"cuModuleLoadData({name})")
        self.function = _ck(driver.cuModuleGetFunction(self.module, name.encode()), f"cuModuleGetFunction({name})")
        self.name = name
        self._smem_set = 0
        # the shared memory it declares itself (a staged kernel's or proxy's chunk of B): with what a launch
        # adds, over 48 KB needs the opt-in (shared_opt_in)
        self._static_smem = int(_ck(driver.cuFuncGetAttribute(
            driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, self.function), "cuFuncGetAttribute"))
        self._slots = threading.local()  # per thread: argument values and the pointer array to them

    def fill_global(self, symbol: str, array: np.ndarray) -> None:
        """Copy `array` into the module's global `symbol`, which must be exactly its size."""
        from cuda.bindings import driver

        _context()
        address, size = _ck(driver.cuModuleGetGlobal(self.module, symbol.encode()), f"cuModuleGetGlobal({symbol})")
        data = np.ascontiguousarray(array)
        if int(size) != data.nbytes:
            raise CudaError(f"{self.name}: global {symbol} holds {int(size)} bytes, the data {data.nbytes}")
        _ck(driver.cuMemcpyHtoD(address, data.ctypes.data, data.nbytes), f"cuMemcpyHtoD({symbol})")

    def launch(self, grid: Sequence[int], block: int, args: Sequence[tuple[str, int]], smem_bytes: int = 0,
               stream=0) -> None:
        """`args`: ("ptr", address), ("int", value) or ("long", value), in the kernel's parameter order."""
        from cuda.bindings import driver

        _context()  # this thread may not be the one that loaded the module
        if shared_opt_in(self._static_smem, smem_bytes, self._smem_set):
            attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            _ck(driver.cuFuncSetAttribute(self.function, attr, int(smem_bytes)), "cuFuncSetAttribute")
            self._smem_set = smem_bytes
        values, params_address = self._arguments(len(args))
        for i, (kind, v) in enumerate(args):
            # each argument in an 8-byte slot: an int32 is its low 4 bytes (little-endian)
            values[i] = int(v) & _ARG_MASKS[kind]
        # cuLaunchKernel copies the values it is pointed at, so the slots are reused by the next launch
        _ck(driver.cuLaunchKernel(self.function, int(grid[0]), int(grid[1]), int(grid[2]), int(block), 1, 1,
                                  int(smem_bytes), stream, params_address, 0), f"cuLaunchKernel({self.name})")

    def _arguments(self, count: int):
        """This thread's argument slots for `count` arguments: (uint64 values, address of the array of
        their addresses), made once."""
        slots = getattr(self._slots, "by_count", None)
        if slots is None:
            slots = self._slots.by_count = {}
        if count not in slots:
            values = np.zeros(count, np.uint64)
            params = values.ctypes.data + 8 * np.arange(count, dtype=np.uint64)
            slots[count] = (values, params, params.ctypes.data)
        values, _, address = slots[count]
        return values, address

    def close(self) -> None:
        from cuda.bindings import driver

        driver.cuModuleUnload(self.module)


@dataclass(frozen=True)
class CudaTimerOptions:
    """Defaults: warmup=3, repeats=20, flush_l2=True, busy_wait_us=200.

    busy_wait_us: before each timed launch the GPU spins this long (a one-thread clock64 loop, as
    nvbench's blocking kernel does), so the host's work of enqueueing the start event and the
    launch (Python, cuBLAS or torch dispatch: tens of µs) happens while the GPU is busy and only
    device time is measured. Without it, on an H100, cuBLAS on a 58×24×3136 GEMM timed 26.5 µs
    in one call and 6.8 µs in the next, while our kernels' times repeated within 5%."""

    warmup: int = 3
    repeats: int = 20
    flush_l2: bool = True
    busy_wait_us: float = 200.0


# The busy-wait kernel as PTX, loaded by the driver's JIT: the timer never loads NVRTC, because
# on the H100 machine torch 2.11 failed to import in a process that had loaded NVRTC first.
SPIN_PTX = b"""
.version 7.0
.target sm_70
.address_size 64

.visible .entry lospmm_spin(.param .u64 cycles)
{
    .reg .pred %p;
    .reg .b64 %start, %now, %elapsed, %limit;
    ld.param.u64 %limit, [cycles];
    mov.u64 %start, %clock64;
SPIN:
    mov.u64 %now, %clock64;
    sub.s64 %elapsed, %now, %start;
    setp.lt.s64 %p, %elapsed, %limit;
    @%p bra SPIN;
    ret;
}
\0"""


@lru_cache(maxsize=None)
def _spin_kernel() -> "LoadedKernel":
    return LoadedKernel(SPIN_PTX, "lospmm_spin")


def busy_cycles(us: float) -> int:
    """Clock cycles of the present GPU in `us` microseconds (at its maximum SM clock)."""
    from cuda.bindings import driver

    dev, _ = _context()
    khz = _ck(driver.cuDeviceGetAttribute(driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_CLOCK_RATE, dev),
              "cuDeviceGetAttribute")
    return int(us * khz / 1000)


def busy_wait(us: float, stream=0) -> None:
    """Keep the GPU busy for about `us` µs on `stream` (nothing if `us` <= 0)."""
    if us > 0:
        _spin_kernel().launch((1, 1, 1), 1, [("long", busy_cycles(us))], 0, stream)


def timed_launch(kernel: LoadedKernel, grid, block: int, args, smem_bytes: int = 0,
                 options: CudaTimerOptions = CudaTimerOptions()) -> Timing:
    """Median time of `repeats` launches (events, L2 flushed before each); a failure is a row."""
    from cuda.bindings import driver

    try:
        _context()
        flush = DeviceBuffer(2 * device_facts()["l2_bytes"]) if options.flush_l2 else None
        start = _ck(driver.cuEventCreate(0), "cuEventCreate")
        end = _ck(driver.cuEventCreate(0), "cuEventCreate")
        try:
            for _ in range(options.warmup):
                kernel.launch(grid, block, args, smem_bytes)
            _ck(driver.cuCtxSynchronize(), "warm-up")
            times = []
            for _ in range(options.repeats):
                if flush:
                    _ck(driver.cuMemsetD8(flush.ptr, 0, flush.nbytes), "L2 flush")
                busy_wait(options.busy_wait_us)
                _ck(driver.cuEventRecord(start, 0), "cuEventRecord")
                kernel.launch(grid, block, args, smem_bytes)
                _ck(driver.cuEventRecord(end, 0), "cuEventRecord")
                _ck(driver.cuEventSynchronize(end), "cuEventSynchronize")
                times.append(_ck(driver.cuEventElapsedTime(start, end), "cuEventElapsedTime") * 1000.0)
        finally:
            driver.cuEventDestroy(start)
            driver.cuEventDestroy(end)
            if flush:
                flush.close()
        return Timing(NAME, float(np.median(times)), Status.OK, "", repeats=len(times))
    except Exception as e:
        return Timing(NAME, float("inf"), Status.ERROR, f"{type(e).__name__}: {e}")


def torch_timed(fn, options: CudaTimerOptions = CudaTimerOptions()) -> float:
    """Median µs of `fn()` on torch's current stream, timed as `timed_launch` times a kernel
    (torch's own spin kernel for the busy wait)."""
    import torch

    flush = torch.empty(2 * device_facts()["l2_bytes"] // 4, device="cuda") if options.flush_l2 else None
    for _ in range(options.warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(options.repeats):
        if flush is not None:
            flush.zero_()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if options.busy_wait_us > 0:
            torch.cuda._sleep(busy_cycles(options.busy_wait_us))
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1000.0)
    return float(np.median(times))


def graph_timed(fn, launches: int = 20, repeats: int = 3, flush_l2: bool = True) -> tuple[float, float, list[float]]:
    """Device time of `fn()` (it launches on torch's current stream: our kernels through
    CudaKernel.launch(stream=torch.cuda.current_stream().cuda_stream), a library through torch)
    with the host out of the figure: `launches` calls captured in one CUDA graph, each after an L2
    flush (a memset of twice the L2 in the same stream) and between two external timing events
    (event-record nodes), the graph replayed `repeats` times. Returns (the median of the repeats'
    medians in µs, the repeats' spread (max − min) / median, each repeat's median)."""
    import torch

    try:  # event-record nodes in a captured graph: torch.cuda.Event(external=True), torch 2.8 and later
        torch.cuda.Event(enable_timing=True, external=True)
    except TypeError:
        raise RuntimeError(f"graph_timed needs torch >= 2.8 (external events in CUDA graphs), not {torch.__version__}") from None
    flush = torch.empty(2 * device_facts()["l2_bytes"] // 4, device="cuda") if flush_l2 else None
    stream = torch.cuda.Stream()
    starts = [torch.cuda.Event(enable_timing=True, external=True) for _ in range(launches)]
    ends = [torch.cuda.Event(enable_timing=True, external=True) for _ in range(launches)]
    with torch.cuda.stream(stream):  # warm-up on the capture stream: workspaces and modules made outside capture
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for start, end in zip(starts, ends):
            if flush is not None:
                flush.zero_()
            start.record()
            fn()
            end.record()
    medians = []
    for _ in range(repeats):
        graph.replay()
        torch.cuda.synchronize()
        medians.append(float(np.median([s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends)])))
    del graph
    middle = float(np.median(medians))
    return middle, (max(medians) - min(medians)) / middle if middle > 0 else float("nan"), medians


def dense_sgemm_time(m: int, k: int, n: int, options: CudaTimerOptions = CudaTimerOptions(),
                     dtype: str = "fp32") -> Timing:
    """cuBLAS on the layer's M×K·K×N in the kernel's dtype (through torch): SGEMM with TF32 off for
    fp32, the tensor-core GEMM for fp16 / bf16. The dense baseline a kernel's speedup is quoted
    against. Status SKIPPED when torch is not installed."""
    try:
        import torch
    except ImportError:
        return Timing(NAME, float("nan"), Status.SKIPPED, "no dense baseline: install the torch extra")
    try:
        torch.backends.cuda.matmul.allow_tf32 = False  # FP32 SGEMM, the precision our fp32 kernels compute in
        from lospmm.kernel.arrays import torch_dtype

        kind = torch_dtype(dtype)
        a = torch.randn(m, k, device="cuda", dtype=kind)
        b = torch.randn(k, n, device="cuda", dtype=kind)
        us = torch_timed(lambda: torch.matmul(a, b), options)
        return Timing(NAME, us, Status.OK, "", repeats=options.repeats)
    except Exception as e:
        return Timing(NAME, float("nan"), Status.ERROR, f"dense baseline: {type(e).__name__}: {e}")


class CudaKernel:
    """A compiled kernel on the CUDA backend, launched as its spec says. `run(x)` on numpy arrays
    (the check's: B, its bits for a half kernel, or a conv kernel's X; the output poisoned with NaN
    first), `launch(...)` on device pointers (the loader's torch and CuPy arrays), `time(count)` by
    events (timed_launch); a proxy takes its N1 (`threads`), cluster map and shared memory."""

    backend = NAME

    def __init__(self, spec: KernelSpec, cubin: bytes, module_data: Mapping[str, np.ndarray] | None = None):
        """`module_data`: {symbol: array} copied into the module's globals once it is loaded (the N:M
        kernel's compressed A: KernelSpec.module_data); every symbol the spec names must be given."""
        missing = [s for s in spec.module_symbols.values() if s not in (module_data or {})]
        if missing:
            raise ValueError(f"{spec.layer or spec.name}: module data not given for {missing}")
        self.spec, self.cubin = spec, cubin
        self.loaded = LoadedKernel(cubin, spec.name)
        try:
            for symbol in spec.module_symbols.values():
                self.loaded.fill_global(symbol, np.asarray(module_data[symbol]))
        except Exception:  # a module whose data could not be filled is never launched: unloaded
            self.loaded.close()
            raise

    def launch(self, x_ptr: int, y_ptr: int, count: int, stream=0, threads: int | None = None,
               extra: Sequence[tuple[str, int]] = (), smem_bytes: int = 0) -> None:
        """One launch over `count` (N, already a multiple of the column multiple, or a batch)."""
        spec = self.spec
        self.loaded.launch(spec.grid(count, threads), spec.layout.block(threads),
                           [("ptr", x_ptr), ("ptr", y_ptr), ("int", count), *extra], smem_bytes, stream)

    def _buffers(self, x: np.ndarray, poison: bool):
        spec = self.spec
        count = x.shape[0] if spec.form == "conv" else x.shape[1]
        launched = spec.launch_count(count)
        if launched != count:  # zero columns to the column multiple
            padded = np.zeros((x.shape[0], launched), x.dtype)
            padded[:, :count] = x
            x = padded
        out = np.prod(spec.output_shape(launched))
        fill = (0x7FFF if spec.number.is_half else np.nan) if poison else 0
        return count, launched, DeviceBuffer.of(x), DeviceBuffer.of(np.full(out, fill, spec.number.array_dtype))

    def run(self, x: np.ndarray, threads: int | None = None, extra: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
        from cuda.bindings import driver

        spec = self.spec
        count, launched, xb, yb = self._buffers(np.asarray(x, spec.number.array_dtype), poison=True)
        arrays = [DeviceBuffer.of(np.asarray(a, np.int32)) for a in (extra or {}).values()]
        try:
            self.launch(xb.ptr, yb.ptr, launched, 0, threads, [("ptr", a.ptr) for a in arrays])
            _ck(driver.cuCtxSynchronize(), spec.name)
            y = yb.to_host(spec.number.array_dtype, int(np.prod(spec.output_shape(launched))))
        finally:
            for b in (xb, yb, *arrays):
                b.close()
        y = y.reshape(spec.output_shape(launched))
        return y if spec.form == "conv" else y[:, :count]

    def time(self, count: int, options: CudaTimerOptions = CudaTimerOptions(), threads: int | None = None,
             extra: Mapping[str, np.ndarray] | None = None, smem_bytes: int = 0) -> Timing:
        """Median µs of launches over `count` (N or a batch) on random inputs (timed_launch)."""
        spec = self.spec
        _, launched, xb, yb = self._buffers(spec.number.sample(spec.input_shape(count)), poison=False)
        arrays = [DeviceBuffer.of(np.asarray(a, np.int32)) for a in (extra or {}).values()]
        try:
            args = [("ptr", xb.ptr), ("ptr", yb.ptr), ("int", launched), *(("ptr", a.ptr) for a in arrays)]
            return timed_launch(self.loaded, spec.grid(launched, threads), spec.layout.block(threads), args,
                                smem_bytes, options)
        finally:
            for b in (xb, yb, *arrays):
                b.close()

    def close(self) -> None:
        self.loaded.close()


@dataclass(frozen=True)
class CudaTimer:
    """The `cuda` timer (kernel.timing.Timer): launches the cubin on the GPU here. `gpu_name` is the
    device it measures on, so results from two GPUs never share a cache key."""

    device: Device
    gpu_name: str
    options: CudaTimerOptions = CudaTimerOptions()
    name: str = NAME
    measures: bool = True
    runs_binary: bool = True

    def time(self, launch: LaunchUnderTest) -> Timing:
        if launch.cubin is None or launch.spec is None:
            return Timing(self.name, float("inf"), Status.ERROR, "no compiled kernel to launch")
        try:
            kernel = CudaKernel(launch.spec, launch.cubin, launch.module_data)
        except Exception as e:
            if getattr(e, "transient", False):  # the context was lost before: nothing of this kernel's
                raise
            return Timing(self.name, float("inf"), Status.ERROR, f"{type(e).__name__}: {e}")
        try:
            if launch.clusters is not None:  # a proxy: its N1 under test, its tile -> cluster map, Eq. 6's memory
                return kernel.time(launch.n, self.options, launch.n1, {"cluster_of": launch.clusters.cluster_of},
                                   launch.smem_bytes)
            return kernel.time(launch.spec.count(launch.n), self.options)
        finally:
            kernel.close()

    def dense(self, m: int, k: int, n: int, dtype: str = "fp32") -> Timing:
        return dense_sgemm_time(m, k, n, self.options, dtype)

    def checked(self, spec: KernelSpec, cubin: bytes, matrix, count: int):
        """The kernel's check on this GPU at every path it picks at launch (kernel.check.checked_paths;
        a conv kernel's `count` is a batch)."""
        from lospmm.kernel.check import checked_paths

        kernel = CudaKernel(spec, cubin, spec.module_data(matrix))
        try:
            return checked_paths(kernel, matrix, count)
        finally:
            kernel.close()
