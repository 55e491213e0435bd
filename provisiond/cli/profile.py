"""`provisiond profile add|set|list|show|delete`."""

from provisiond.cli.records import register_verbs
from provisiond.service.inventory import PROFILES


def register(subparsers) -> None:
    register_verbs(subparsers, PROFILES)
