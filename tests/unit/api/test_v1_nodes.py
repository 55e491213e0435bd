"""/api/v1/nodes and /api/v1/profiles through Flask's test client on a real state dir: roles,
ETags and If-Match, merge-patch, ranges with consecutive addresses, pages, selectors, the
merged view, audit records and events, and the error shape for each kind of bad input."""

import base64
import io
import json

import pytest

from provisiond import audit, events
from provisiond.api import MAX_BODY
from provisiond.errors import InvalidInput
from provisiond.service import records
from provisiond.service.inventory import MAX_API_NAMES, NODES
from provisiond.auth import Role
from provisiond.inventory import InventoryStore
from provisiond.status import record_phase
from provisiond.states import NodePhase
from v1helpers import Api, assert_error

NODE = {"netdevs": {"eth0": {"mac": "02:00:00:00:00:01", "ipaddr": "10.0.0.11",
                             "netmask": "255.255.255.0"}},
        "bmc": {"driver": "fake", "address": "10.1.0.11"}, "tags": {"rack": "a1"}}


@pytest.fixture
def api(config):
    return Api(config)


def create(api, names="n[001-004]", record=None, role=Role.ADMIN, **kwargs):
    return api.call(role, "POST", "/api/v1/nodes",
                    json={"names": names, "record": record or NODE}, **kwargs)


def stored(config):
    return InventoryStore(config).read()


def test_a_range_gets_consecutive_addresses(api, config):
    response = create(api, "n[001-004]")
    assert response.status_code == 201, response.json
    nodes = stored(config).nodes
    assert [nodes[f"n00{i}"].netdevs["eth0"].ipaddr for i in range(1, 5)] == [
        "10.0.0.11", "10.0.0.12", "10.0.0.13", "10.0.0.14"]
    assert [nodes[f"n00{i}"].netdevs["eth0"].mac for i in range(1, 5)] == [
        f"02:00:00:00:00:0{i}" for i in range(1, 5)]
    assert nodes["n004"].bmc.address == "10.1.0.14"
    assert [item["name"] for item in response.json["items"]] == ["n001", "n002", "n003",
                                                                  "n004"]
    assert response.json["revision"] == stored(config).revision


def test_the_same_range_through_the_cli_gives_the_same_records(api, config, cli):
    create(api, "n[001-004]")
    result = cli("node", "add", "m[001-004]", "--mac", "02:00:00:00:01:01", "--ipaddr",
                 "10.0.0.21", "--netmask", "255.255.255.0", "--bmc-driver", "fake",
                 "--bmc-address", "10.1.0.21", "--tag", "rack=a1")
    assert result.code == 0, result.err
    nodes = stored(config).nodes
    shape = lambda r: {k: v for k, v in r.to_data().items() if k not in ("netdevs", "bmc")}
    assert shape(nodes["n002"]) == shape(nodes["m002"])
    assert nodes["m002"].netdevs["eth0"].ipaddr == "10.0.0.22"


def test_roles_on_inventory_routes(api, config):
    create(api, "n001")
    writes = [("POST", "/api/v1/nodes", {"names": "n009", "record": {}}),
              ("PUT", "/api/v1/nodes/n001", {"comment": "x"}),
              ("PATCH", "/api/v1/nodes/n001", {"comment": "x"}),
              ("DELETE", "/api/v1/nodes/n001", None),
              ("PATCH", "/api/v1/nodes?names=n001", {"comment": "x"}),
              ("DELETE", "/api/v1/nodes?names=n001", None),
              ("POST", "/api/v1/profiles", {"names": "p", "record": {}})]
    before = (config.inventory_path).read_bytes()
    for method, path, body in writes:
        assert_error(api.call(None, method, path, json=body), 401, "unauthenticated")
        for role in (Role.READER, Role.OPERATOR):
            assert_error(api.call(role, method, path, json=body), 403, "forbidden")
    assert config.inventory_path.read_bytes() == before
    for role in Role:
        assert api.call(role, "GET", "/api/v1/nodes").status_code == 200
        assert api.call(role, "GET", "/api/v1/nodes/n001").status_code == 200
    assert api.call(Role.ADMIN, "PATCH", "/api/v1/nodes/n001",
                    json={"comment": "x"}).status_code == 200
    denied = [e for e in events.read_since(config, 0) if e.kind == "auth.denied"]
    assert {(e.data["reason"], e.data["token"]) for e in denied} == {
        ("role", "test-reader"), ("role", "test-operator")}


