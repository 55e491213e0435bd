"""provisiond.documents: the YAML reader every document goes through."""

import subprocess
import sys

import pytest

from provisiond.documents import MAX_DEPTH, load_yaml_mapping
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


@pytest.mark.parametrize("text", [
    "nodes: " + "[" * 50000 + "]" * 50000,            # libyaml's composer: a segfault
    "nodes:\n  ? " + "[" * 50000 + "]" * 50000 + "\n  : {}",
    "nodes: " + "{a: " * 20000 + "1" + "}" * 20000,    # deepcopy, pydantic: RecursionError
    "a:\n" + "".join(" " * i + f"k{i}:\n" for i in range(1, 300)) + " " * 300 + "x: 1\n",
])
def test_nesting_deeper_than_any_document_needs_is_one_line(text):
    """Run in a child: the failure before the fix was a segfault of the whole process."""
    script = ("import sys; from provisiond.documents import load_yaml_mapping\n"
              "from provisiond.errors import InvalidInput\n"
              "try:\n    load_yaml_mapping(sys.stdin.read(), 'f.yaml')\n"
              "except InvalidInput as exc:\n    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", script], input=text, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-300:]
    assert done.stdout.strip().startswith(
        f"f.yaml: nested deeper than {MAX_DEPTH} levels"), done.stdout


def test_ordinary_nesting_loads():
    deepest = MAX_DEPTH - 1  # and the document's own mapping
    text = "a: " + "[" * deepest + "]" * deepest + "\nb: {c: {d: [1, {e: 2}]}}\n"
    assert load_yaml_mapping(text, "f.yaml")["b"] == {"c": {"d": [1, {"e": 2}]}}


def _laughs(levels: int) -> str:
    """A "billion laughs" text: each anchor lists the one before it ten times."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines) + f"\nnodes: {{n1: {{comment: *a{levels - 1}}}}}\n"


def test_aliases_that_multiply_the_document_are_one_line(tmp_path):
    with pytest.raises(InvalidInput, match=r"aliases \(\*name\) expand it to [0-9,]+ values"):
        load_yaml_mapping(_laughs(7), "bomb.yaml")


def test_the_server_store_refuses_an_alias_bomb_before_caching_it(cli, state_dir):
    (state_dir / "inventory.yaml").write_text("revision: 1\nprofiles: {}\n" + _laughs(7))
    result = cli("node", "list")
    assert result.code == 2 and "expand it to" in result.err, result
    cache = state_dir / ".inventory.cache.json"
    assert not cache.exists() or cache.stat().st_size < 10_000


def test_ordinary_aliases_load():
    text = "common: &c {netmask: 255.255.255.0}\nnodes: {n1: *c, n2: *c}\n"
    assert load_yaml_mapping(text, "ok.yaml")["nodes"]["n2"] == {"netmask": "255.255.255.0"}
