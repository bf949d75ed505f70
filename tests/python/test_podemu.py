"""The plain API against a real pod: values per core, collectives over groups and meshes,
plans, memory, errors with their codes and XLA's words, and the offline compiler."""

import os

import numpy as np
import pytest

import podemu

HLO = os.path.join(os.path.dirname(__file__), "..", "hlo")


@pytest.fixture
def pod(host_pod):
    p = host_pod.connect()
    yield p
    p.close()


def test_connection(pod):
    assert pod.world_size == 8 and pod.num_hosts == 2 and pod.backing == "host"
    pod.wait_ready(5)


def test_elementwise_and_reduce_values(pod):
    x = pod.iota([4, 8], dimension=1)                    # each row 0..7
    y = (x * 2.0 + 1.0).exp().log()                      # 2x + 1
    s = y.sum([1])
    m = x.reduce("max", [1], init=pod.full([], 100.0))   # XLA's init folds in
    pod.mark_step()
    for core in range(pod.world_size):
        np.testing.assert_allclose(s.fetch(core), [64.0] * 4, rtol=1e-5)
        np.testing.assert_array_equal(m.fetch(core), [100.0] * 4)
    assert s.shape == (4,) and s.dtype == "f32"


def test_steps_without_waiting(pod):
    w = pod.full([16], 1.0)
    pod.mark_step()
    for _ in range(10):
        nxt = w + 1.0
        w.release()
        w = nxt
        pod.mark_step(wait=False)
    pod.wait_device_ops()
    for core in range(pod.world_size):
        np.testing.assert_array_equal(w.fetch(core), [11.0] * 16)


def test_upload_per_core_and_collectives(pod):
    n = pod.world_size
    data = [np.full([2, 3], float(k), np.float32) for k in range(n)]
    x = pod.upload(data)
    g = x.all_gather(0)
    r = x.all_reduce("sum", scale=0.5)
    rs = pod.iota([8, 2], dimension=0).reduce_scatter("sum", 0)
    pairs = x.collective_permute([(k, (k + 1) % n) for k in range(n)])
    pod.mark_step()
    for core in range(n):
        assert g.fetch(core).shape == (2 * n, 3)
        np.testing.assert_array_equal(g.fetch(core)[::2, 0], np.arange(n))
        np.testing.assert_allclose(r.fetch(core), np.full([2, 3], 0.5 * sum(range(n))))
        np.testing.assert_array_equal(rs.fetch(core), [[8.0 * core] * 2])
        np.testing.assert_array_equal(pairs.fetch(core), data[(core - 1) % n])
    colls = pod.last_step_collectives()  # per collective: time, algorithm, scratch
    assert len(colls) == 4 and all(a for _, a, _ in colls), colls
    assert any(scratch > 0 for _, _, scratch in colls), colls  # the reducing ones
    span = pod.last_step_collectives_span(0, 3)  # the four on the slowest core
    assert span >= max(t for t, _, _ in colls), (span, colls)
    assert pod.last_step_collectives_span(2, 2) == colls[2][0]
    with pytest.raises(IndexError):
        pod.last_step_collectives_span(3, 4)


def test_groups_and_mesh(pod):
    x = pod.replica_id().convert("f32").reshape([1])
    halves = x.all_reduce("sum", groups=pod.groups("{{0,1,2,3},{4,5,6,7}}"))
    pod.set_mesh("data=4,model=2")
    model = x.all_gather(0, groups=pod.mesh_axis("model"))
    pod.mark_step()
    assert halves.fetch(0)[0] == 6 and halves.fetch(7)[0] == 22
    np.testing.assert_array_equal(model.fetch(5), [4.0, 5.0])


def test_bf16_rounds_to_nearest_even(pod):
    x = pod.upload(np.array([1.0, 1.00390625, 1.01171875, -2.5], np.float32), dtype="bf16")
    np.testing.assert_array_equal(x.fetch(3), [1.0, 1.0, 1.015625, -2.5])


