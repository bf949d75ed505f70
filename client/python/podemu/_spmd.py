"""Processes of a TPU VM as threads of one client: torch_xla runs one process per core
(xmp.spawn), each recording the same program. podemu's client records once for every core, so
the threads run in lockstep: the thread of ordinal 0 makes each call on the pod, the others
wait for it and take the same result (or their own core's part of it)."""

import sys
import threading

from . import Pod

_local = threading.local()
_lock = threading.Lock()
_pod = None


def pod():
    """The pod every thread shares (connected on first use)."""
    global _pod
    with _lock:
        if _pod is None:
            _pod = Pod()
        return _pod


def ordinal():
    return getattr(_local, "ordinal", 0)


class _Lockstep:
    """Each call is a barrier: ordinal 0 makes it once every thread has reached it (so that
    what the others dropped before, a `del t1`, is gone), then every thread takes the result."""

    def __init__(self, n):
        self.n = n
        self.cond = threading.Condition()
        self.arrived = {}  # sequence number -> threads that reached it
        self.results = {}  # sequence number -> [outcome, value, threads yet to take it]
        self.failed = None

    def _wait(self, ready, seq):
        self.cond.wait_for(lambda: ready() or self.failed is not None)
        if not ready():
            raise RuntimeError(f"call {seq} of the program was not reached by every core: "
                               f"{self.failed}")

    def call(self, seq, me, fn):
        with self.cond:
            self.arrived[seq] = self.arrived.get(seq, 0) + 1
            self.cond.notify_all()
            if me == 0:
                self._wait(lambda: self.arrived[seq] == self.n, seq)
                del self.arrived[seq]
                self.cond.release()
                try:
                    outcome = (True, fn())
                except BaseException as e:  # every thread raises what ordinal 0 raised
                    outcome = (False, e)
                finally:
                    self.cond.acquire()
                self.results[seq] = [outcome[0], outcome[1], self.n]
                self.cond.notify_all()
            else:
                self._wait(lambda: seq in self.results, seq)
            entry = self.results[seq]
            entry[2] -= 1
            if entry[2] == 0:  # everyone has it: the value may go (del frees device memory)
                del self.results[seq]
            ok, value = entry[0], entry[1]
        if not ok:
            raise value
        return value

    def stop(self, why):
        with self.cond:
            self.failed = why
            self.cond.notify_all()


class _Lines:
    """stdout for the threads of a spawn: each line written whole, as processes' lines are."""

    def __init__(self, out):
        self.out, self.lock = out, threading.Lock()

    def write(self, text):
        buf = getattr(_local, "line", "") + text
        *lines, _local.line = buf.split("\n")
        if lines:
            with self.lock:
                self.out.write("".join(line + "\n" for line in lines))
                self.out.flush()
        return len(text)

    def flush(self):
        pass

    def __getattr__(self, name):
        return getattr(self.out, name)


def call(fn):
    """fn() made once for all the threads of a spawn (by ordinal 0), else at once."""
    step = getattr(_local, "lockstep", None)
    if step is None:
        return fn()
    seq = _local.seq
    _local.seq += 1
    return step.call(seq, _local.ordinal, fn)


def spawn(fn, args, n):
    """Runs fn(index, *args) on n threads in lockstep; re-raises the first failure."""
    step = _Lockstep(n)
    errors = [None] * n

    def run(index):
        _local.ordinal, _local.lockstep, _local.seq = index, step, 0
        try:
            fn(index, *args)
            if getattr(_local, "line", ""):
                print()  # what is left of its last line
        except BaseException as e:
            errors[index] = e
            step.stop(repr(e))
        finally:
            _local.lockstep = None
            if index == 0:  # nothing more will come for the others
                step.stop("it returned")

    threads = [threading.Thread(target=run, args=(k,), name=f"xla:{k}") for k in range(n)]
    out, sys.stdout = sys.stdout, _Lines(sys.stdout)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.stdout = out
    for e in errors:
        if e is not None:
            raise e
