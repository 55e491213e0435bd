"""The OpenAPI document says the formats of inventory fields (MAC, IPv4/IPv6, netmask, BMC
address, image/profile/overlay names) with the patterns the validators check them with, and
the server takes nothing the document refuses (it may refuse more: a multicast MAC...)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from pydantic import ValidationError

from provisiond.api.v1.formats import FORMATS
from provisiond.auth import Role
from provisiond.inventory.model import NetDev, Record
from v1helpers import Api, assert_error

MAC_LIKE = st.text(alphabet="0123456789abcdefABCDEF:- \u00a0\t\ng", max_size=24)
IP_LIKE = st.text(alphabet="0123456789abcdef.:/% \n", max_size=45)
NAME_LIKE = st.text(alphabet="abz09-_.A \u00e9", max_size=70)
SAMPLES = {
    "mac": MAC_LIKE, "ipaddr": IP_LIKE, "gateway": IP_LIKE, "netmask": IP_LIKE,
    "ipaddr6": IP_LIKE, "address": st.one_of(IP_LIKE, NAME_LIKE), "image": NAME_LIKE,
    "profiles": st.lists(NAME_LIKE, max_size=2), "system_overlays": st.lists(NAME_LIKE,
                                                                            max_size=2),
    "runtime_overlays": st.lists(NAME_LIKE, max_size=2),
    "cipher_suite": st.integers(-1, 20),
}
TRICKY = {
    "mac": [" AA-bb-CC-dd-EE-0f ", "aa:bb:cc:dd:ee", "aa:bb:cc:dd:ee:ff:00", "aabb.ccdd.eeff",
            "01:00:5e:00:00:01", "\u00a0aa:bb:cc:dd:ee:02"],
    "ipaddr": ["10.0.0.1", "010.0.0.1", "10.0.0.256", "0.0.0.0", "1.2.3", " 10.0.0.1"],
    "netmask": ["255.255.255.0", "24", "024", "33", "255.0.255.0", "0x18", "/24"],
    "ipaddr6": ["fd00::1", "fe80::1%eth0", "::ffff:10.0.0.1", "fd00:::1", "FD00::1", "::"],
    "address": ["bmc1.lab", "BMC1.Lab", "010.0.0.1", "fd00::9", "-bmc", "10.0.0.1",
                "a" * 254],
}


@pytest.fixture(scope="module")
def document(tmp_path_factory):
    from provisiond.config import load_config, write_default_config

    state = tmp_path_factory.mktemp("formats") / "state"
    write_default_config(state)
    api = Api(load_config(state))
    return api.client.get("/api/v1/openapi.json").json


def field_schema(document, model: type, field: str) -> dict:
    """The schema of `field` of `model` (pydantic names a model by its module too when
    another module has a model of the same name)."""
    schemas = document["components"]["schemas"]
    qualified = f"{model.__module__}.{model.__name__}".replace(".", "__")
    return schemas.get(qualified, schemas.get(model.__name__))["properties"][field]


def required_of(schema) -> list:
    """Everything an `allOf` anywhere in `schema` asks."""
    if isinstance(schema, list):
        return [found for item in schema for found in required_of(item)]
    if not isinstance(schema, dict):
        return []
    return list(schema.get("allOf", [])) + [found for key, value in schema.items()
                                            for found in required_of(value)]


def test_the_document_carries_each_validators_format(document):
    for (model, field), fragment in FORMATS.items():
        assert fragment.get("items", fragment) in required_of(
            field_schema(document, model, field)), (model.__name__, field)
    mac = field_schema(document, NetDev, "mac")["anyOf"][0]
    assert mac["allOf"] == [{"pattern": "^\\s*[0-9A-Fa-f]{2}([:-][0-9A-Fa-f]{2}){5}\\s*$"}]
    assert mac["pattern"].startswith("^[^\\x00-")  # no control character: still said
    ipaddr = field_schema(document, NetDev, "ipaddr")["anyOf"][0]["allOf"][0]
    assert ipaddr["format"] == "ipv4" and ipaddr["pattern"].startswith("^(25[0-5]|")
    profiles = field_schema(document, Record, "profiles")["anyOf"][0]
    assert profiles["items"]["allOf"] == [{"pattern": "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"}]


@pytest.mark.parametrize("model, field", list(FORMATS), ids=[f for _, f in FORMATS])
def test_the_server_takes_nothing_the_document_refuses(document, model, field):
    validator = Draft202012Validator(field_schema(document, model, field),
                                     format_checker=Draft202012Validator.FORMAT_CHECKER)

    def check(value) -> None:
        if validator.is_valid(value):
            return
        with pytest.raises(ValidationError):
            model.model_validate({field: value})

    for value in TRICKY.get(field, []) + TRICKY.get("ipaddr" if field == "gateway" else "", []):
        check(value)

    @settings(max_examples=300, derandomize=True, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(SAMPLES[field])
    def refused_by_both(value):
        check(value)

    refused_by_both()


def test_what_the_document_refuses_is_a_400_naming_the_field(config):
    api = Api(config)
    for netdev, field in (({"mac": "aa:bb:cc:dd:ee"}, "netdevs.eth0.mac"),
                          ({"ipaddr": "10.0.0.256"}, "netdevs.eth0.ipaddr"),
                          ({"ipaddr6": "fe80::1%eth0"}, "netdevs.eth0.ipaddr6")):
        answer = api.call(Role.ADMIN, "PUT", "/api/v1/nodes/n1", json={"netdevs": {
            "eth0": netdev}})
        assert_error(answer, 400, "invalid_input", field)
    answer = api.call(Role.ADMIN, "PUT", "/api/v1/nodes/n1", json={"netdevs": {"eth0": {
        "mac": " AA-bb-CC-dd-EE-0f ", "ipaddr": "10.0.0.1", "ipaddr6": "FD00::1"}}})
    assert answer.status_code == 201, answer.json
    assert answer.json["record"]["netdevs"]["eth0"] == {
        "mac": "aa:bb:cc:dd:ee:0f", "ipaddr": "10.0.0.1", "ipaddr6": "fd00::1"}
