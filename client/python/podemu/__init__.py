"""podemu from Python: a TPU VM pod emulator's client library (libpodemu.so) through ctypes.

    import podemu
    with podemu.Pod() as pod:               # the pod `podemu up` started
        x = pod.full([1024], 1.0)           # lazy, on every core
        y = x.all_gather(0)
        pod.mark_step()                     # compile and run (torch_xla's mark_step)
        print(y.fetch(0).sum(), pod.memory_info(0)["peak_bytes_used"])

Tensors are SPMD values: one per core, recorded lazily as a step graph and run by mark_step.
Errors are PodemuError, with the code (e.g. "RESOURCE_EXHAUSTED") and the pod's text, which
is XLA's where XLA has one. `from podemu import xm` gives the torch_xla-flavoured layer.
"""

import ctypes
import json
import os

from . import _lib
from ._lib import lib

__all__ = ["Pod", "Tensor", "Groups", "PodemuError", "compile_hlo", "DTYPES", "REDUCTIONS"]

# Element types by XLA's names, with their NumPy types (bf16 goes through float32).
DTYPES = {"pred": 1, "s32": 2, "u8": 3, "bf16": 4, "f32": 5, "u32": 6}
_DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
# The reducing collectives' and reduce's computations, with torch_xla's names too.
REDUCTIONS = {"sum": 0, "add": 0, "product": 1, "mul": 1, "max": 2, "min": 3, "and": 4,
              "or": 5}


class PodemuError(RuntimeError):
    """A failed call: code is the status name ("RESOURCE_EXHAUSTED"), number its value, and
    the message the pod's text."""

    def __init__(self, number, message):
        self.number = int(number)
        name = lib.pe_code_name(self.number)
        self.code = name.decode() if name else str(number)
        self.message = message
        super().__init__(f"{self.code}: {message}")


def _numpy():
    import numpy  # Debian's python3-numpy; only uploads and fetches need it
    return numpy


def _np_dtype(dtype):
    np = _numpy()
    return {"pred": np.bool_, "s32": np.int32, "u8": np.uint8, "bf16": np.float32,
            "f32": np.float32, "u32": np.uint32}[dtype]


def _dtype_of(name):
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, not {name!r}")
    return DTYPES[name]


def _reduction(op):
    if op not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {sorted(REDUCTIONS)}, not {op!r}")
    return REDUCTIONS[op]


def compile_hlo(path, topology="v3-8", layout="tpu", all_gather_strategy="native",
                no_alias=False):
    """`podemu compile PATH --json` without a pod: the plan per core of topology, as a dict
    ("cores": [{"peak_bytes", "fits", ...}], "warnings", "error"). A module
    that does not fit is a report with fits False; text that does not read raises."""
    with open(path, "rb") as f:
        text = f.read()
    options = _lib.CompileOptions(topology.encode(), layout == "none",
                                  all_gather_strategy.encode(), bool(no_alias),
                                  os.fspath(path).encode())
    if layout not in ("tpu", "none"):
        raise ValueError("layout must be 'tpu' or 'none'")
    out = ctypes.c_void_p()
    rv = lib.pe_compile_hlo(text, len(text), ctypes.byref(options), ctypes.byref(out))
    if not out.value:
        raise PodemuError(rv, "no report")
    try:
        report = json.loads(ctypes.string_at(out.value).decode())
    finally:
        lib.pe_free(out)
    if rv != 0:
        raise PodemuError(rv, (report.get("error") or {}).get("message", "compile failed"))
    return report


class Groups:
    """Replica groups (XLA's "{{0,1},{2,3}}" or "[2,4]<=[8]", or a mesh axis); the pod owns
    them for its lifetime."""

    def __init__(self, pod, ptr, text):
        self.pod, self._ptr, self.text = pod, ptr, text

    def __repr__(self):
        return f"Groups({self.text!r})"


def _groups_ptr(groups):
    return None if groups is None else groups._ptr


