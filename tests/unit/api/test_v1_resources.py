"""The other /api/v1 resources on a real state dir: status, discovery, secrets (never a
value), images, overlays (one file rendered for one node), audit; and the CLI's token and
audit verbs."""

import json

import pytest

from bootdata import add_image
from provisiond.auth import Role, TokenStore
from provisiond.boot.discovery import DiscoveryLog
from provisiond.inventory.secrets import SecretStore
from provisiond.overlays.hostkeys import host_key_dir, make_host_keys
from provisiond.status import record_phase
from provisiond.states import NodePhase
from v1helpers import Api, assert_error


@pytest.fixture
def api(config):
    api = Api(config)
    response = api.call(Role.ADMIN, "POST", "/api/v1/nodes", json={
        "names": "n[1-3]", "record": {"netdevs": {"eth0": {"ipaddr": "10.0.0.1"}}}})
    assert response.status_code == 201, response.json
    return api


def test_status_one_and_list(api, config):
    record_phase(config, "n2", NodePhase.DHCP)
    record_phase(config, "n2", NodePhase.BOOTED, "up")
    one = api.call(Role.READER, "GET", "/api/v1/status/n2").json
    assert one["phase"] == "booted" and set(one["phases"]) == {"dhcp", "booted"}
    assert one["detail"] == "up" and one["boot_started"] <= one["updated"]
    listing = api.call(Role.READER, "GET", "/api/v1/status?limit=2").json
    assert [s["node"] for s in listing["items"]] == ["n1", "n2"] and listing["continue"]
    assert listing["items"][0]["phase"] is None
    rest = api.call(Role.READER, "GET",
                    f"/api/v1/status?limit=2&continue={listing['continue']}").json
    assert [s["node"] for s in rest["items"]] == ["n3"] and rest["continue"] is None
    booted = api.call(Role.READER, "GET", "/api/v1/status?phase=booted").json["items"]
    assert [s["node"] for s in booted] == ["n2"]
    assert_error(api.call(Role.READER, "GET", "/api/v1/status/n9"), 404, "not_found")
    assert_error(api.call(None, "GET", "/api/v1/status/n2"), 401, "unauthenticated")
    # nodes report with their node credential, not an API token (test_credentials.py)
    assert_error(api.call(Role.ADMIN, "POST", "/api/v1/status/n1", json={"phase": "ready"}),
                 401, "unauthenticated")
    assert api.call(Role.READER, "GET", "/api/v1/status/n1").json["phase"] is None


def test_discovery_records_are_paged_and_survive_a_torn_line(api, config):
    log = DiscoveryLog(config, per_mac=0, per_second=1000)
    for i in range(5):
        assert log.note(f"02:00:00:00:01:0{i}", arch=7)
    with open(config.state_dir / "discovery.jsonl", "a") as handle:
        handle.write('{"time": 1, "mac": "02:00\n[1, 2]\n')  # a torn line, not an object
    first = api.call(Role.READER, "GET", "/api/v1/discovery/sightings?limit=3").json
    assert [r["mac"][-2:] for r in first["items"]] == ["00", "01", "02"]
    rest = api.call(Role.READER, "GET",
                    f"/api/v1/discovery/sightings?limit=3&continue={first['continue']}").json
    assert [r["mac"][-2:] for r in rest["items"]] == ["03", "04"] and rest["continue"] is None
    one = api.call(Role.READER, "GET", "/api/v1/discovery/sightings?mac=02-00-00-00-01-03").json
    assert [r["mac"] for r in one["items"]] == ["02:00:00:00:01:03"]
    assert_error(api.call(Role.READER, "GET", "/api/v1/discovery/sightings?mac=zz"), 400,
                 "invalid_input", "mac")


def test_secrets_are_write_only(api, config):
    path = "/api/v1/secrets/nodes/n[1-2]/bmc_password"
    for role in (Role.READER, Role.OPERATOR):
        assert_error(api.call(role, "PUT", path, json={"value": "s3cret"}), 403, "forbidden")
        assert_error(api.call(role, "GET", "/api/v1/secrets"), 403, "forbidden")
    assert api.call(Role.ADMIN, "PUT", path, json={"value": "s3cret"}).status_code == 204
    assert SecretStore(config).get("nodes", "n2", "bmc_password") == "s3cret"
    listing = api.call(Role.ADMIN, "GET", "/api/v1/secrets")
    assert listing.json["items"] == [{"kind": "node", "name": "n1", "keys": ["bmc_password"]},
                                     {"kind": "node", "name": "n2", "keys": ["bmc_password"]}]
    audit = api.call(Role.ADMIN, "GET", "/api/v1/audit?action=secret.set").json["items"]
    assert audit[0]["changes"] == ["bmc_password"] and audit[0]["target"] == "node:n[1-2]"
    everything = b"".join(api.call(Role.ADMIN, "GET", url).data for url in (
        "/api/v1/secrets", "/api/v1/audit", "/api/v1/nodes/n1", "/api/v1/nodes/n1?merged=1"))
    assert b"s3cret" not in everything
    events = (config.state_dir / "events" / "journal.jsonl").read_bytes()
    assert b"s3cret" not in events and b"secret.changed" in events
    assert api.call(Role.ADMIN, "DELETE", path).status_code == 204
    assert SecretStore(config).get("nodes", "n2", "bmc_password") is None
    gone = api.call(Role.ADMIN, "DELETE", path)  # nothing left to remove
    assert_error(gone, 404, "not_found", "key")
    assert "no secret bmc_password is set for node n[1-2]" in gone.json["error"]["message"]


