"""The task and pair loaders (issue 31 items 3 and 4): shuffles that depend only on (seed, epoch) whenever the loader
is built, a position that a checkpoint saves and a resumed loader continues from, and what is refused or warned."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from comlrl_lightning.data.madpo import pair_loader
from comlrl_lightning.data.task import ResumableLoader, task_loader
from comlrl_lightning.modules.checkpoint_seal import warn_unresumable_position

ITEMS = [{"prompt": f"item {i}"} for i in range(10)]


def _trainer(epoch: int = 0, per_step: int = 3):
    module = SimpleNamespace(items_per_step=lambda: per_step, args=SimpleNamespace(generation_batch_size=None))
    return SimpleNamespace(current_epoch=epoch, lightning_module=module)


def _tasks(trainer, shuffle=True, seed=5) -> ResumableLoader:
    return task_loader(ITEMS, shuffle, seed, trainer)


def _pairs(trainer, seed=5) -> ResumableLoader:
    return pair_loader(list(range(10)), 3, seed, trainer, lambda batch: list(batch))


def _epoch(loader) -> list[int]:
    return [i for batch in loader for i, _ in batch]


@pytest.mark.parametrize("make", [_tasks, _pairs], ids=["task", "pair"])
def test_shuffle_depends_only_on_seed_and_epoch_whenever_the_loader_is_built(make):
    trainer = _trainer()
    kept = make(trainer)  # built once at epoch 0, iterated every epoch (no reload)
    orders = []
    for epoch in range(3):
        trainer.current_epoch = epoch
        once, again = _epoch(kept), _epoch(kept)
        fresh = _epoch(make(_trainer(epoch)))  # built at this epoch (a resumed run, or a reload)
        assert once == again == fresh
        assert sorted(once) == list(range(10))
        orders.append(once)
    assert len({tuple(o) for o in orders}) == 3  # each epoch its own permutation
    assert _epoch(make(_trainer(1), seed=6)) != orders[1]


def test_unshuffled_task_loader_keeps_the_dataset_order():
    assert _epoch(_tasks(_trainer(2), shuffle=False)) == list(range(10))


@pytest.mark.parametrize("make", [_tasks, _pairs], ids=["task", "pair"])
def test_a_saved_position_resumes_at_the_next_batch_of_the_same_epoch_only(make):
    trainer = _trainer(1)
    loader = make(trainer)
    full = list(loader)
    it = iter(loader)
    served = [next(it), next(it)]
    state = loader.state_dict()
    assert state["epoch"] == 1 and state["batches"] == 2 and state["batch_size"] == 3 and state["num_items"] == 10
    assert all(isinstance(v, (int, str)) for v in state.values())  # plain types: checkpoints load weights_only

    resumed = make(_trainer(1))
    resumed.load_state_dict(state)
    assert served + list(resumed) == full
    assert list(resumed) == full  # the position applies once; the next iteration is a whole epoch

    later = make(_trainer(2))
    later.load_state_dict(state)  # an end-of-epoch checkpoint resumes in the next epoch: nothing skipped
    assert len(list(later)) == len(full)


def test_a_position_of_another_batch_size_or_dataset_is_refused_naming_both():
    state = _tasks(_trainer(0, per_step=3)).state_dict()
    with pytest.raises(ValueError, match=r"batch_size 3 \(this run: 2\).*end-of-epoch checkpoint"):
        _tasks(_trainer(0, per_step=2)).load_state_dict(state)
    with pytest.raises(ValueError, match=r"kind 'task' \(this run: 'pair'\)"):
        _pairs(_trainer(0)).load_state_dict(state)


def _checkpoint(ready: int, last: bool, loader_state: list | None) -> dict:
    fit = {"epoch_loop.batch_progress": {"current": {"ready": ready}, "is_last_batch": last},
           "epoch_progress": {"current": {"started": 1, "processed": 0}}, "state_dict": {}}
    if loader_state is not None:
        fit["state_dict"]["combined_loader"] = loader_state
    return {"loops": {"fit_loop": fit}}


def test_a_mid_epoch_checkpoint_without_a_loader_position_warns_naming_the_checkpoint_to_use():
    with pytest.warns(UserWarning, match=r"run.ckpt was taken 2 batches into an epoch.*every_n_epochs=1"):
        warn_unresumable_position(_checkpoint(2, False, None), "run.ckpt")


def test_no_warning_with_a_loader_position_or_at_an_epoch_end(recwarn):
    warn_unresumable_position(_checkpoint(2, False, [{"kind": "task", "epoch": 0, "batches": 2}]))
    warn_unresumable_position(_checkpoint(4, True, None))
    warn_unresumable_position({})
    assert not [w for w in recwarn if "position" in str(w.message)]