class Pod:
    """A connection to a running pod (url None: $PODEMU_COORDINATOR, else the pod `podemu up`
    started for $PODEMU_STATE_DIR or the default state directory)."""

    def __init__(self, url=None):
        ptr = _lib.P()
        rv = lib.pe_connect(ctypes.byref(ptr), url.encode() if url else None)
        if rv != 0:
            raise PodemuError(rv, lib.pe_connect_error().decode())
        self._ptr = ptr.value
        self._recordings = []  # the tensors made inside each computation being recorded

    # ---- the connection ----
    def close(self):
        """Disconnects; every tensor of this pod becomes unusable (its buffers are freed)."""
        if self._ptr:
            lib.pe_disconnect(self._ptr)
            self._ptr = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()

    def _client(self):
        if not self._ptr:
            raise PodemuError(9, "the pod connection is closed")
        return self._ptr

    def _error(self):
        code = lib.pe_last_code(self._ptr) or 3
        return PodemuError(code, lib.pe_last_error(self._ptr).decode())

    def _check(self, rv):
        if rv != 0:
            raise self._error()

    def _tensor(self, ptr, owned=True):
        if not ptr:
            raise self._error()
        t = Tensor(self, ptr, owned and not self._recordings)
        if self._recordings:
            self._recordings[-1].append(t)
        return t

    # ---- control flow ----
    def _record(self, fn, errors):
        """A C callback recording computation fn over its parameter tensors."""
        def callback(args, n, ctx, results, n_results):
            try:
                values = fn(*[self._tensor(args[k], owned=False) for k in range(n)])
                values = list(values) if isinstance(values, (list, tuple)) else [values]
                if len(values) != n_results:
                    raise ValueError(f"returned {len(values)} tensors, not {n_results}")
                for k, v in enumerate(values):
                    results[k] = v._ptr
                return 0
            except BaseException as e:  # raised again once the library returns
                errors.append(e)
                return 3
        return _lib.COMPUTATION_FN(callback)

    def _run_recording(self, call, errors):
        self._recordings.append([])
        try:
            rv = call()
        finally:
            for t in self._recordings.pop():
                t._ptr = None  # freed with the computation it was made in
        if errors:
            raise errors[0]
        self._check(rv)

    def _outputs(self, out, n):
        return [self._tensor(out[k]) for k in range(n)]

    def while_loop(self, cond_fn, body_fn, init, known_trip_count=0):
        """torch's while_loop(cond_fn, body_fn, carried_inputs), as XLA's While: cond_fn and
        body_fn are called once, now, with the state's tensors to record the loop; the final
        state is returned. A pod without bytes runs the body known_trip_count times (once
        when 0)."""
        init = list(init)
        errors = []

        def cond(state, n, ctx):
            try:
                return cond_fn(*[self._tensor(state[k], owned=False) for k in range(n)])._ptr
            except BaseException as e:
                errors.append(e)
                return None
        c = _lib.COND_FN(cond)
        b = self._record(body_fn, errors)
        arr = (_lib.P * len(init))(*[t._ptr for t in init])
        out = (_lib.P * len(init))()
        self._run_recording(lambda: lib.pe_while_loop(arr, len(init), c, b, None,
                                                      int(known_trip_count), out), errors)
        return self._outputs(out, len(init))

    def call(self, fn, args, n_results=1):
        """XLA's Call: fn(*args) records the callee; its results (a list)."""
        args = list(args)
        errors = []
        f = self._record(fn, errors)
        arr = (_lib.P * len(args))(*[t._ptr for t in args])
        out = (_lib.P * n_results)()
        self._run_recording(lambda: lib.pe_call(arr, len(args), f, None, out, n_results),
                            errors)
        return self._outputs(out, n_results)

    def conditional(self, index, branches, n_results=1):
        """XLA's Conditional: index (a pred: branch 0 when true; or an s32) picks which of
        branches, a list of (fn, [args]), runs; the results (a list)."""
        errors = []
        fns = (_lib.COMPUTATION_FN * len(branches))(
            *[self._record(fn, errors) for fn, _ in branches])
        args = [(_lib.P * len(a))(*[t._ptr for t in a]) for _, a in branches]
        arg_ptrs = (ctypes.POINTER(_lib.P) * len(branches))(
            *[ctypes.cast(a, ctypes.POINTER(_lib.P)) for a in args])
        counts = (ctypes.c_int * len(branches))(*[len(a) for _, a in branches])
        ctxs = (ctypes.c_void_p * len(branches))()
        out = (_lib.P * n_results)()
        self._run_recording(lambda: lib.pe_conditional(index._ptr, len(branches), arg_ptrs,
                                                       counts, fns, ctxs, out, n_results),
                            errors)
        return self._outputs(out, n_results)

    @property
    def world_size(self):
        return lib.pe_world_size(self._client())

    @property
    def num_hosts(self):
        return lib.pe_num_hosts(self._client())

    @property
    def topology(self):
        return lib.pe_topology(self._client()).decode()

    @property
    def backing(self):
        """"host" when the cores hold real bytes, "none" under --backing none."""
        return lib.pe_backing(self._client()).decode()

    def wait_ready(self, timeout=30.0):
        """Waits until every host is registered and alive."""
        self._check(lib.pe_wait_ready(self._client(), int(timeout * 1000)))

    # ---- values ----
    def full(self, shape, value=0.0, dtype="f32"):
        """A tensor of shape filled with value on every core (lazy)."""
        return self._tensor(lib.pe_full(self._client(), _dtype_of(dtype), _lib.int64s(shape),
                                        len(shape), float(value)))

    def zeros(self, shape, dtype="f32"):
        return self.full(shape, 0.0, dtype)

    def ones(self, shape, dtype="f32"):
        return self.full(shape, 1.0, dtype)

    def iota(self, shape, dimension=0, dtype="f32"):
        return self._tensor(lib.pe_iota(self._client(), _dtype_of(dtype), _lib.int64s(shape),
                                        len(shape), int(dimension)))

    def replica_id(self):
        """This core's replica id, a u32 scalar."""
        return self._tensor(lib.pe_replica_id(self._client()))

    def partition_id(self):
        return self._tensor(lib.pe_partition_id(self._client()))

    def upload(self, data, dtype=None, layout=None):
        """A device buffer now: data is one array for every core, or a list of world_size
        arrays (one per core, equal shapes). layout: XLA's layout text ("{0:T(256)}")."""
        np = _numpy()
        per_core = list(data) if isinstance(data, (list, tuple)) else [data] * self.world_size
        if len(per_core) != self.world_size:
            raise ValueError(f"{len(per_core)} arrays for {self.world_size} cores")
        arrays = [np.asarray(a) for a in per_core]
        if dtype is None:
            dtype = {np.dtype(np.float32): "f32", np.dtype(np.int32): "s32",
                     np.dtype(np.uint8): "u8", np.dtype(np.uint32): "u32",
                     np.dtype(np.bool_): "pred"}.get(arrays[0].dtype, "f32")
        shape = arrays[0].shape
        if any(a.shape != shape for a in arrays):
            raise ValueError("every core's array must have the same shape")
        raw = [_to_bytes(np, a, dtype) for a in arrays]
        ptrs = (ctypes.c_void_p * len(raw))(*[ctypes.cast(ctypes.c_char_p(r), ctypes.c_void_p)
                                               for r in raw])
        return self._tensor(lib.pe_upload_layout(self._client(), _dtype_of(dtype),
                                                 _lib.int64s(shape), len(shape),
                                                 layout.encode() if layout else None, ptrs))

    def concatenate(self, tensors, dimension):
        arr = (_lib.P * len(tensors))(*[t._ptr for t in tensors])
        return self._tensor(lib.pe_concatenate(arr, len(tensors), int(dimension)))

    def optimization_barrier(self, tensors):
        """torch_xla's optimization_barrier_: the tensors are replaced in place."""
        arr = (_lib.P * len(tensors))(*[t._ptr for t in tensors])
        self._check(lib.pe_optimization_barrier(arr, len(tensors)))

    def opaque(self, name, shape, operands=(), dtype="f32"):
        """An op without a kernel (planned and accounted; a pod with real bytes refuses it)."""
        arr = (_lib.P * max(len(operands), 1))(*[t._ptr for t in operands])
        return self._tensor(lib.pe_opaque(self._client(), name.encode(), _dtype_of(dtype),
                                          _lib.int64s(shape), len(shape), arr, len(operands)))

    def opaque_tuple(self, name, shapes, operands=(), dtypes=None):
        """An op without a kernel whose result is a tuple (shapes: one per element)."""
        n = len(shapes)
        dtypes = dtypes or ["f32"] * n
        types = (ctypes.c_int * n)(*[_dtype_of(d) for d in dtypes])
        dims = [_lib.int64s(sh) for sh in shapes]
        dims_arr = (_lib.c_int64_p * n)(*[ctypes.cast(d, _lib.c_int64_p) for d in dims])
        ranks = (ctypes.c_int * n)(*[len(sh) for sh in shapes])
        ops = (_lib.P * max(len(operands), 1))(*[t._ptr for t in operands])
        out = (_lib.P * n)()
        self._check(lib.pe_opaque_tuple(self._client(), name.encode(), n, types, dims_arr,
                                        ranks, ops, len(operands), out))
        return self._outputs(out, n)

    # ---- groups and meshes ----
    def groups(self, text):
        """Replica groups in XLA's syntax."""
        ptr = lib.pe_groups_parse(self._client(), text.encode())
        if not ptr:
            raise self._error()
        return Groups(self, ptr, text)

    def set_mesh(self, spec):
        """The device mesh, "data=4,model=2" (ordinals row-major, last axis fastest)."""
        self._check(lib.pe_set_mesh(self._client(), spec.encode()))

    def mesh_axis(self, axis):
        ptr = lib.pe_groups_axis(self._client(), axis.encode())
        if not ptr:
            raise self._error()
        return Groups(self, ptr, "axis " + axis)

    # ---- steps ----
    def mark_step(self, wait=True):
        """Compiles and runs the pending graph on every core (torch_xla's mark_step). With
        wait=False the step is sent and this returns once the step before it has finished:
        its outputs are usable in the next step at once; a failure is raised by the next
        mark_step or wait_device_ops."""
        self._check(lib.pe_mark_step(self._client()) if wait
                    else lib.pe_mark_step_async(self._client()))

    def wait_device_ops(self):
        """Waits for every step sent by mark_step(wait=False); raises the first failure."""
        self._check(lib.pe_wait_device_ops(self._client()))

    def plan_step(self):
        """The plan of the pending graph, without running it: argument/output/temp/peak
        bytes, bytes_limit, fits and XLA's OOM text when it does not fit."""
        plan = _lib.StepPlan()
        self._check(lib.pe_plan_step(self._client(), ctypes.byref(plan)))
        out = {name: getattr(plan, name) for name, _ in _lib.StepPlan._fields_}
        out["fits"] = bool(out["fits"])
        out["program_cache_hit"] = bool(out["program_cache_hit"])
        out["oom_message"] = plan.oom_message.decode()
        return out

    def last_step_collectives(self):
        """The last step's collectives: (longest microseconds on any core, algorithm, scratch
        bytes each core reserved for it)."""
        n = 256
        micros = (ctypes.c_int64 * n)()
        algos = (ctypes.c_char_p * n)()
        got = lib.pe_last_step_collectives(self._client(), micros, algos, n)
        if got < 0:
            raise PodemuError(-got, lib.pe_last_error(self._ptr).decode())
        return [(micros[k], (algos[k] or b"").decode(),
                 lib.pe_last_step_scratch_bytes(self._client(), k)) for k in range(min(got, n))]

    def last_step_collectives_span(self, first, last):
        """Microseconds from the start of the last step's collective `first` to the end of
        collective `last` on its slowest core (as nccl-tests times a loop on each rank)."""
        span = lib.pe_last_step_collectives_span(self._client(), first, last)
        if span < 0:
            raise IndexError(f"no collectives {first}..{last} in the last step")
        return span

    # ---- memory ----
    def memory_info(self, ordinal=None):
        """One core's statistics as a dict (torch_xla's bytes_used, bytes_limit,
        peak_bytes_used, and PJRT's names), or a list for every core."""
        if ordinal is None:
            n = self.world_size
            infos = (_lib.MemoryInfo * n)()
            self._check(lib.pe_memory_info_all(self._client(), infos, n))
            return [_info_dict(i) for i in infos]
        info = _lib.MemoryInfo()
        self._check(lib.pe_memory_info_get(self._client(), int(ordinal), ctypes.byref(info)))
        return _info_dict(info)