@pytest.mark.parametrize("path,body,status,code,field", [
    ("/api/v1/secrets/nodes/n9/k", {"value": "x"}, 404, "not_found", None),
    ("/api/v1/secrets/racks/n1/k", {"value": "x"}, 400, "invalid_input", "kind"),
    ("/api/v1/secrets/nodes/n1/a%20b", {"value": "x"}, 400, "invalid_input", "key"),
    ("/api/v1/secrets/nodes/n1/k", {"value": ""}, 400, "invalid_input", "value"),
    ("/api/v1/secrets/nodes/n1/k", {"value": "a\x1bb"}, 400, "invalid_input", "value"),
    ("/api/v1/secrets/nodes/n1/k", {"value": 5}, 400, "invalid_input", "value"),
    ("/api/v1/secrets/nodes/n1/k", {"value": "x", "other": 1}, 400, "invalid_input", "other"),
])
def test_bad_secret_writes_store_nothing(api, config, path, body, status, code, field):
    response = api.call(Role.ADMIN, "PUT", path, json=body)
    error = assert_error(response, status, code, field)
    assert "a\x1bb" not in error["message"]  # a value is never echoed
    assert SecretStore(config).read() == {}


@pytest.mark.parametrize("value, shown", [(918273645, b"918273645"), (True, b"True"),
                                          (27.1828, b"27.1828")])
def test_a_secret_value_of_the_wrong_type_is_not_echoed(api, config, value, shown):
    """The YAML hint ('YAML read the value as a number, 918273645: put it in quotes') quoted
    the value in the answer; in a JSON body it was wrong anyway."""
    response = api.call(Role.ADMIN, "PUT", "/api/v1/secrets/nodes/n1/k", json={"value": value})
    assert_error(response, 400, "invalid_input", "value")
    assert shown not in response.data and b"YAML" not in response.data
    assert SecretStore(config).read() == {}


def test_no_yaml_hint_in_answers_to_json_bodies(api, config):
    response = api.call(Role.ADMIN, "PATCH", "/api/v1/nodes/n1", json={"comment": 12345})
    error = assert_error(response, 422, "invalid_inventory", "comment")
    assert "YAML" not in error["message"] and "12345" not in error["message"]


def test_images_list_show_delete(api, config):
    add_image(config, "tiny")
    api.call(Role.ADMIN, "PATCH", "/api/v1/nodes/n1", json={"image": "tiny"})
    listing = api.call(Role.READER, "GET", "/api/v1/images").json["items"]
    assert [i["name"] for i in listing] == ["tiny"] and len(listing[0]["layers"]) == 2
    assert api.call(Role.READER, "GET", "/api/v1/images/tiny").json["kernel"]["version"] \
        == "6.1"
    assert_error(api.call(Role.READER, "GET", "/api/v1/images/nope"), 404, "not_found")
    assert_error(api.call(Role.READER, "GET", "/api/v1/images/..%2f..%2fetc"), 404,
                 "not_found")
    assert_error(api.call(Role.OPERATOR, "DELETE", "/api/v1/images/tiny"), 403, "forbidden")
    assert_error(api.call(Role.ADMIN, "DELETE", "/api/v1/images/tiny"), 409, "in_use")
    assert api.call(Role.ADMIN, "DELETE", "/api/v1/images/tiny?force=true").status_code == 204
    assert api.call(Role.READER, "GET", "/api/v1/images").json["items"] == []


def test_overlays_list_show_and_render_one_file_for_one_node(api, config):
    names = [o["name"] for o in api.call(Role.READER, "GET", "/api/v1/overlays")
             .json["items"]]
    assert "hosts" in names and "hostname" in names
    hostname = api.call(Role.READER, "GET", "/api/v1/overlays/hostname").json
    assert any(f["path"] == "/etc/hostname" for f in hostname["files"])
    rendered = api.call(Role.READER, "GET",
                        "/api/v1/overlays/hostname/render?node=n2&path=/etc/hostname")
    assert rendered.status_code == 200 and rendered.data.decode().strip().startswith("n2")
    assert_error(api.call(Role.READER, "GET",
                          "/api/v1/overlays/hostname/render?node=n9&path=/etc/hostname"),
                 404, "not_found")
    assert_error(api.call(Role.READER, "GET",
                          "/api/v1/overlays/hostname/render?node=n2&path=/etc/nothing"),
                 400, "invalid_input", "path")
    assert_error(api.call(Role.READER, "GET", "/api/v1/overlays/hostname/render?node=n2"),
                 400, "invalid_input", "path")
    assert_error(api.call(Role.READER, "GET", "/api/v1/overlays/nope"), 404, "not_found")