def test_etags_and_if_match(api, config):
    create(api, "n001")
    first = api.call(Role.ADMIN, "GET", "/api/v1/nodes/n001")
    etag = first.headers["ETag"]
    assert etag == f'"{first.json["etag"]}"'
    changed = api.call(Role.ADMIN, "PATCH", "/api/v1/nodes/n001", json={"comment": "a"},
                       headers={"If-Match": etag})
    assert changed.status_code == 200 and changed.headers["ETag"] != etag
    for method, body in (("PATCH", {"comment": "b"}), ("PUT", {"comment": "b"}),
                         ("DELETE", None)):
        response = api.call(Role.ADMIN, method, "/api/v1/nodes/n001", json=body,
                            headers={"If-Match": etag})
        assert_error(response, 412, "precondition_failed", "If-Match")
    assert stored(config).nodes["n001"].comment == "a"
    for bad in ("abc", '"abc', "W/abc"):
        response = api.call(Role.ADMIN, "PATCH", "/api/v1/nodes/n001", json={"comment": "c"},
                            headers={"If-Match": bad})
        assert_error(response, 400, "invalid_input", "If-Match")
    assert_error(api.call(Role.ADMIN, "PUT", "/api/v1/nodes/n404", json={},
                          headers={"If-Match": etag}), 412, "precondition_failed")
    assert "n404" not in stored(config).nodes
    current = changed.headers["ETag"]
    assert api.call(Role.ADMIN, "PUT", "/api/v1/nodes/n001", json={"comment": "new"},
                    headers={"If-Match": f'"nope", {current}'}).status_code == 200
    assert stored(config).nodes["n001"].to_data() == {"comment": "new"}
    gone = api.call(Role.ADMIN, "DELETE", "/api/v1/nodes/n001", headers={"If-Match": "*"})
    assert gone.status_code == 204 and "n001" not in stored(config).nodes


def test_put_answers_201_only_for_a_record_it_created_under_the_lock(api, config,
                                                                    monkeypatch):
    """The view decided 200 or 201 from a read before the locked write: a PUT racing a
    create said 201 for a record it replaced."""
    stale = records.snapshot(config)  # read before n1 exists: as a request racing the POST
    create(api, "n1")
    monkeypatch.setattr(records, "snapshot", lambda config: stale)
    response = api.call(Role.ADMIN, "PUT", "/api/v1/nodes/n1", json={"comment": "x"})
    assert response.status_code == 200, response.data
    assert api.call(Role.ADMIN, "PUT", "/api/v1/nodes/n9", json={}).status_code == 201


def test_collection_writes_take_the_inventory_revision(api, config):
    create(api, "n[001-003]")
    listing = api.call(Role.READER, "GET", "/api/v1/nodes")
    rev = listing.headers["ETag"]
    assert rev == f'"rev-{stored(config).revision}"'
    ok = api.call(Role.ADMIN, "PATCH", "/api/v1/nodes?names=n[001-002]",
                  json={"comment": "x"}, headers={"If-Match": rev})
    assert ok.status_code == 200 and [i["record"]["comment"] for i in ok.json["items"]] == [
        "x", "x"]
    stale = api.call(Role.ADMIN, "DELETE", "/api/v1/nodes?names=n[001-003]",
                     headers={"If-Match": rev})
    assert_error(stale, 412, "precondition_failed")
    assert len(stored(config).nodes) == 3
    assert api.call(Role.ADMIN, "DELETE", "/api/v1/nodes?names=n[001-003]").status_code == 204
    assert stored(config).nodes == {}


