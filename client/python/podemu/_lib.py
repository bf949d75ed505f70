"""ctypes bindings of libpodemu.so: the C API of client/include/podemu/podemu.h, one to one."""

import ctypes
import ctypes.util
import os

MAX_RANK = 8

c_int64_p = ctypes.POINTER(ctypes.c_int64)


class MemoryInfo(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int if name in ("ordinal", "host") else ctypes.c_int64)
                for name in ("ordinal", "host", "bytes_used", "bytes_limit", "peak_bytes_used",
                             "bytes_in_use", "peak_bytes_in_use", "num_allocs",
                             "largest_alloc_size", "bytes_reserved", "peak_bytes_reserved",
                             "bytes_reservable_limit", "largest_free_block_bytes")]


class StepPlan(ctypes.Structure):
    _fields_ = [("argument_bytes", ctypes.c_int64), ("output_bytes", ctypes.c_int64),
                ("temp_bytes", ctypes.c_int64), ("peak_bytes", ctypes.c_int64),
                ("bytes_limit", ctypes.c_int64), ("fits", ctypes.c_int),
                ("oom_message", ctypes.c_char * 1024), ("combined_collectives", ctypes.c_int),
                ("delayed_nodes", ctypes.c_int), ("fused_nodes", ctypes.c_int),
                ("program_cache_hit", ctypes.c_int), ("receive_bytes", ctypes.c_int64)]


class CompileOptions(ctypes.Structure):
    _fields_ = [("topology", ctypes.c_char_p), ("layout_none", ctypes.c_int),
                ("all_gather_strategy", ctypes.c_char_p), ("no_alias", ctypes.c_int),
                ("name", ctypes.c_char_p)]


def _candidates():
    """Where libpodemu.so may be: $PODEMU_LIBRARY, beside the package as the build or the
    install placed it (_where.py), then the system's library path."""
    env = os.environ.get("PODEMU_LIBRARY")
    if env:
        yield env
    try:
        from . import _where
        here = os.path.dirname(os.path.abspath(__file__))
        yield os.path.normpath(os.path.join(here, _where.LIBRARY))
    except ImportError:
        pass
    found = ctypes.util.find_library("podemu")
    if found:
        yield found


def _load():
    errors = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            errors.append(str(e))
    raise OSError("libpodemu.so not found (set PODEMU_LIBRARY to its path): " +
                  "; ".join(errors))


lib = _load()

P = ctypes.c_void_p  # pe_client *, pe_tensor *, pe_groups *


def _declare(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)


_declare("pe_connect", ctypes.c_int, ctypes.POINTER(P), ctypes.c_char_p)
_declare("pe_connect_error", ctypes.c_char_p)
_declare("pe_disconnect", None, P)
_declare("pe_last_error", ctypes.c_char_p, P)
_declare("pe_last_code", ctypes.c_int, P)
_declare("pe_world_size", ctypes.c_int, P)
_declare("pe_num_hosts", ctypes.c_int, P)
_declare("pe_topology", ctypes.c_char_p, P)
_declare("pe_wait_ready", ctypes.c_int, P, ctypes.c_int)
_declare("pe_full", P, P, ctypes.c_int, c_int64_p, ctypes.c_int, ctypes.c_double)
_declare("pe_iota", P, P, ctypes.c_int, c_int64_p, ctypes.c_int, ctypes.c_int)
_declare("pe_replica_id", P, P)
_declare("pe_partition_id", P, P)
_declare("pe_upload_layout", P, P, ctypes.c_int, c_int64_p, ctypes.c_int, ctypes.c_char_p,
         ctypes.POINTER(ctypes.c_void_p))
_declare("pe_set_layout", ctypes.c_int, P, ctypes.c_char_p)
for _name in ("add", "subtract", "multiply", "maximum", "minimum", "divide", "and", "or",
              "dot"):
    _declare("pe_" + _name, P, P, P)
for _name in ("negate", "not", "abs", "exponential", "log", "tanh", "sqrt", "rsqrt"):
    _declare("pe_" + _name, P, P)
_declare("pe_convert", P, P, ctypes.c_int)
_declare("pe_compare", P, P, P, ctypes.c_char_p)
_declare("pe_select", P, P, P, P)
_declare("pe_broadcast", P, P, c_int64_p, ctypes.c_int, c_int64_p)
_declare("pe_dynamic_slice", P, P, ctypes.POINTER(P), c_int64_p)
_declare("pe_dynamic_update_slice", P, P, P, ctypes.POINTER(P))
_declare("pe_transpose", P, P, c_int64_p, ctypes.c_int)
_declare("pe_opaque", P, P, ctypes.c_char_p, ctypes.c_int, c_int64_p, ctypes.c_int,
         ctypes.POINTER(P), ctypes.c_int)
