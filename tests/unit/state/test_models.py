"""state.models: every document as provisiond wrote it (real files from builds, serves and
test runs, tests/fixtures/state) is read and written back the same."""

import json
from pathlib import Path

import pytest

from provisiond.errors import InvalidInput
from provisiond.state.models import (DamagedDocument, FakeBmcs, ImageManifest, LayerRecord,
                                     Leases, NodeStatus, PendingBootdevs, Sighting, parse)
from provisiond.states import NodePhase

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "state"

# file, model, whether provisiond's own writer made it (then the bytes are the same; the
# others were written by a test or the bench, and come back as the same JSON value)
WRITTEN = [
    ("manifest-mounted.json", ImageManifest, True),    # image build, mounted layers
    ("manifest-imported.json", ImageManifest, True),   # image import (oci-archive layers)
    ("manifest-old.json", ImageManifest, False),       # before layer_build_seconds
    ("manifest-bench.json", ImageManifest, False),     # bench_boot_common's trimmed one
    ("layer.json", LayerRecord, True),
    ("layer-mounted.json", LayerRecord, True),
    ("status-ready.json", NodeStatus, True),
    ("status-refused.json", NodeStatus, True),
    ("dhcp-leases.json", Leases, True),
    ("fake-bmcs.json", FakeBmcs, True),
    ("fake-bmcs-image.json", FakeBmcs, True),
]


@pytest.mark.parametrize("name, model, ours", WRITTEN)
def test_a_written_document_comes_back_the_same(name, model, ours):
    raw = (FIXTURES / name).read_text()
    value = model.model_validate_json(raw)
    assert value.document() == json.loads(raw)
    if ours:
        assert value.text() == raw


def test_discovery_lines_come_back_the_same():
    for line in (FIXTURES / "discovery.jsonl").read_text().splitlines():
        assert Sighting.model_validate_json(line).text() == line


def test_fields_a_newer_writer_added_survive_and_no_default_is_added():
    data = json.loads((FIXTURES / "manifest-bench.json").read_text())
    data["kernel"]["future"] = {"x": 1}
    value = ImageManifest.model_validate(data)
    assert value.document() == data
    assert value.init == "/sbin/init" and "init" not in value.document()


def test_a_status_reads_as_phases():
    status = NodeStatus.model_validate_json((FIXTURES / "status-ready.json").read_text())
    assert status.phase is NodePhase.READY
    assert status.reached(NodePhase.READY, status.boot_started)
    assert not status.reached(NodePhase.READY, status.boot_started + 1)
    assert not status.reached(NodePhase.FAILED, 0)


def test_pending_resets_keep_their_format():
    """power/pending-bootdev.json as power.pending wrote it (indent 1, sorted keys)."""
    data = {"n2": {"device": "disk", "since": 1795388158.5}, "n1": {"device": "disk",
                                                                     "since": 17}}
    value = PendingBootdevs.model_validate(data)
    assert value.text() == json.dumps(data, indent=1, sort_keys=True)
    assert isinstance(value.root["n1"].since, int)  # an int stays an int


@pytest.mark.parametrize("raw, message", [
    (b'{"name": "x", "kern', "x.json: Invalid JSON"),
    (b'{"name": "x", "layers": []}', "x.json: kernel: Field required"),
    (b'{"name": "x", "layers": [], "kernel": {"digest": "md5:1"}}',
     "x.json: kernel.digest: String should match pattern"),
    (b"[]", "x.json: Input should be an object"),
])
def test_parse_names_the_document_and_its_first_problem_in_one_line(raw, message):
    with pytest.raises(DamagedDocument) as caught:
        parse(ImageManifest, raw, "x.json", DamagedDocument)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)
    with pytest.raises(InvalidInput):
        parse(ImageManifest, raw, "x.json")