def test_merge_patch_semantics(api, config):
    create(api, "n001", {**NODE, "kernel_args": ["quiet", "console=ttyS0"],
                         "tags": {"rack": "a1", "row": "2"}, "comment": "old"})
    response = api.call(Role.ADMIN, "PATCH", "/api/v1/nodes/n001", json={
        "comment": None,                      # null removes
        "tags": {"row": None, "pdu": "p3"},   # objects merge key by key
        "kernel_args": ["debug"],             # arrays replace
        "netdevs": {"eth0": {"mtu": 9000}},   # nested objects merge
    }, content_type="application/merge-patch+json")
    assert response.status_code == 200, response.json
    record = stored(config).nodes["n001"].to_data()
    assert "comment" not in record
    assert record["tags"] == {"rack": "a1", "pdu": "p3"}
    assert record["kernel_args"] == ["debug"]
    assert record["netdevs"]["eth0"] == {**NODE["netdevs"]["eth0"], "mtu": 9000}
    assert api.call(Role.ADMIN, "PATCH", "/api/v1/nodes/n001",
                    json={"bmc": None}).json["record"].get("bmc") is None
    entries = audit.read(config, action="node.patch")
    assert entries[0]["actor"] == "token:test-admin" and entries[0]["target"] == "node:n001"
    assert set(entries[0]["changes"]) == {"comment", "tags.row", "tags.pdu", "kernel_args",
                                          "netdevs.eth0.mtu"}
    changed = [e for e in events.read_since(config, 0) if e.kind == "inventory.changed"]
    assert changed[-1].data["names"] == ["n001"] and changed[-1].data["fields"] == [
        "bmc.address", "bmc.driver"]
    assert changed[-1].data["revision"] == stored(config).revision


@pytest.mark.parametrize("patch,field", [
    ({"colour": "red"}, "colour"), ({"netdevs": {"eth0": {"mtu": "9000"}}}, "netdevs.eth0.mtu"),
    ({"netdevs": {"eth0": {"ipaddr": "10.0.0.300"}}}, "netdevs.eth0.ipaddr"),
    ({"profiles": ["nope"]}, None), ({"tags": {"bad key": "x"}}, "tags"),
    ({"image": "no-such-image"}, None),
])
def test_a_bad_patch_changes_nothing(api, config, patch, field):
    create(api, "n001")
    before = config.inventory_path.read_bytes()
    response = api.call(Role.ADMIN, "PATCH", "/api/v1/nodes/n001", json=patch)
    assert_error(response, 422, "invalid_inventory", field)
    assert config.inventory_path.read_bytes() == before


@pytest.mark.parametrize("method,path,body,status,code,field", [
    ("POST", "/api/v1/nodes", {"names": "n[1-", "record": {}}, 400, "invalid_input", "names"),
    ("POST", "/api/v1/nodes", {"names": "n[1-200000]", "record": {}}, 400, "invalid_input",
     "names"),
    ("POST", "/api/v1/nodes", {"names": "N1", "record": {}}, 400, "invalid_input", "names"),
    ("POST", "/api/v1/nodes", {"names": "n1", "record": {"mtu": 1}}, 400, "invalid_input",
     "record.mtu"),
    ("POST", "/api/v1/nodes", {"names": "n1", "record": {"netdevs": {"eth0": {"mtu": "1"}}}},
     400, "invalid_input", "record.netdevs.eth0.mtu"),
    ("POST", "/api/v1/nodes", {"names": "n1"}, 400, "invalid_input", "record"),
    ("POST", "/api/v1/nodes", {"names": "n001", "record": {}}, 409, "already_exists", "names"),
    ("PUT", "/api/v1/nodes/n001", {"comment": 5}, 400, "invalid_input", "comment"),
    ("PUT", "/api/v1/nodes/n001", {"comment": "a\x1b[2J"}, 400, "invalid_input", "comment"),
    ("PUT", "/api/v1/nodes/n001", [], 400, "invalid_input", None),
    ("PATCH", "/api/v1/nodes/n001", [1], 400, "invalid_input", None),
    ("PATCH", "/api/v1/nodes?names=n[001-009]", {}, 404, "not_found", None),
    ("PATCH", "/api/v1/nodes", {}, 400, "invalid_input", "names"),
    ("GET", "/api/v1/nodes?limit=0", None, 400, "invalid_input", "limit"),
    ("GET", "/api/v1/nodes?limit=1001", None, 400, "invalid_input", "limit"),
    ("GET", "/api/v1/nodes?limit=ten", None, 400, "invalid_input", "limit"),
    ("GET", "/api/v1/nodes?continue=Garbage!", None, 400, "invalid_input", "continue"),
    ("GET", "/api/v1/nodes?continue=eyJhZnRlciI6IDV9", None, 400, "invalid_input",
     "continue"),
    ("GET", "/api/v1/nodes?names=n[1-", None, 400, "invalid_input", "names"),
    ("GET", "/api/v1/nodes?phase=flying", None, 400, "invalid_input", "phase"),
    ("GET", "/api/v1/nodes?merged=perhaps", None, 400, "invalid_input", "merged"),
    ("GET", "/api/v1/nodes?colour=red", None, 400, "invalid_input", "colour"),
    ("GET", "/api/v1/nodes?limit=1&limit=2", None, 400, "invalid_input", "limit"),
    ("GET", "/api/v1/nodes/n404", None, 404, "not_found", None),
    ("DELETE", "/api/v1/profiles/default", None, 409, "in_use", None),
])
def test_bad_input_gets_one_error_shape_and_stores_nothing(api, config, method, path, body,
                                                          status, code, field):
    api.call(Role.ADMIN, "POST", "/api/v1/profiles", json={"names": "default", "record": {}})
    create(api, "n001")
    before = config.inventory_path.read_bytes()
    response = api.call(Role.ADMIN, method, path, json=body)
    assert_error(response, status, code, field)
    assert config.inventory_path.read_bytes() == before