_declare("pe_reshape", P, P, c_int64_p, ctypes.c_int)
_declare("pe_opaque_tuple", ctypes.c_int, P, ctypes.c_char_p, ctypes.c_int,
         ctypes.POINTER(ctypes.c_int), ctypes.POINTER(c_int64_p), ctypes.POINTER(ctypes.c_int),
         ctypes.POINTER(P), ctypes.c_int, ctypes.POINTER(P))
_declare("pe_last_step_scratch_bytes", ctypes.c_int64, P, ctypes.c_int)
_declare("pe_last_step_collectives_span", ctypes.c_int64, P, ctypes.c_int, ctypes.c_int)
_declare("pe_backing", ctypes.c_char_p, P)
_declare("pe_pad", P, P, c_int64_p, c_int64_p, c_int64_p, ctypes.c_double)
_declare("pe_slice", P, P, c_int64_p, c_int64_p, c_int64_p)
_declare("pe_concatenate", P, ctypes.POINTER(P), ctypes.c_int, ctypes.c_int)
_declare("pe_reduce_init", P, P, P, ctypes.c_int, c_int64_p, ctypes.c_int)
_declare("pe_optimization_barrier", ctypes.c_int, ctypes.POINTER(P), ctypes.c_int)
_declare("pe_groups_parse", P, P, ctypes.c_char_p)
_declare("pe_set_mesh", ctypes.c_int, P, ctypes.c_char_p)
_declare("pe_groups_axis", P, P, ctypes.c_char_p)
_declare("pe_all_gather_groups", P, P, ctypes.c_int, P)
_declare("pe_all_reduce", P, P, ctypes.c_int, ctypes.c_double, P)
_declare("pe_reduce_scatter", P, P, ctypes.c_int, ctypes.c_int, P)
_declare("pe_all_to_all", P, P, ctypes.c_int, ctypes.c_int, P)
_declare("pe_collective_permute", P, P, c_int64_p, ctypes.c_int)
_declare("pe_last_step_collectives", ctypes.c_int, P, c_int64_p,
         ctypes.POINTER(ctypes.c_char_p), ctypes.c_int)
_declare("pe_mark_step", ctypes.c_int, P)
_declare("pe_mark_step_async", ctypes.c_int, P)
_declare("pe_wait_device_ops", ctypes.c_int, P)
_declare("pe_plan_step", ctypes.c_int, P, ctypes.POINTER(StepPlan))
_declare("pe_fetch", ctypes.c_int, P, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)
_declare("pe_release", None, P)
_declare("pe_tensor_shape", ctypes.c_int, P, ctypes.POINTER(ctypes.c_int), c_int64_p,
         ctypes.POINTER(ctypes.c_int))
_declare("pe_tensor_bytes", ctypes.c_int64, P)
_declare("pe_memory_info_get", ctypes.c_int, P, ctypes.c_int, ctypes.POINTER(MemoryInfo))
_declare("pe_memory_info_all", ctypes.c_int, P, ctypes.POINTER(MemoryInfo), ctypes.c_int)
_declare("pe_code_name", ctypes.c_char_p, ctypes.c_int)
# Control flow: computations recorded by callbacks.
COND_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                           ctypes.c_void_p)
COMPUTATION_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                                  ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                  ctypes.c_int)
_declare("pe_while_loop", ctypes.c_int, ctypes.POINTER(P), ctypes.c_int, COND_FN,
         COMPUTATION_FN, ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(P))
_declare("pe_call", ctypes.c_int, ctypes.POINTER(P), ctypes.c_int, COMPUTATION_FN,
         ctypes.c_void_p, ctypes.POINTER(P), ctypes.c_int)
_declare("pe_conditional", ctypes.c_int, P, ctypes.c_int,
         ctypes.POINTER(ctypes.POINTER(P)), ctypes.POINTER(ctypes.c_int),
         ctypes.POINTER(COMPUTATION_FN), ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(P),
         ctypes.c_int)
_declare("pe_compile_hlo", ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t,
         ctypes.POINTER(CompileOptions), ctypes.POINTER(ctypes.c_void_p))
_declare("pe_free", None, ctypes.c_void_p)


def int64s(values):
    """A C array of int64 (None stays NULL)."""
    if values is None:
        return None
    values = [int(v) for v in values]
    return (ctypes.c_int64 * max(len(values), 1))(*values)
