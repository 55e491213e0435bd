"""provisiond.documents: the YAML reader every document goes through."""

import pytest

from provisiond.documents import load_yaml_mapping
from provisiond.errors import InvalidInput


@pytest.mark.parametrize("text", [
    "nodes:\n  n1: {image: a}\n  n1: {image: b}\n",   # block style, two lines
    "nodes: {n1: {image: a}, n1: {image: b}}\n",      # flow style, one line
    "{a: 1, a: 2}\n",
])
def test_a_duplicate_key_is_an_error_on_one_line_or_two(text):
    with pytest.raises(InvalidInput, match="duplicate key 'n1'|duplicate key 'a'"):
        load_yaml_mapping(text, "f.yaml")


def test_merge_keys_may_still_be_overridden():
    data = load_yaml_mapping("base: &b {x: 1, y: 2}\nnode: {<<: *b, x: 3}\n", "f.yaml")
    assert data["node"] == {"x": 3, "y": 2}
