"""What the inventory's validators check, said in the OpenAPI document: MAC addresses, IPv4
and IPv6 addresses, netmasks, BMC addresses, image, profile and overlay names.

Each pattern here is the one the validator itself matches with (provisiond.inventory.values,
provisiond.config.LABEL_RE), so the document refuses nothing the server takes; the server
may refuse more (a multicast MAC, 0.0.0.0, an IPv4-mapped IPv6 address), which no pattern
says. Added to the pydantic models' schemas as they are generated (`FormatsSchema`).
"""

from __future__ import annotations

from pydantic.json_schema import GenerateJsonSchema

from provisiond.config import LABEL_RE
from provisiond.inventory.model import Bmc, NetDev, Record
from provisiond.inventory.values import (HOSTNAME_RE, IPMI_CIPHER_SUITES, IPV4_RE,
                                         MAC_INPUT_RE, OVERLAY_RE)

IPV4 = IPV4_RE.pattern.removeprefix("^").removesuffix("$")
NAME = {"pattern": f"^{LABEL_RE.pattern}$"}  # check_name, check_image_name
FORMATS: dict[tuple[type, str], dict] = {
    (NetDev, "mac"): {"pattern": MAC_INPUT_RE.pattern},  # check_node_mac
    (NetDev, "ipaddr"): {"format": "ipv4", "pattern": IPV4_RE.pattern},  # check_ipv4_host
    (NetDev, "gateway"): {"format": "ipv4", "pattern": IPV4_RE.pattern},
    (NetDev, "netmask"): {"pattern": f"^(?:{IPV4}|[0-9]+)$"},  # dotted, or a prefix length
    (NetDev, "ipaddr6"): {"format": "ipv6"},  # check_ipv6_host: ipaddress.IPv6Address
    (Bmc, "address"): {"anyOf": [{"format": "ipv6"},  # check_host: an address, or a name
                                 {"pattern": f"^{HOSTNAME_RE.pattern}$"}]},
    (Bmc, "cipher_suite"): {"enum": list(IPMI_CIPHER_SUITES)},
    (Record, "image"): NAME,
    (Record, "profiles"): {"items": NAME},
    (Record, "system_overlays"): {"items": {"pattern": f"^{OVERLAY_RE.pattern}$"}},
    (Record, "runtime_overlays"): {"items": {"pattern": f"^{OVERLAY_RE.pattern}$"}},
}


class FormatsSchema(GenerateJsonSchema):
    """pydantic's JSON schema, with FORMATS added to the fields they name."""

    def model_schema(self, schema):
        generated = super().model_schema(schema)
        properties = generated.get("properties", {})
        for name, prop in properties.items():
            fragment = FORMATS.get((schema["cls"], name))
            if fragment:
                properties[name] = with_format(prop, fragment)
        return generated


def with_format(prop: dict, fragment: dict) -> dict:
    """`prop` (a field's schema, maybe `anyOf` [its type, null]) with `fragment` required of
    its value (or of each item, for {"items": ...}) besides what it already asks."""
    def narrow(branch: dict) -> dict:
        if branch.get("type") == "null":
            return branch
        if "items" in fragment:
            return {**branch, "items": narrow_item(branch["items"], fragment["items"])}
        return narrow_item(branch, fragment)

    if "anyOf" in prop:
        return {**prop, "anyOf": [narrow(branch) for branch in prop["anyOf"]]}
    return narrow(prop)


def narrow_item(schema: dict, fragment: dict) -> dict:
    return {**schema, "allOf": [*schema.get("allOf", []), fragment]}
