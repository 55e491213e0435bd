"""Which node is which: one-time provisioning tokens (tokens.py), the node credentials
they are exchanged for (credentials.py), refusals made visible (refusals.py).
DESIGN.md section 6; README "Security" says what this protects and what not."""

from provisiond.trust.credentials import (ProvisioningTokenRefused, Refusal, authenticate,
                                          exchange, forget, has_credential, revoke)
from provisiond.trust.refusals import RefusalLog

__all__ = ["ProvisioningTokenRefused", "Refusal", "RefusalLog", "authenticate", "exchange",
           "forget", "has_credential", "revoke"]
