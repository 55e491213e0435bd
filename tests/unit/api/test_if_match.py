"""If-Match parsing: strong tags only; a malformed header is refused, never ignored."""

import pytest
from flask import Flask

from provisiond.api.v1 import if_match
from provisiond.errors import InvalidInput, PreconditionFailed
from provisiond.service.records import check_etag


def parsed(value):
    with Flask(__name__).test_request_context(headers={"If-Match": value}):
        return if_match()


@pytest.mark.parametrize("value,tags", [
    ('"abc"', ["abc"]), ('"a", "b"', ["a", "b"]), ("*", ["*"]), ('W/"a"', []),
    ('W/"a", "b"', ["b"]), (' "a" ,"b" ', ["a", "b"]), ('""', [""]),
])
def test_if_match_lists(value, tags):
    assert parsed(value) == tags


@pytest.mark.parametrize("value", ["abc", '"abc', '"a" "b"', "", ",", '"a",,', "W/abc"])
def test_malformed_if_match_is_invalid_input(value):
    with pytest.raises(InvalidInput):
        parsed(value)


def test_no_header_is_no_precondition():
    with Flask(__name__).test_request_context():
        assert if_match() is None


def test_check_etag():
    check_etag(["x"], "x", "node n1")
    check_etag(["y", "x"], "x", "node n1")
    check_etag(["*"], "x", "node n1")
    for tags, current in ((["y"], "x"), ([], "x"), (["*"], None), (["x"], None)):
        with pytest.raises(PreconditionFailed):
            check_etag(tags, current, "node n1")
