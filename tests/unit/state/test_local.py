"""state.local: the JSON object or {}, its locked edit, and the file stamp."""

import json
import os
import threading

import pytest

from provisiond.state.local import edited, file_stamp, read_json


def test_read_json_is_an_object_or_nothing(tmp_path):
    path = tmp_path / "doc.json"
    assert read_json(path) == {}
    for damaged in ('{"a": 1', "[1, 2]", "null"):
        path.write_text(damaged)
        assert read_json(path) == {}
    path.write_text('{"a": 1}')
    assert read_json(path) == {"a": 1}


def test_an_edit_is_written_once_at_the_end_with_the_options_given(tmp_path):
    path = tmp_path / "doc.json"
    with edited(path, indent=1, sort_keys=True) as data:
        data["b"] = 1
        data["a"] = [1]
        assert not path.exists()
    assert path.read_text() == json.dumps({"a": [1], "b": 1}, indent=1, sort_keys=True)
    assert (tmp_path / "doc.lock").exists()


def test_an_edit_that_changes_nothing_or_fails_writes_nothing(tmp_path):
    path = tmp_path / "doc.json"
    path.write_text('{"a": 1}')
    before = os.stat(path)
    with edited(path) as data:
        data["a"] = 1
    with pytest.raises(RuntimeError):
        with edited(path) as data:
            data["a"] = 2
            raise RuntimeError("the caller's")
    assert path.read_text() == '{"a": 1}' and os.stat(path).st_ino == before.st_ino


def test_concurrent_edits_lose_no_update(tmp_path):
    path = tmp_path / "count.json"

    def add(times: int) -> None:
        for _ in range(times):
            with edited(path) as data:
                data["n"] = data.get("n", 0) + 1

    threads = [threading.Thread(target=add, args=(50,)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert read_json(path) == {"n": 200}


def test_a_file_replaced_by_rename_has_a_new_stamp_even_with_the_same_mtime(tmp_path):
    path, new = tmp_path / "a", tmp_path / "b"
    assert file_stamp(path) is None and file_stamp(tmp_path / "a" / "x") is None
    path.write_text("one")
    first = file_stamp(path)
    new.write_text("two")
    os.utime(new, ns=(first[0], first[0]))
    os.replace(new, path)
    assert file_stamp(path) != first and file_stamp(path)[0] == first[0]