def test_oversize_and_malformed_bodies(api, config):
    create(api, "n001")
    before = config.inventory_path.read_bytes()
    big = {"names": "n002", "record": {"comment": "x" * (1 << 20)}}
    assert_error(api.call(Role.ADMIN, "POST", "/api/v1/nodes", json=big), 413, "too_large")
    assert_error(api.call(Role.ADMIN, "PUT", "/api/v1/nodes/n001", data=b'{"comment": ',
                          content_type="application/json"), 400, "invalid_input")
    assert_error(api.call(Role.ADMIN, "PATCH", "/api/v1/nodes/n001", data=b"comment=x",
                          content_type="text/plain"), 415, "unsupported_media_type")
    assert config.inventory_path.read_bytes() == before


def chunked(api, body: bytes):
    """POST /api/v1/nodes with `body` sent chunked (no Content-Length), as gunicorn hands it
    to the app (wsgi.input_terminated)."""
    return api.call(Role.ADMIN, "POST", "/api/v1/nodes", input_stream=io.BytesIO(body),
                    content_type="application/json", headers={"Transfer-Encoding": "chunked"},
                    environ_overrides={"wsgi.input_terminated": True})


def test_a_chunked_body_over_the_limit_is_413_not_its_first_64_kib(api, config):
    """werkzeug cuts a chunked body at MAX_CONTENT_LENGTH without an error: a valid record
    padded to 64 KiB and followed by more was stored from its first 64 KiB."""
    doc = json.dumps({"names": "n1", "record": {"comment": "x"}})
    padded = doc + " " * (MAX_BODY - len(doc)) + '{"names": "n2"}'
    assert_error(chunked(api, padded.encode()), 413, "too_large")
    assert stored(config).nodes == {}
    assert chunked(api, doc.encode()).status_code == 201  # a small chunked body is read
    assert list(stored(config).nodes) == ["n1"]


@pytest.mark.parametrize("method, path, body", [
    ("POST", "/api/v1/nodes", {"names": "m[1-10001]", "record": {}}),
    ("POST", "/api/v1/nodes", {"names": "a[1-5000],b[1-5001]", "record": {}}),
    ("PATCH", "/api/v1/nodes?names=n[1-10001]", {"comment": "x"}),
    ("DELETE", "/api/v1/nodes?names=n[0-10000]", None),
    ("PUT", "/api/v1/secrets/nodes/n[1-10001]/k", {"value": "v"}),
])
def test_one_api_write_names_at_most_max_api_names(api, config, method, path, body):
    """POST of n[1-100000] held a gunicorn worker for 30 s until it was killed (and with it
    every boot it served); the CLI stays unbounded."""
    create(api, "n1")
    before = config.inventory_path.read_bytes()
    error = assert_error(api.call(Role.ADMIN, method, path, json=body), 400, "invalid_input",
                         "names")
    assert "at most 10000" in error["message"]
    assert config.inventory_path.read_bytes() == before


def test_the_bound_on_names_counts_the_expanded_range():
    assert NODES.names("n[1-3]", most=3) == ["n1", "n2", "n3"]
    with pytest.raises(InvalidInput, match="names 3 nodes; one request may name at most 2"):
        NODES.names("n[1-3]", most=2)
    assert len(NODES.names(f"n[1-{MAX_API_NAMES + 1}]")) == MAX_API_NAMES + 1  # the CLI's


