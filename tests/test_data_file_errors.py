"""A broken local data file is named with the line (counted from 1) where it breaks, at load time."""
from __future__ import annotations

import gzip
import re

import pytest

from draftheads.data.load import load_source

GOOD = b'{"text": "def f(self): return 1"}\n'


def load(path, tmp_path):
    return load_source(str(path), cache_dir=str(tmp_path / "cache"))


def test_malformed_jsonl_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(GOOD + b"\n" + GOOD + b'{"text": broken}\n' + GOOD)
    with pytest.raises(ValueError, match=re.escape(f"{path}: line 4 is not valid JSON: Expecting value")):
        load(path, tmp_path)


def test_jsonl_line_that_is_not_an_object_is_named(tmp_path):
    path = tmp_path / "list.jsonl"
    path.write_bytes(GOOD + b'["text", "x"]\n')
    with pytest.raises(ValueError, match=re.escape(f"{path}: line 2 is a JSON list, expected an object")):
        load(path, tmp_path)


def test_malformed_json_document_names_line_and_column(tmp_path):
    path = tmp_path / "rows.json"
    path.write_bytes(b'[\n  {"text": "a"},\n  {"text": "b"}\n  {"text": "c"}\n]\n')
    with pytest.raises(ValueError, match=re.escape(f"{path}: line 4, column 3: not valid JSON")):
        load(path, tmp_path)


@pytest.mark.parametrize("name", ["latin.jsonl", "latin.jsonl.gz"])
def test_non_utf8_byte_names_file_and_row(tmp_path, name):
    """pyarrow loads such a file; it used to fail later, inside tokenization, with no file or row."""
    path = tmp_path / name
    data = GOOD + GOOD + '{"text": "café"}\n'.encode("latin-1") + GOOD
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    with pytest.raises(ValueError, match=re.escape(f"{path}: line 3 is not valid UTF-8 (byte 0xe9")):
        load(path, tmp_path)


def test_the_broken_file_of_a_folder_is_the_one_named(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "a.jsonl").write_bytes(GOOD * 3)
    (folder / "b.jsonl").write_bytes(GOOD + b'{"text": "x"\n')
    with pytest.raises(ValueError, match=re.escape(f"{folder / 'b.jsonl'}: line 2 is not valid JSON")):
        load(folder, tmp_path)


def test_good_files_still_load(tmp_path):
    path = tmp_path / "ok.jsonl"
    path.write_bytes(GOOD * 3 + '{"text": "naïve"}\n'.encode())
    assert load(path, tmp_path)["text"][-1] == "naïve"
