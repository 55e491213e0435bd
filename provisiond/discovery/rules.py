"""Discovery rules: `<state>/discovery/rules.yaml`, a YAML list; the first rule whose every
`match` pattern fits a machine's facts approves it with its profile and name sequence.

    - name: r650
      match: {dmi.product: "PowerEdge R650*", mac: "b0:26:28:*"}
      profile: compute
      names: n[065-128]
      ipaddr: 10.10.0.75

Patterns are shell globs (fnmatch, case-sensitive but for `mac`) on the fact's text; a
number or a boolean matches its text too (cpu.threads: 64). Fact names: provisiond.discovery.facts.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from provisiond.config import LABEL_RE, Config, ipv4_literal
from provisiond.discovery.facts import FACT_NAMES
from provisiond.documents import YamlLoader, check_shape, decode_text
from provisiond.errors import InvalidInput
from provisiond.inventory.ranges import expand
from provisiond.inventory.store import describe_validation_error
from provisiond.inventory.values import check_name
from provisiond.state.layout import Layout

MAX_RULES = 1000


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=f"^{LABEL_RE.pattern}$")
    match: dict[str, str | int | bool] = Field(min_length=1)
    profile: str | None = None
    names: str = Field(min_length=1, max_length=1000, description="a node range")
    ipaddr: str | None = None
    netdev: str = Field("eth0", pattern=r"^[^\s/:]{1,15}$")
    gateway: str | None = None

    @field_validator("names")
    @classmethod
    def _names(cls, value: str) -> str:
        """A range of node names (checked here, or every approval by the rule fails)."""
        try:
            names = expand(value)
        except InvalidInput as exc:
            raise ValueError(str(exc)) from None
        for name in names:
            check_name(name, "node name")
        return value

    @field_validator("ipaddr", "gateway")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        return ipv4_literal(value) if value is not None else None

    @field_validator("profile")
    @classmethod
    def _profile(cls, value: str | None) -> str | None:
        return check_name(value, "profile name") if value is not None else None

    @field_validator("match")
    @classmethod
    def _known_facts(cls, value: dict) -> dict:
        unknown = sorted(set(value) - set(FACT_NAMES))
        if unknown:
            raise ValueError(f"unknown fact {unknown[0]!r} (facts: {', '.join(FACT_NAMES)})")
        if isinstance(value.get("mac"), str):  # MACs are kept in lowercase
            value["mac"] = value["mac"].lower()
        return value

    def matches(self, flat: dict[str, object]) -> bool:
        return all(flat.get(key) is not None and fnmatch.fnmatchcase(
            fact_text(flat[key]), fact_text(pattern)) for key, pattern in self.match.items())


def fact_text(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def rules_path(config: Config) -> Path:
    return Layout.of(config).discovery_rules


def load_rules(config: Config, path: Path | None = None) -> list[Rule]:
    """The rules of `path` (default: the state dir's, where a missing file is no rules; a
    file named to be checked must be there). InvalidInput names the file and the rule at
    fault."""
    default, path = path is None, path or rules_path(config)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        if default and isinstance(exc, FileNotFoundError):
            return []
        raise InvalidInput(f"{path}: cannot read: {exc.strerror or exc}") from None
    return parse_rules(decode_text(raw, str(path)), str(path))


def parse_rules(text: str, origin: str) -> list[Rule]:
    try:
        check_shape(text, origin)
        data = yaml.load(text, Loader=YamlLoader) or []
    except yaml.YAMLError as exc:
        raise InvalidInput(f"{origin}: not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, list):
        raise InvalidInput(f"{origin}: expected a list of rules")
    if len(data) > MAX_RULES:
        raise InvalidInput(f"{origin}: {len(data)} rules; at most {MAX_RULES}")
    rules = []
    for index, entry in enumerate(data, 1):
        try:
            rules.append(Rule.model_validate(entry))
        except ValidationError as exc:
            raise InvalidInput(f"{origin}: rule {index}: "
                               f"{describe_validation_error(exc, from_yaml=True)}") from None
    names = [rule.name for rule in rules]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise InvalidInput(f"{origin}: rule name {twice[0]!r} is given twice")
    return rules


def first_match(rules: list[Rule], flat: dict[str, object]) -> Rule | None:
    return next((rule for rule in rules if rule.matches(flat)), None)