def _info_dict(info):
    return {name: getattr(info, name) for name, _ in _lib.MemoryInfo._fields_}


def _to_bytes(np, a, dtype):
    if dtype == "bf16":  # float32 rounded to the nearest bf16, ties to even
        bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return rounded.astype(np.uint16).tobytes()
    return np.ascontiguousarray(a, dtype=_np_dtype(dtype)).tobytes()


def _from_bytes(np, raw, dtype, shape):
    if dtype == "bf16":
        bits = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).reshape(shape)
    return np.frombuffer(raw, dtype=_np_dtype(dtype)).reshape(shape).copy()


class Tensor:
    """One value per core of a pod: pending (recorded) until mark_step, then a device buffer.
    Dropping the last reference releases it (torch_xla frees a tensor's buffer on del)."""

    def __init__(self, pod, ptr, owned=True):
        self.pod, self._ptr, self._owned = pod, ptr, owned

    def __del__(self):
        self.release()

    def release(self):
        if self._ptr and self.pod._ptr and self._owned:
            lib.pe_release(self._ptr)
        self._ptr = None

    def _p(self):
        if not self._ptr:
            raise PodemuError(9, "the tensor was released")
        return self._ptr

    def _new(self, ptr):
        return self.pod._tensor(ptr)

    # ---- what it is ----
    def _shape(self):
        dtype = ctypes.c_int()
        dims = (ctypes.c_int64 * _lib.MAX_RANK)()
        rank = ctypes.c_int()
        self.pod._check(lib.pe_tensor_shape(self._p(), ctypes.byref(dtype), dims,
                                            ctypes.byref(rank)))
        return _DTYPE_NAMES[dtype.value], tuple(dims[k] for k in range(rank.value))

    @property
    def shape(self):
        return self._shape()[1]

    @property
    def dtype(self):
        return self._shape()[0]

    @property
    def nbytes(self):
        return lib.pe_tensor_bytes(self._p())

    def __repr__(self):
        dtype, shape = self._shape()
        return f"podemu.Tensor({dtype}[{','.join(map(str, shape))}])"

    def set_layout(self, layout):
        """The layout XLA would write for this pending value ("{0:T(256)}")."""
        self.pod._check(lib.pe_set_layout(self._p(), layout.encode()))
        return self

    # ---- bytes ----
    def fetch(self, ordinal=0):
        """Core ordinal's value as a NumPy array (runs mark_step first when pending)."""
        np = _numpy()
        dtype, shape = self._shape()
        size = lib.pe_tensor_bytes(self._p())
        buf = ctypes.create_string_buffer(max(size, 1))
        self.pod._check(lib.pe_fetch(self._p(), int(ordinal), buf, size))
        return _from_bytes(np, buf.raw[:size], dtype, shape)

    def numpy(self):
        """Every core's value, in ordinal order."""
        return [self.fetch(k) for k in range(self.pod.world_size)]

    # ---- elementwise ----
    def _binary(self, name, other):
        if not isinstance(other, Tensor):
            other = self.pod.full(self.shape, other, self.dtype)
        return self._new(getattr(lib, "pe_" + name)(self._p(), other._p()))

    def __add__(self, other):
        return self._binary("add", other)

    def __sub__(self, other):
        return self._binary("subtract", other)

    def __mul__(self, other):
        return self._binary("multiply", other)

    def __truediv__(self, other):
        return self._binary("divide", other)

    def __neg__(self):
        return self._new(lib.pe_negate(self._p()))

    def __and__(self, other):
        return self._binary("and", other)

    def __or__(self, other):
        return self._binary("or", other)

    def __invert__(self):
        return self._new(lib.pe_not(self._p()))

    def maximum(self, other):
        return self._binary("maximum", other)

    def minimum(self, other):
        return self._binary("minimum", other)

    def abs(self):
        return self._new(lib.pe_abs(self._p()))

    def exp(self):
        return self._new(lib.pe_exponential(self._p()))

    def log(self):
        return self._new(lib.pe_log(self._p()))

    def tanh(self):
        return self._new(lib.pe_tanh(self._p()))

    def sqrt(self):
        return self._new(lib.pe_sqrt(self._p()))

    def rsqrt(self):
        return self._new(lib.pe_rsqrt(self._p()))

    def convert(self, dtype):
        return self._new(lib.pe_convert(self._p(), _dtype_of(dtype)))

    def compare(self, other, direction):
        """XLA compare: direction "EQ", "NE", "LT", "LE", "GT" or "GE"; a pred tensor."""
        if not isinstance(other, Tensor):
            other = self.pod.full(self.shape, other, self.dtype)
        return self._new(lib.pe_compare(self._p(), other._p(), direction.encode()))

    def select(self, on_true, on_false):
        """self (pred) chooses element by element."""
        return self._new(lib.pe_select(self._p(), on_true._p(), on_false._p()))

    # ---- structure ----
    def broadcast(self, shape, broadcast_dimensions=None):
        dims = _lib.int64s(broadcast_dimensions) if broadcast_dimensions is not None else None
        return self._new(lib.pe_broadcast(self._p(), _lib.int64s(shape), len(shape), dims))

    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (list, tuple)):
            shape = shape[0]
        return self._new(lib.pe_reshape(self._p(), _lib.int64s(shape), len(shape)))

    def flatten(self):
        n = 1
        for d in self.shape:
            n *= d
        return self.reshape([n])

    def transpose(self, permutation):
        return self._new(lib.pe_transpose(self._p(), _lib.int64s(permutation),
                                          len(permutation)))

    def pad(self, low, high, interior=None, value=0.0):
        interior = interior if interior is not None else [0] * len(low)
        return self._new(lib.pe_pad(self._p(), _lib.int64s(low), _lib.int64s(high),
                                    _lib.int64s(interior), float(value)))

    def slice(self, starts, limits, strides=None):
        return self._new(lib.pe_slice(self._p(), _lib.int64s(starts), _lib.int64s(limits),
                                      _lib.int64s(strides)))

    def dynamic_slice(self, starts, sizes):
        arr = (_lib.P * len(starts))(*[t._ptr for t in starts])
        return self._new(lib.pe_dynamic_slice(self._p(), arr, _lib.int64s(sizes)))

    def dynamic_update_slice(self, update, starts):
        arr = (_lib.P * len(starts))(*[t._ptr for t in starts])
        return self._new(lib.pe_dynamic_update_slice(self._p(), update._p(), arr))

    def dot(self, other):
        return self._new(lib.pe_dot(self._p(), other._p()))

    __matmul__ = dot

    def reduce(self, op, dimensions, init=None):
        """XLA reduce over dimensions by op ("sum", "product", "max", "min"), folding in init
        (a scalar tensor) once per result element when given."""
        dims = list(dimensions)
        return self._new(lib.pe_reduce_init(self._p(), init._p() if init is not None else None,
                                            _reduction(op), _lib.int64s(dims), len(dims)))

    def sum(self, dimensions=None):
        dims = range(len(self.shape)) if dimensions is None else dimensions
        return self.reduce("sum", dims)

    # ---- collectives ----
    def all_gather(self, dimension=0, groups=None):
        return self._new(lib.pe_all_gather_groups(self._p(), int(dimension), _groups_ptr(groups)))

    def all_reduce(self, op="sum", scale=1.0, groups=None):
        return self._new(lib.pe_all_reduce(self._p(), _reduction(op), float(scale),
                                           _groups_ptr(groups)))

    def reduce_scatter(self, op="sum", dimension=0, groups=None):
        return self._new(lib.pe_reduce_scatter(self._p(), _reduction(op), int(dimension),
                                               _groups_ptr(groups)))

    def all_to_all(self, split_dimension, concat_dimension, groups=None):
        return self._new(lib.pe_all_to_all(self._p(), int(split_dimension),
                                           int(concat_dimension), _groups_ptr(groups)))

    def collective_permute(self, pairs):
        """pairs: [(source, target), ...]; a core that is no target gets zeros."""
        flat = [v for pair in pairs for v in pair]
        return self._new(lib.pe_collective_permute(self._p(), _lib.int64s(flat), len(pairs)))
