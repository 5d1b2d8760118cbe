"""The native chain's buffer plan (edgehft/runtime/arena.py): outputs alive at the same time never share
a buffer; dead ones are reused; the chain's outputs are never overwritten."""
from edgehft.runtime.arena import allocate, buffer_sizes, plan_buffers


def test_a_straight_chain_ping_pongs_two_buffers():
    steps = [(["x"], "a", 100), (["a"], "b", 80), (["b"], "c", 120), (["c"], "d", 50)]
    where = plan_buffers(steps, {"d"})
    assert where == [0, 1, 0, 1]
    assert buffer_sizes(steps, {"d"}) == [120, 80]


def test_branches_alive_together_get_their_own_buffers():
    # an inception block: t feeds three branches, each read by the final concat (a LiteRT segment)
    steps = [(["x"], "t", 64), (["t"], "b1", 64), (["t"], "b2", 64), (["t"], "b3", 64),
             (["b1", "b2", "b3"], None, 0), (["y"], "out", 16)]
    where = plan_buffers(steps, {"out"})
    assert len({where[1], where[2], where[3]}) == 3 and where[0] not in where[1:4]
    assert where[4] is None
    assert where[5] in where[:4]                                  # everything before is dead by then


def test_the_chains_outputs_are_kept():
    steps = [(["x"], "a", 10), (["a"], "y1", 10), (["y1"], "b", 10), (["b"], "y2", 10)]
    where = plan_buffers(steps, {"y1", "y2"})
    assert where[1] not in (where[2], where[3]) and where[3] != where[1]


def test_allocate_aligns():
    for buf, n in zip(allocate([1, 1000, 4096]), [1, 1000, 4096]):
        assert buf.nbytes == n and buf.ctypes.data % 64 == 0 and not buf.any()
