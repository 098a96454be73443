"""Resume from a round-boundary checkpoint equals an uninterrupted run (same pairs, same per-step losses)."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from iterative_helpers import StepRecorder, iter_args, make_trainer
from lightning.pytorch.callbacks import ModelCheckpoint


def _args(**kw):
    return iter_args(num_iterations=3, preference_replay_mode="lambda_decay", preference_replay_lambda=0.8,
                     preference_replay_sample_size=6, comparator_policy="history", comparator_history_k=1, **kw)


def _round_files(root):
    return {p.name: json.loads(p.read_text()) for p in sorted((root / "preference_replay").glob("iteration_*.json"))}


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory):
    full_root = tmp_path_factory.mktemp("full")
    full = StepRecorder()
    a = make_trainer(tiny_model_dir, full_root, args=_args(), num_items=4, callbacks=[full])
    a.train()

    root = tmp_path_factory.mktemp("resumed")
    ckpt = ModelCheckpoint(dirpath=str(root / "ckpt"), filename="round-{epoch}", every_n_epochs=1, save_top_k=-1,
                           save_on_train_epoch_end=True)
    first = StepRecorder()
    b = make_trainer(tiny_model_dir, root, args=_args(), num_items=4, callbacks=[first, ckpt],
                     trainer_kwargs={"max_epochs": 2, "enable_checkpointing": True})
    b.train()
    path = root / "ckpt" / "round-epoch=1.ckpt"
    second = StepRecorder()
    c = make_trainer(tiny_model_dir, root, args=_args(), num_items=4, callbacks=[second])
    c.train(ckpt_path=str(path))
    return {"full": full, "first": first, "second": second, "a": a, "c": c, "full_root": full_root, "root": root, "ckpt": path}


def test_resume_gives_the_same_pairs_and_losses(runs):
    full, first, second = runs["full"], runs["first"], runs["second"]
    assert [e for e, _ in full.losses].count(2) > 0
    assert first.losses + second.losses == full.losses  # bit-identical per-step losses
    assert {**first.epoch_pairs, **second.epoch_pairs} == full.epoch_pairs
    assert _round_files(runs["root"]) == _round_files(runs["full_root"])
    for pa, pc in zip(runs["a"].module.parameters(), runs["c"].module.parameters()):
        assert torch.equal(pa, pc)
    assert runs["c"].module.round_index == 2 and runs["c"].module.env_step == runs["a"].module.env_step
    hist_a = runs["a"].collection.history
    assert runs["c"].collection.history == hist_a and len(hist_a) == 3


def test_checkpoint_holds_round_state_as_plain_types(runs):
    ckpt = torch.load(runs["ckpt"], weights_only=False)
    cbs = ckpt["callbacks"]
    assert cbs["IterativePreferenceCollection"]["next_round"] == 3
    assert cbs["ComparatorRefresh"]["next_round"] == 3
    assert set(cbs["HistoryCheckpoint"]["saved"]) == {"initial", "iteration_0000", "iteration_0001"}
    dm = ckpt["IterativePreferenceDataModule"]
    assert isinstance(dm["comparator"]["streams"][0][0], int)  # the comparator belongs to the round data
    assert [s["iteration"] for s in dm["replay"]["shards"]] == [1, 2, 3] and len(dm["pairs"]) == 6
    assert ckpt["comlrl_progress"]["round_index"] == 1


def test_missing_replay_file_on_resume_names_the_file(runs, tiny_model_dir, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(runs["root"], root)
    (root / "preference_replay" / "iteration_0002.json").unlink()
    ckpt = runs["ckpt"]
    c = make_trainer(tiny_model_dir, root, args=_args(), num_items=4)
    with pytest.raises(FileNotFoundError, match="iteration_0002.json"):
        c.train(ckpt_path=str(ckpt))


def test_corrupt_replay_file_on_resume_names_the_file(runs, tiny_model_dir, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(runs["root"], root)
    (root / "preference_replay" / "iteration_0001.json").write_text("{not json")
    c = make_trainer(tiny_model_dir, root, args=_args(), num_items=4)
    with pytest.raises(ValueError, match="iteration_0001.json"):
        c.train(ckpt_path=str(runs["ckpt"]))


def test_copied_run_checks_its_own_snapshots(runs, tiny_model_dir, tmp_path):
    """Issue 14, finding 9: snapshot paths are stored relative to the run, so a copy never uses the original's."""
    state = torch.load(runs["ckpt"], weights_only=False)["callbacks"]["HistoryCheckpoint"]
    assert str(runs["root"]) not in json.dumps(state)
    root = tmp_path / "copy"
    shutil.copytree(runs["root"], root)
    shutil.rmtree(root / "policy_checkpoints" / "initial")
    c = make_trainer(tiny_model_dir, root, args=_args(), num_items=4)
    with pytest.raises(FileNotFoundError, match="HistoryCheckpoint.*" + re.escape(str(root / "policy_checkpoints"))):
        c.train(ckpt_path=str(root / "ckpt" / runs["ckpt"].name))


def test_checkpoint_with_flipped_tensor_bytes_is_refused(runs, tiny_model_dir, tmp_path):
    """Issue 14, finding 9: a checkpoint whose weights changed after saving is an error naming the file."""
    import zipfile

    bad = tmp_path / "flipped.ckpt"
    shutil.copyfile(runs["ckpt"], bad)
    with zipfile.ZipFile(bad) as zf:
        info = max((i for i in zf.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    with open(bad, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
        at = info.header_offset + 30 + name_len + extra_len + info.file_size // 2
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x40]))
    root = tmp_path / "copy"
    shutil.copytree(runs["root"], root)
    c = make_trainer(tiny_model_dir, root, args=_args(), num_items=4)
    with pytest.raises(ValueError, match=re.escape(str(bad)) + ".*corrupt.*state_dict.*sha256"):
        c.train(ckpt_path=str(bad))
    # outside a Trainer too: the intact checkpoint loads, the flipped one does not
    from comlrl_lightning.modules.madpo import MADPOModule

    MADPOModule.load_from_checkpoint(runs["ckpt"], weights_only=False)
    with pytest.raises(ValueError, match="corrupt.*state_dict"):
        MADPOModule.load_from_checkpoint(bad, weights_only=False)