def test_pages_over_2500_nodes_have_no_repeats_and_no_gaps(api, config):
    assert create(api, "n[1-2500]", {"tags": {"rack": "a"}}).status_code == 201
    seen, cursor, pages = [], None, 0
    while pages < 100:
        query = f"/api/v1/nodes?limit=333" + (f"&continue={cursor}" if cursor else "")
        page = api.call(Role.READER, "GET", query).json
        seen += [item["name"] for item in page["items"]]
        cursor, pages = page["continue"], pages + 1
        if cursor is None:
            break
    assert pages == 8 and len(seen) == len(set(seen)) == 2500
    assert seen == [f"n{i}" for i in range(1, 2501)]  # natural order


@pytest.mark.parametrize("path", ["/api/v1/nodes", "/api/v1/profiles", "/api/v1/status"])
@pytest.mark.parametrize("after, status, names", [
    ("n2", 200, ["n3"]), ("a", 200, ["n1"]), ("zzz", 200, []), ("x0", 200, []),
    ("\u00b2", 400, None), ("n\u0663", 400, None), ("N2", 400, None), ("", 400, None),
    ("eyJhZnRlciI6IDV9", 400, None)])
def test_a_forged_continue_token_is_a_name_or_a_400(api, path, after, status, names):
    """A continue token is the last name of the page; the schema's pattern says so. A
    forged one naming '²' was a ValueError in the natural sort key (500)."""
    create(api, "n[1-3]")
    response = api.call(Role.READER, "GET", f"{path}?limit=1&continue={after}")
    if status == 400:
        assert_error(response, 400, "invalid_input", "continue")
        return
    assert response.status_code == 200, response.data
    assert [item.get("name", item.get("node")) for item in response.json["items"]] == (
        [] if path == "/api/v1/profiles" else names)


@pytest.mark.parametrize("path", ["/api/v1/nodes", "/api/v1/status"])
@pytest.mark.parametrize("names", ["\u00b2", "n\u00b2", "x[1-2],\u00b2"])
def test_a_range_of_unicode_digits_is_refused_by_the_schema(api, path, names):
    create(api, "n[1-3]")
    assert_error(api.call(Role.READER, "GET", f"{path}?names={names}"), 400, "invalid_input",
                 "names")


@pytest.mark.parametrize("after", ["\u00b2", "n\u0663", "", "zz"])
def test_the_service_pages_after_any_text(api, config, after):
    """What the API's pattern keeps out, the service (and the CLI) still never fails on."""
    create(api, "n[1-3]")
    found, cursor = records.list_records(config, NODES, limit=1, after=after)
    assert [view.name for view in found] == (["n1"] if after == "" else [])


def test_pages_stay_whole_while_other_nodes_come_and_go(api, config):
    create(api, "n[1-50]")
    first = api.call(Role.READER, "GET", "/api/v1/nodes?limit=20").json
    # between pages: the page's last node and an earlier one go, later ones come
    api.call(Role.ADMIN, "DELETE", "/api/v1/nodes?names=n[5,20]")
    api.call(Role.ADMIN, "POST", "/api/v1/nodes", json={"names": "n[51-55]", "record": {}})
    rest, cursor = [], first["continue"]
    while cursor:
        page = api.call(Role.READER, "GET", f"/api/v1/nodes?limit=20&continue={cursor}").json
        rest += [item["name"] for item in page["items"]]
        cursor = page["continue"]
    assert rest == [f"n{i}" for i in range(21, 56)]


def test_selectors(api, config):
    api.call(Role.ADMIN, "POST", "/api/v1/profiles",
             json={"names": "gpu", "record": {"tags": {"accel": "a100"}}})
    create(api, "n[1-4]", {"tags": {"rack": "a1"}})
    create(api, "g[1-2]", {"profiles": ["gpu"], "tags": {"rack": "b2"}})
    record_phase(config, "n3", NodePhase.READY)

    def names(query):
        response = api.call(Role.READER, "GET", f"/api/v1/nodes?{query}")
        assert response.status_code == 200, response.json
        return [item["name"] for item in response.json["items"]]

    assert names("names=n[2-3],g1") == ["g1", "n2", "n3"]
    assert names("tag=rack=a1") == ["n1", "n2", "n3", "n4"]
    assert names("tag=accel") == ["g1", "g2"]  # from the profile: the merged record
    assert names("profile=gpu") == ["g1", "g2"]
    assert names("phase=ready") == ["n3"]
    assert names("tag=rack=b2&profile=gpu&limit=1") == ["g1"]
    assert names("image=none") == []


