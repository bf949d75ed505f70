"""torch_xla.distributed.xla_multiprocessing: spawn runs fn(index, *args) once per core, as
threads in lockstep (see _spmd.py)."""

from . import _spmd


def spawn(fn, args=(), nprocs=None, join=True, daemon=False, start_method="spawn"):
    world = _spmd.pod().world_size
    if nprocs not in (None, 1, world):
        raise ValueError(f"nprocs must be 1 or the pod's {world} cores, not {nprocs}")
    if nprocs == 1:
        return fn(0, *args)
    _spmd.spawn(fn, tuple(args), world)
