"""The record flags shared by `node add|set` and `profile add|set`, turned into edits."""

from __future__ import annotations

import argparse
from pathlib import Path

from pydantic import ValidationError

from provisiond.errors import InvalidInput, InvalidInventory
from provisiond.inventory.model import Record
from provisiond.inventory.ranges import spread_addresses
from provisiond.inventory.store import describe_validation_error
from provisiond.states import BmcDriver

# flag dest -> dotted field. Netdev fields go under netdevs.<--netdev>.
NETDEV_FLAGS = {"mac": str, "ipaddr": str, "netmask": str, "gateway": str,
                "ipaddr6": str, "prefix6": int, "mtu": int, "type": str}
BMC_FLAGS = {"driver": str, "address": str, "port": int, "system_id": str, "username": str,
             "password_file": str, "scheme": str, "cipher_suite": int, "ca_file": str,
             "timeout": float}
SCALAR_FLAGS = {"image": "image", "comment": "comment",
                "nomad_datacenter": "nomad.datacenter", "nomad_node_class": "nomad.node_class",
                "nomad_node_pool": "nomad.node_pool", "ansible_repo": "ansible.repo",
                "ansible_branch": "ansible.branch", "ansible_playbook": "ansible.playbook",
                "slurm_cpus": "slurm.cpus", "slurm_real_memory": "slurm.real_memory"}
# Profiles and overlays may be comma-separated (a comma cannot be part of their names); a
# comma can be part of a kernel arg (console=ttyS1,115200) or an ssh key's options, so those
# are repeated instead.
LIST_FLAGS = {"kernel_arg": "kernel_args", "system_overlay": "system_overlays",
              "runtime_overlay": "runtime_overlays", "ssh_key": "ssh_authorized_keys",
              "nomad_server": "nomad.servers", "slurm_feature": "slurm.features"}
COMMA_LISTS = {"profile", "system_overlay", "runtime_overlay", "slurm_feature"}
MAP_FLAGS = {"tag": "tags", "nomad_meta": "nomad.meta", "ansible_var": "ansible.extra_vars"}


def add_record_flags(parser: argparse.ArgumentParser, for_node: bool, editing: bool) -> None:
    """Flags for every record field; lists given on `set` replace the record's own list."""
    if for_node:
        parser.add_argument("--profile", "-P", action="append", metavar="NAME",
                            help="profile to use (repeat or comma-separate; order matters: "
                            "later profiles win)")
    parser.add_argument("--image", help="image name")
    parser.add_argument("--comment")
    group = parser.add_argument_group("network device (applies to --netdev, default eth0)")
    group.add_argument("--netdev", default="eth0", metavar="NAME")
    group.add_argument("--mac", help="MAC address (a range gets consecutive MACs)")
    group.add_argument("--ipaddr", help="IPv4 address (a range gets consecutive addresses)")
    group.add_argument("--netmask")
    group.add_argument("--gateway")
    group.add_argument("--ipaddr6", help="IPv6 address (a range gets consecutive addresses)")
    group.add_argument("--prefix6", type=int)
    group.add_argument("--mtu", type=int)
    group.add_argument("--type", help="ethernet, infiniband, ...")
    group.add_argument("--primary", action="store_true", help="mark this netdev primary")
    bmc = parser.add_argument_group("BMC")
    bmc.add_argument("--bmc-driver", dest="bmc_driver", choices=[d.value for d in BmcDriver])
    bmc.add_argument("--bmc-address", dest="bmc_address",
                     help="IP address or host name (a range gets consecutive IP addresses)")
    bmc.add_argument("--bmc-port", dest="bmc_port", type=int)
    bmc.add_argument("--bmc-system-id", dest="bmc_system_id")
    bmc.add_argument("--bmc-username", dest="bmc_username")
    bmc.add_argument("--bmc-password-file", dest="bmc_password_file",
                     help="file holding the BMC password (read when needed)")
    bmc.add_argument("--bmc-password-stdin", action="store_true",
                     help="read the BMC password from stdin into the secrets file")
    bmc.add_argument("--bmc-scheme", dest="bmc_scheme", choices=["http", "https"])
    bmc.add_argument("--bmc-cipher-suite", dest="bmc_cipher_suite", type=int,
                     help="IPMI cipher suite (3 = SHA1 for older BMCs, 17 = SHA256)")
    bmc.add_argument("--bmc-ca-file", dest="bmc_ca_file")
    bmc.add_argument("--bmc-timeout", dest="bmc_timeout", type=float,
                     help="seconds per BMC call (0 < T <= 600)")
    bmc.add_argument("--bmc-verify-tls", dest="bmc_verify_tls", action=argparse.BooleanOptionalAction)
    bmc.add_argument("--bmc-boot-once", dest="bmc_boot_once", action=argparse.BooleanOptionalAction,
                     help="--no-bmc-boot-once: the BMC lacks one-time boot override")
    extra = parser.add_argument_group("lists and maps")
    extra.add_argument("--kernel-arg", action="append", metavar="ARG",
                       help="one kernel argument (repeat for more)")
    extra.add_argument("--system-overlay", action="append", metavar="NAME",
                       help="repeat or comma-separate")
    extra.add_argument("--runtime-overlay", action="append", metavar="NAME",
                       help="repeat or comma-separate")
    extra.add_argument("--ssh-key", action="append", metavar="KEY",
                       help="authorized OpenSSH public key (repeat for more)")
    extra.add_argument("--tag", action="append", metavar="KEY=VALUE")
    nomad = parser.add_argument_group("Nomad and Ansible hand-off")
    nomad.add_argument("--nomad-datacenter")
    nomad.add_argument("--nomad-node-class")
    nomad.add_argument("--nomad-node-pool")
    nomad.add_argument("--nomad-server", action="append", metavar="ADDR",
                       help="repeat for more")
    nomad.add_argument("--nomad-meta", action="append", metavar="KEY=VALUE")
    nomad.add_argument("--ansible-repo")
    nomad.add_argument("--ansible-branch")
    nomad.add_argument("--ansible-playbook")
    nomad.add_argument("--ansible-var", action="append", metavar="KEY=VALUE")
    slurm = parser.add_argument_group("Slurm (slurm.conf's NodeName line: `slurm config`)")
    slurm.add_argument("--slurm-cpus", type=int, metavar="N")
    slurm.add_argument("--slurm-real-memory", type=int, metavar="MIB")
    slurm.add_argument("--slurm-feature", action="append", metavar="NAME",
                       help="repeat or comma-separate")
    if editing:
        parser.add_argument("--unset", action="append", metavar="FIELD",
                            help="remove a field, e.g. image, tags.rack, netdevs.eth1, bmc")


