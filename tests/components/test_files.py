"""Atomic writes of the per-round files."""

from __future__ import annotations

import os

import pytest

from comlrl_lightning.files import write_text_atomic


def test_write_text_atomic_replaces_whole_file(tmp_path):
    path = tmp_path / "iteration_0001.json"
    assert write_text_atomic(path, "first é") == path
    write_text_atomic(path, "second")
    assert path.read_text(encoding="utf-8") == "second"
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_failed_write_keeps_old_file_and_leaves_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "iteration_0001.json"
    write_text_atomic(path, "old")

    def broken_replace(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk gone"):
        write_text_atomic(path, "new")
    assert path.read_text(encoding="utf-8") == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]
