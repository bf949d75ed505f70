# pytorch/xla issue 3510, as its author wrote it for a TPU v3-8, with the imports changed to
# podemu's (the three torch/torch_xla import lines become one). ELEMENTS overrides the total
# size (1024**3 f32, 4 GiB gathered per core) so that a test can run it with real bytes.
import os

from podemu import torch, xm, xmp

ELEMENTS = int(os.environ.get("ELEMENTS", 1024**3))


def _mp_fn(index):
    device = xm.xla_device()
    world_size = xm.xrt_world_size()

    t1 = torch.ones(ELEMENTS // world_size, device=device)
    xm.mark_step()
    print(f"[{index}] t1.sum(): {t1.sum()}", flush=True)
    print(f"[{index}] memory after t1: {xm.get_memory_info(device)}", flush=True)

    t2 = xm.all_gather(t1).flatten()
    del t1
    xm.mark_step()
    print(f"[{index}] t2.sum(): {t2.sum()}", flush=True)
    print(f"[{index}] memory after t2: {xm.get_memory_info(device)}", flush=True)


if __name__ == "__main__":
    xmp.spawn(_mp_fn, args=(), nprocs=8)
