"""Reading the YAML documents provisiond is driven by (settings, inventory, recipes,
overlay metadata, apply files): libyaml when present, one clear line on any error."""

from __future__ import annotations

import yaml

from provisiond.errors import InvalidInput

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml_mapping(text: str | bytes, origin: str, error: type[InvalidInput] = InvalidInput,
                      expected: str = "a mapping") -> dict:
    """The mapping `text` holds (empty text is {}); `error` names `origin` otherwise."""
    try:
        data = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        raise error(f"{origin}: not valid YAML: {' '.join(str(exc).split())}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise error(f"{origin}: expected {expected}")
    return data
