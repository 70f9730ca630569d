import json

import pytest

from utils.atomic_io import atomic_open, atomic_symlink, atomic_write_json


def test_complete_write_appears_under_final_name(tmp_path):
    target = tmp_path / "sub" / "out.json"
    atomic_write_json(target, {"a": [1, 2, 3]})
    assert json.loads(target.read_text()) == {"a": [1, 2, 3]}
    assert [p.name for p in target.parent.iterdir()] == ["out.json"]


def test_crash_mid_write_leaves_old_file_and_no_temp(tmp_path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_open(target, "wb") as handle:
        handle.write(b"new but incomplete")
        raise RuntimeError("simulated crash")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_read_mode_is_refused(tmp_path):
    with pytest.raises(ValueError), atomic_open(tmp_path / "x", "rb"):
        pass


def test_final_file_gets_default_permissions_not_mkstemp_0600(tmp_path):
    import os
    plain = tmp_path / "plain"
    plain.write_bytes(b"x")
    atomic = tmp_path / "atomic"
    atomic_write_json(atomic, [1])
    assert os.stat(atomic).st_mode & 0o777 == os.stat(plain).st_mode & 0o777


def test_symlink_is_replaced_whole_and_a_crashed_temp_link_is_cleared(tmp_path):
    (tmp_path / "step_1").mkdir()
    (tmp_path / "step_2").mkdir()
    (tmp_path / ".best.tmp").symlink_to("step_1")  # left by a crash before the rename
    atomic_symlink("step_1", tmp_path / "best")
    atomic_symlink("step_2", tmp_path / "best")
    assert (tmp_path / "best").readlink().as_posix() == "step_2"  # relative, as given
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best", "step_1", "step_2"]
