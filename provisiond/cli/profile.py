"""`provisiond profile add|set|list|show|delete`."""

from provisiond.cli.records import Kind, register_verbs


def register(subparsers) -> None:
    register_verbs(subparsers, Kind("profile"))
