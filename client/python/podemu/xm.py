"""torch_xla.core.xla_model on a podemu pod: `from podemu import torch, xm, xmp` in place of
torch_xla's imports runs a torch_xla script unchanged, one thread per core (xmp.spawn) in
lockstep, each printing what its TPU core would print."""

from . import PodemuError, _spmd
from .torch import Tensor, _wrap, device as _device

REDUCE_SUM = "sum"
REDUCE_MUL = "mul"
REDUCE_AND = "and"
REDUCE_OR = "or"
REDUCE_MIN = "min"
REDUCE_MAX = "max"

__all__ = ["xla_device", "xrt_world_size", "get_ordinal", "is_master_ordinal", "mark_step",
           "wait_device_ops",
           "all_gather", "all_reduce", "reduce_scatter", "optimization_barrier_",
           "get_memory_info", "REDUCE_SUM", "REDUCE_MUL", "REDUCE_AND", "REDUCE_OR",
           "REDUCE_MIN", "REDUCE_MAX"]


def xla_device(n=None, devkind=None):
    """This process's core: xla:ORDINAL."""
    return _device(f"xla:{_spmd.ordinal() if n is None else n}")


def xrt_world_size():
    return _spmd.call(lambda: _spmd.pod().world_size)


def get_ordinal():
    return _spmd.ordinal()


def is_master_ordinal(local=True):
    return _spmd.ordinal() == 0


def mark_step():
    """Runs the pending graph on every core."""
    _spmd.call(lambda: _spmd.pod().mark_step())


def wait_device_ops(devices=None):
    """Waits for the steps sent without waiting (Pod.mark_step(wait=False))."""
    _spmd.call(lambda: _spmd.pod().wait_device_ops())


def _groups(groups):
    """torch_xla's groups ([[0, 1], [2, 3]]) as XLA's text, or None for every core."""
    if not groups:
        return None
    text = "{" + ",".join("{" + ",".join(str(int(r)) for r in g) + "}" for g in groups) + "}"
    return _spmd.pod().groups(text)


def all_gather(value, dim=0, groups=None, output=None, pin_layout=True):
    """Gathers value along dim from every core of its group, in ordinal order."""
    result = _wrap(_spmd.call(lambda: value._t.all_gather(dim, _groups(groups))))
    if output is not None:
        output._t = result._t
        return output
    return result


def all_reduce(reduce_type, inputs, scale=1.0, groups=None, pin_layout=True):
    """Reduces over each group and multiplies by scale; a list of tensors is updated in place
    (and returned), one tensor gives a new one, as torch_xla does."""
    many = isinstance(inputs, (list, tuple))
    tensors = list(inputs) if many else [inputs]
    results = _spmd.call(
        lambda: [t._t.all_reduce(reduce_type, scale, _groups(groups)) for t in tensors])
    if not many:
        return _wrap(results[0])
    for t, r in zip(tensors, results):
        t._t = r
    return inputs


def reduce_scatter(reduce_type, input, scale, scatter_dim, shard_count, groups=None,
                   output=None, pin_layout=True):
    """Reduces over each group and keeps this core's shard of scatter_dim."""
    def make():
        r = input._t.reduce_scatter(reduce_type, scatter_dim, _groups(groups))
        if scale != 1.0:
            r = r * float(scale)
        return r
    result = _wrap(_spmd.call(make))
    if shard_count != (len(groups[0]) if groups else xrt_world_size()):
        raise PodemuError(3, f"reduce_scatter: shard_count {shard_count} is not the group "
                             "size")
    if output is not None:
        output._t = result._t
        return output
    return result


def optimization_barrier_(tensors):
    """In place: nothing moves across the barrier."""
    _spmd.call(lambda: _spmd.pod().optimization_barrier([t._t for t in tensors]))


def get_memory_info(device):
    """The core's memory as torch_xla names it: bytes_used, bytes_limit, peak_bytes_used."""
    ordinal = int(str(device).split(":")[1])
    infos = _spmd.call(lambda: _spmd.pod().memory_info())
    info = infos[ordinal]
    return {"bytes_used": info["bytes_used"], "bytes_limit": info["bytes_limit"],
            "peak_bytes_used": info["peak_bytes_used"]}


def wait_device_ops(devices=()):
    """Steps run synchronously on a pod: nothing to wait for."""


Tensor = Tensor
