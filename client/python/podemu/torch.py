"""The few torch names a torch_xla script uses to make and read tensors, over podemu tensors
(each thread of xmp.spawn sees its own core's value)."""

from . import PodemuError, _spmd

float32 = "f32"
bfloat16 = "bf16"
int32 = "s32"
uint8 = "u8"
bool = "pred"  # noqa: A001 (torch's name)


class device(str):
    """torch.device('xla:K')."""

    @property
    def type(self):
        return self.split(":")[0]

    @property
    def index(self):
        return int(self.split(":")[1])


def _size(size):
    if len(size) == 1 and isinstance(size[0], (list, tuple)):
        return [int(d) for d in size[0]]
    return [int(d) for d in size]


def _wrap(t):
    return Tensor(t, _spmd.ordinal())


def full(size, fill_value, dtype=None, device=None):
    return _wrap(_spmd.call(lambda: _spmd.pod().full(_size([size]), fill_value,
                                                      dtype or float32)))


def ones(*size, dtype=None, device=None):
    return _wrap(_spmd.call(lambda: _spmd.pod().full(_size(size), 1.0, dtype or float32)))


def zeros(*size, dtype=None, device=None):
    return _wrap(_spmd.call(lambda: _spmd.pod().full(_size(size), 0.0, dtype or float32)))


def arange(n, dtype=None, device=None):
    return _wrap(_spmd.call(lambda: _spmd.pod().iota([int(n)], 0, dtype or float32)))


def _scalar_text(v, dtype):
    if dtype in ("s32", "u8", "u32"):
        return str(int(v))
    if dtype == "pred":
        return "True" if v else "False"
    a = abs(float(v))
    if a != 0 and (a >= 1e8 or a < 1e-4):
        return f"{float(v):.4e}"
    if float(v).is_integer():
        return f"{int(v)}."
    return f"{float(v):.4f}"


class Tensor:
    """A core's view of a pod tensor (podemu.Tensor): operations record for every core."""

    def __init__(self, t, ordinal):
        self._t, self._ordinal = t, ordinal

    @property
    def device(self):
        return device(f"xla:{self._ordinal}")

    @property
    def shape(self):
        return tuple(self._t.shape)

    def size(self, dim=None):
        return self.shape if dim is None else self.shape[dim]

    def numel(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    def dim(self):
        return len(self.shape)

    @property
    def dtype(self):
        return self._t.dtype

    def _op(self, fn):
        return _wrap(_spmd.call(fn))

    def _other(self, other):
        return other._t if isinstance(other, Tensor) else other

    def __add__(self, other):
        return self._op(lambda: self._t + self._other(other))

    def __sub__(self, other):
        return self._op(lambda: self._t - self._other(other))

    def __mul__(self, other):
        return self._op(lambda: self._t * self._other(other))

    def __truediv__(self, other):
        return self._op(lambda: self._t / self._other(other))

    def __neg__(self):
        return self._op(lambda: -self._t)

    __radd__ = __add__
    __rmul__ = __mul__

    def sum(self, dim=None):
        dims = None if dim is None else ([dim] if isinstance(dim, int) else list(dim))
        return self._op(lambda: self._t.sum(dims))

    def flatten(self):
        return self.reshape(self.numel())

    def reshape(self, *shape):
        """As torch: a view when nothing changes (flatten of a 1-D tensor records nothing)."""
        shape = _size(shape)
        if tuple(shape) == self.shape:
            return Tensor(self._t, self._ordinal)
        return self._op(lambda: self._t.reshape(shape))

    view = reshape

    def to(self, *args, **kwargs):
        return self

    def _value(self):
        """This core's value (every thread fetches its own core's part of one call); None on
        a pod without bytes (--backing none)."""
        def fetch():
            try:
                return self._t.numpy()
            except PodemuError as e:
                if e.code != "FAILED_PRECONDITION":
                    raise
                self._t.pod.mark_step()  # what the fetch would have run
                return None
        values = _spmd.call(fetch)
        return None if values is None else values[self._ordinal]

    def cpu(self):
        return self._value()

    def numpy(self):
        return self._value()

    def item(self):
        return self._value().item()

    def __format__(self, spec):
        return str(self)

    def __repr__(self):
        v = self._value()
        if v is None:
            text = "<no bytes: the pod runs with --backing none>"
        elif v.ndim == 0:
            text = _scalar_text(v.item(), self.dtype)
        else:
            import numpy as np
            text = np.array2string(v, separator=", ", precision=4, threshold=6)
        return f"tensor({text}, device='{self.device}')"

    __str__ = __repr__
