"""Node credentials for the CLI: ended (provisiond.trust.revoke) with an audit record of who
ended them."""

from __future__ import annotations

from provisiond.config import Config
from provisiond.service.journal import audit
from provisiond.service.records import names_text
from provisiond.trust import revoke

__all__ = ["revoke_credentials"]


def revoke_credentials(config: Config, actor: str, names: list[str]) -> list[str]:
    """End the named nodes' credentials and every token minted for them until now; the
    names that had a credential. Recorded even when none had one: the tokens end too."""
    ended = revoke(config, names)
    audit(config, actor, "node.revoke", f"node:{names_text(names, 'node')}", ["credential"])
    return ended
