"""The data order contract: one permutation per (seed, epoch), global batch s = the next G indices of it, cut among
replicas by replica index and among micro steps by GA index; and the resume checks on a checkpoint's position."""
from __future__ import annotations

import numpy as np
import pytest

from podrun.train.data import Shard, epoch_permutation, position, step_indices
from podrun.train.save import ResumeError, position_of, resume_step

N, G = 1438, 24                     # digits' training split; a global batch 4, 3 and 2 replicas divide


def _global_batch(perm, step, replicas, local_batch, grad_accum):
    """Every replica's micro batches of ``step``, in the fixed layout: replica-major, then GA index."""
    out = []
    for r in range(replicas):
        shard = Shard(local_batch=local_batch, grad_accum=grad_accum, replicas=replicas, replica_offset=r)
        micro = step_indices(perm, step, shard)
        assert len(micro) == grad_accum and all(len(m) == local_batch for m in micro)
        out += [i for m in micro for i in m.tolist()]
    return out


@pytest.mark.parametrize("replicas,local_batch,grad_accum", [(4, 6, 1), (3, 8, 1), (3, 4, 2), (2, 3, 4), (1, 24, 1)])
def test_every_decomposition_sees_the_same_global_batches(replicas, local_batch, grad_accum):
    for epoch in (0, 3):
        perm = epoch_permutation(N, seed=5, epoch=epoch)
        for step in (0, 1, N // G - 1):
            got = _global_batch(perm, step, replicas, local_batch, grad_accum)
            assert got == perm[step * G:(step + 1) * G].tolist()


def test_the_permutation_depends_on_the_seed_and_the_epoch_only():
    assert (epoch_permutation(N, 5, 2) == epoch_permutation(N, 5, 2)).all()
    assert not (epoch_permutation(N, 5, 2) == epoch_permutation(N, 5, 3)).all()
    assert not (epoch_permutation(N, 6, 2) == epoch_permutation(N, 5, 2)).all()
    assert sorted(epoch_permutation(N, 5, 2).tolist()) == list(range(N))


def test_position_in_global_samples():
    spe = N // G                                   # 59 global batches an epoch, the rest dropped
    assert position(0, G, N) == (0, 0)
    assert position(5 * G, G, N) == (0, 5)
    assert position(spe * G, G, N) == (1, 0)
    assert position((2 * spe + 3) * G, G, N) == (2, 3)
    with pytest.raises(ValueError, match="not on a boundary"):
        position(G + 1, G, N)


def _state(**kw):
    return {"format": 2, "samples": 10 * G, "step": 10, "global_batch": G, "seed": 5, "train_size": N, **kw}


def test_resume_step_continues_any_split_of_the_same_global_batch():
    assert resume_step("c.pt", _state(), global_batch=G, seed=5, train_size=N) == 10
    # a format-1 checkpoint (step and global batch only) is read as step x global batch samples
    assert position_of({"step": 7, "global_batch": G}) == (7 * G, G)
    assert resume_step("c.pt", {"step": 7, "global_batch": G}, global_batch=G, seed=5, train_size=N) == 7


@pytest.mark.parametrize("state,message", [
    (_state(global_batch=48, samples=480), "saved at global batch 48 after 480 samples; this run uses global batch 24"),
    (_state(samples=10 * G + 6), "position 246 samples is not on a boundary of global batch 24"),
    (_state(seed=6), "saved with seed 6, this run has 5"),
    (_state(train_size=1000), "saved with training set size 1000, this run has 1438"),
])
def test_a_resume_that_cannot_continue_the_sequence_is_refused(state, message):
    with pytest.raises(ResumeError) as err:
        resume_step("/ck/ckpt-000000010.pt", state, global_batch=G, seed=5, train_size=N)
    assert message in err.value.message and err.value.message.startswith("/ck/ckpt-000000010.pt: ")
    assert err.value.exit_code == 2 and "--no-resume" in err.value.hint


def test_layout_is_fixed_replica_major_then_ga():
    perm = np.arange(G)
    shard = Shard(local_batch=3, grad_accum=2, replicas=4, replica_offset=2)
    assert [m.tolist() for m in step_indices(perm, 0, shard)] == [[12, 13, 14], [15, 16, 17]]
