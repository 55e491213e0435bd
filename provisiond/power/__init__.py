"""Power and firmware: the BMC driver interface, the redfish/ipmi/fake drivers, fan-out
over node ranges, and reprovision (PXE once, power cycle, wait for ready). The CLI verbs are
in provisiond.cli.power, run as jobs (provisiond.jobs)."""

from __future__ import annotations

from provisiond.power.fanout import NodeResult
from provisiond.power.reprovision import reprovision

__all__ = ["NodeResult", "reprovision"]