def record_edits(args: argparse.Namespace, count: int) -> list[dict]:
    """Per target record (count of them), the fields the flags set, as nested data; a
    range's addresses count up (spread_addresses). Paths are tuples: a netdev, tag or
    variable name may hold a dot (eth0.100, rack.row)."""
    edits: dict[tuple[str, ...], object] = {}
    for dest, field in SCALAR_FLAGS.items():
        if getattr(args, dest, None) is not None:
            edits[_path(field)] = getattr(args, dest)
    for dest, field in LIST_FLAGS.items():
        if getattr(args, dest, None):
            edits[_path(field)] = _list(getattr(args, dest), dest in COMMA_LISTS)
    for dest, field in MAP_FLAGS.items():
        for item in getattr(args, dest, None) or []:
            key, value = _split_pair(item, dest.replace("_", "-"))
            edits[(*_path(field), key)] = value
    if getattr(args, "profile", None):
        edits[("profiles",)] = _list(args.profile, True)
    for key in (*BMC_FLAGS, "verify_tls", "boot_once"):
        if getattr(args, f"bmc_{key}", None) is not None:
            edits[("bmc", key)] = getattr(args, f"bmc_{key}")
    if args.bmc_password_file:
        edits[("bmc", "password_file")] = str(Path(args.bmc_password_file).expanduser().resolve())
    for key in NETDEV_FLAGS:
        if getattr(args, key, None) is not None:
            edits[("netdevs", args.netdev, key)] = getattr(args, key)
    if args.primary:
        edits[("netdevs", args.netdev, "primary")] = True
    nested: dict = {}
    for path, value in edits.items():
        _assign(nested, path, value)
    return spread_addresses(nested, count)


def apply_edits(record: Record, edits: dict, unset: list[str], what: str) -> Record:
    """A new record: `record` with `unset` fields removed and `edits` merged in (mappings
    key by key; a list or a value replaces), validated."""
    data = record.to_data()
    for path in unset or []:
        _remove(data, path, what)
    _merge(data, edits)
    try:
        return Record.model_validate(data)
    except ValidationError as exc:
        raise InvalidInventory(f"{what}: {describe_validation_error(exc)}") from None


def _merge(data: dict, edits: dict) -> None:
    for key, value in edits.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            _merge(data[key], value)
        else:
            data[key] = value


def _list(values: list[str], comma_separated: bool) -> list[str]:
    if not comma_separated:
        return list(values)
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


def _split_pair(item: str, flag: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise InvalidInput(f"--{flag}: expected KEY=VALUE, got {item!r}")
    return key.strip(), value.strip()


def _path(field: str) -> tuple[str, ...]:
    """A field path of this module's tables ("nomad.meta"): their names hold no dot."""
    return tuple(field.split("."))


def _assign(data: dict, path: tuple[str, ...], value) -> None:
    for key in path[:-1]:
        data = data.setdefault(key, {})
    data[path[-1]] = value


def find_field(data: dict, field: str) -> tuple[dict, str] | None:
    """The mapping holding the dotted `field` and its key there, or None. At each level the
    longest run of parts naming a key is taken: netdevs.eth0.100.mac is the mac of netdev
    eth0.100, tags.rack.row the tag rack.row."""
    parts = field.split(".")
    while isinstance(data, dict):
        key = next((".".join(parts[:n]) for n in range(len(parts), 0, -1)
                    if ".".join(parts[:n]) in data), None)
        if key is None:
            return None
        parts = parts[key.count(".") + 1:]
        if not parts:
            return data, key
        data = data[key]
    return None


def _remove(data: dict, field: str, what: str) -> None:
    found = find_field(data, field)
    if found is None:  # image.x, profiles.gpu: not a field either
        raise InvalidInput(f"{what}: --unset {field}: field is not set")
    del found[0][found[1]]