def test_rendering_a_secret_file_shows_placeholders_and_makes_no_key(api, config):
    """A reader's GET of a rendered host key file made the node's private keys on disk."""
    api.call(Role.ADMIN, "PATCH", "/api/v1/nodes/n1", json={"runtime_overlays": ["ssh"]})
    url = "/api/v1/overlays/ssh/render?node=n1&path=/etc/ssh/ssh_host_{}_key"
    rendered = api.call(Role.READER, "GET", url.format("ed25519"))
    assert rendered.status_code == 200, rendered.data
    assert rendered.data.strip() == b"<secrets.ssh_host_keys.ed25519.private>"
    assert not host_key_dir(config, "n1").exists()
    make_host_keys(config, "n1")  # as a build makes them
    for key_type in ("ed25519", "ecdsa"):
        private = (host_key_dir(config, "n1") / f"ssh_host_{key_type}_key").read_bytes()
        shown = api.call(Role.READER, "GET", url.format(key_type)).data
        assert shown.strip() == f"<secrets.ssh_host_keys.{key_type}.private>".encode()
        assert private.splitlines()[1] not in shown


def test_audit_needs_admin_and_pages(api, config):
    for i in range(4):
        api.call(Role.ADMIN, "PATCH", "/api/v1/nodes/n1", json={"comment": f"c{i}"})
    assert_error(api.call(Role.READER, "GET", "/api/v1/audit"), 403, "forbidden")
    first = api.call(Role.ADMIN, "GET", "/api/v1/audit?action=node.patch&limit=3").json
    assert [e["changes"] for e in first["items"]] == [["comment"]] * 3
    assert all(e["actor"] == "token:test-admin" for e in first["items"])
    rest = api.call(Role.ADMIN, "GET", "/api/v1/audit?action=node.patch&limit=3&continue="
                    + first["continue"]).json
    assert len(rest["items"]) == 1 and rest["items"][0]["seq"] > first["items"][-1]["seq"]


def test_token_and_audit_cli(cli, config):
    made = cli("token", "create", "--role", "operator", "--name", "netbox-sync")
    assert made.code == 0, made.err
    token = made.out.strip()
    assert len(token) >= 40 and "\n" not in token and "shown this once" in made.err
    assert TokenStore(config).authenticate(token).role is Role.OPERATOR
    assert token not in (config.state_dir / "tokens.json").read_text()
    listed = cli("token", "list", "--json")
    assert [(t["name"], t["role"]) for t in json.loads(listed.out)] == [
        ("netbox-sync", "operator")] and token not in listed.out
    again = cli("token", "create", "--role", "admin", "--name", "netbox-sync")
    assert again.code == 4 and "exists" in again.err
    assert cli("token", "revoke", "netbox-sync").code == 0
    assert cli("token", "revoke", "netbox-sync").code == 3
    assert cli("token", "create", "--role", "admin", "--name", "Bad Name").code == 2
    assert cli("token", "create", "--role", "admin", "--name", "x",
               "--expires-in", "-1").code == 2
    log = json.loads(cli("audit", "--json").out)
    assert [e["action"] for e in log] == ["token.create", "token.revoke"]
    assert log[0]["actor"].startswith("cli:") and log[0]["target"] == "token:netbox-sync"
    table = cli("audit", "--actor", log[0]["actor"])
    assert table.code == 0 and "token.revoke" in table.out


def test_overlays_list_answers_200_with_a_broken_overlays_error(api, config):
    """One overlay that cannot be read (here its overlay.yaml) made the listing a 500."""
    folder = config.state_dir / "overlays" / "odd"
    (folder / "etc").mkdir(parents=True)
    (folder / "etc/motd").write_text("hi\n")
    (folder / "overlay.yaml").write_text("modes: {etc/motd: rw}\n")
    response = api.call(Role.READER, "GET", "/api/v1/overlays")
    assert response.status_code == 200, response.json
    listed = {o["name"]: o for o in response.json["items"]}
    assert "not an octal mode" in listed["odd"]["error"] and listed["odd"]["files"] is None
    assert listed["hosts"]["error"] is None and listed["hosts"]["kind"] == "any"
    assert_error(api.call(Role.READER, "GET", "/api/v1/overlays/odd"), 400, "invalid_input")