def test_plan_step_and_memory(pod):
    before = pod.memory_info(0)
    x = pod.full([1024, 256], 1.0)
    plan = pod.plan_step()
    assert plan["fits"] and plan["output_bytes"] == 1024 * 256 * 4
    assert plan["bytes_limit"] == before["bytes_limit"]
    pod.mark_step()
    after = pod.memory_info()
    assert len(after) == 8
    assert after[3]["bytes_used"] == before["bytes_used"] + 1024 * 256 * 4
    del x
    assert pod.memory_info(3)["bytes_used"] == before["bytes_used"]


def test_errors_carry_code_and_xla_text(pod):
    with pytest.raises(podemu.PodemuError) as e:
        pod.full([4], 1.0) + pod.full([5], 1.0)
    assert e.value.code == "INVALID_ARGUMENT"
    assert "Binary op add with incompatible shapes: f32[4] and f32[5]" in str(e.value)
    big = pod.full([1024, 1024, 128], 1.0)  # 512 MiB on 256 MiB cores
    with pytest.raises(podemu.PodemuError) as e:
        pod.mark_step()
    assert e.value.code == "RESOURCE_EXHAUSTED"
    assert "Ran out of memory in memory space hbm" in e.value.message
    del big
    with pytest.raises(ValueError):
        pod.full([2], dtype="f64")


def test_opaque_tuple_is_planned(pod):
    a, b = pod.opaque_tuple("MyKernel", [[256], [1024]], [pod.full([256], 1.0)])
    assert a.shape == (256,) and b.shape == (1024,)
    plan = pod.plan_step()
    assert plan["output_bytes"] >= (256 + 1024) * 4, plan
    with pytest.raises(podemu.PodemuError) as e:  # a pod with bytes has no kernel for it
        pod.mark_step()
    assert e.value.code == "UNIMPLEMENTED"


def test_compile_hlo():
    r = podemu.compile_hlo(os.path.join(HLO, "seed.hlo"), topology="v3-8")
    assert r["cores"][0]["peak_bytes"] == 4831838208 and r["cores"][0]["fits"]
    r = podemu.compile_hlo(os.path.join(HLO, "padding.hlo"), layout="none")
    assert r["cores"][0]["peak_bytes"] > 0
    with pytest.raises(podemu.PodemuError) as e:
        podemu.compile_hlo(os.path.join(HLO, "bad-groups.hlo"))
    assert e.value.code == "INVALID_ARGUMENT" and "Replica 3 is repeated" in e.value.message


def test_control_flow(pod):
    """while_loop, call and conditional record computations from Python functions."""
    x0 = pod.iota([8])
    i0 = pod.full([], 0, dtype="s32")
    x, i = pod.while_loop(lambda x, i: i.compare(pod.full([], 3, dtype="s32"), "LT"),
                          lambda x, i: (x * 2.0, i + pod.full([], 1, dtype="s32")),
                          [x0, i0], known_trip_count=3)
    (neg,) = pod.call(lambda v: -v, [x])
    first = pod.replica_id().compare(pod.full([], 1, dtype="u32"), "LT")
    (picked,) = pod.conditional(first, [(lambda v: v * 10.0, [x]), (lambda v: -v, [x])])
    pod.mark_step()
    for core in range(pod.world_size):
        np.testing.assert_array_equal(x.fetch(core), 8.0 * np.arange(8))
        assert i.fetch(core) == 3
        np.testing.assert_array_equal(neg.fetch(core), -8.0 * np.arange(8))
        want = 80.0 * np.arange(8) if core == 0 else -8.0 * np.arange(8)
        np.testing.assert_array_equal(picked.fetch(core), want)
    # A tensor from outside a computation is refused, with the library's words.
    with pytest.raises(podemu.PodemuError) as e:
        pod.while_loop(lambda x, i: i.compare(i, "LT"), lambda x, i: (x0, i), [x0, i0])
    assert "outside the computation" in e.value.message
    # An exception in a function comes back as itself.
    with pytest.raises(ZeroDivisionError):
        pod.call(lambda v: 1 / 0, [x])