def test_the_merged_view_says_where_each_field_came_from(api, config):
    api.call(Role.ADMIN, "POST", "/api/v1/profiles",
             json={"names": "gpu", "record": {"kernel_args": ["iommu=pt"],
                                              "tags": {"accel": "a100"}}})
    create(api, "g1", {"profiles": ["gpu"], "kernel_args": ["quiet"], "tags": {"rack": "b"}})
    own = api.call(Role.READER, "GET", "/api/v1/nodes/g1").json
    assert "provenance" not in own and own["record"]["kernel_args"] == ["quiet"]
    merged = api.call(Role.READER, "GET", "/api/v1/nodes/g1?merged=true")
    assert merged.json["record"]["kernel_args"] == ["iommu=pt", "quiet"]
    assert merged.json["provenance"]["tags.accel"] == "profile:gpu"
    assert merged.json["provenance"]["tags.rack"] == "node"
    assert merged.json["provenance"]["kernel_args"] == "profile:gpu,node"
    assert merged.headers["ETag"] == f'"{own["etag"]}"'  # writes go to the stored record
    listed = api.call(Role.READER, "GET", "/api/v1/nodes?merged=true").json["items"][0]
    assert listed["provenance"] == merged.json["provenance"]


def test_profiles_are_the_same_resource(api, config):
    made = api.call(Role.ADMIN, "POST", "/api/v1/profiles",
                    json={"names": "compute", "record": {"kernel_args": ["quiet"]}})
    assert made.status_code == 201 and made.headers["ETag"]
    put = api.call(Role.ADMIN, "PUT", "/api/v1/profiles/compute", json={"comment": "c"},
                   headers={"If-Match": made.headers["ETag"]})
    assert put.status_code == 200
    assert stored(config).profiles["compute"].to_data() == {"comment": "c"}
    created = api.call(Role.ADMIN, "PUT", "/api/v1/profiles/other", json={})
    assert created.status_code == 201
    assert [p["name"] for p in api.call(Role.READER, "GET", "/api/v1/profiles")
            .json["items"]] == ["compute", "other"]


def test_a_deleted_node_takes_its_secrets_and_status_along(api, config):
    create(api, "n001")
    assert api.call(Role.ADMIN, "PUT", "/api/v1/secrets/nodes/n001/bmc_password",
                    json={"value": "hunter2"}).status_code == 204
    record_phase(config, "n001", NodePhase.BOOTED)
    assert api.call(Role.ADMIN, "DELETE", "/api/v1/nodes/n001").status_code == 204
    assert "n001" not in json.dumps(api.call(Role.ADMIN, "GET", "/api/v1/secrets").json)
    create(api, "n001")
    assert api.call(Role.READER, "GET", "/api/v1/status/n001").json["phase"] is None


def test_changes_to_thousands_of_scattered_nodes_are_still_audited_and_announced(config, cli):
    """Audit and event records are bounded journal lines: a change to 3,000 nodes whose
    names fold to no short range still gets both, its names cut short and counted."""
    names = ",".join(f"n{i}x{i % 7}" for i in range(3000))
    assert cli("node", "add", names, "--tag", "rack=a").code == 0
    entry = audit.read(config, action="node.create")[-1]
    assert entry["target"].endswith("(3000 nodes)")
    event = [e for e in events.read_since(config, 0) if e.kind == "inventory.changed"][-1]
    assert event.data["count"] == 3000 and 100 < len(event.data["names"]) < 3000


@pytest.mark.parametrize("path", ["/api/v1/nodes/BAD", "/api/v1/nodes/a%00b",
                                  "/api/v1/profiles/Up", "/api/v1/nodes/" + "a" * 64,
                                  "/api/v1/nodes/a.b"])
def test_a_put_to_an_invalid_name_stores_nothing(api, config, path):
    """A name from the URL is checked as one from the CLI: a stored bad name made the
    inventory file unreadable for every later request and command."""
    create(api, "n001")
    before = config.inventory_path.read_bytes()
    assert_error(api.call(Role.ADMIN, "PUT", path, json={}), 400, "invalid_input")
    assert config.inventory_path.read_bytes() == before
    assert api.call(Role.READER, "GET", "/api/v1/nodes").status_code == 200


def test_the_store_refuses_a_draft_with_an_invalid_name(config):
    from provisiond.errors import InvalidInventory
    from provisiond.inventory.model import Record

    with pytest.raises(InvalidInventory, match="invalid node name"):
        with InventoryStore(config).edit() as inventory:
            inventory.nodes["Bad"] = Record()
    assert not config.inventory_path.exists()
