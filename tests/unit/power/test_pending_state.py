"""power.pending and power.fake on the layout's files, through state.local and the models."""

import json

from provisiond.power import pending
from provisiond.state.layout import Layout
from provisiond.states import NodePhase
from provisiond.status import record_phase


def test_a_reset_is_due_once_the_node_is_ready_from_a_newer_boot(config):
    pending.add_pending(config, "n1")
    assert not pending.due_for_reset(config, "n1")
    record_phase(config, "n1", NodePhase.DHCP)
    record_phase(config, "n1", NodePhase.READY)
    assert pending.due_for_reset(config, "n1")
    text = Layout.of(config).pending_bootdev.read_text()
    assert text == json.dumps(pending.read_pending(config), indent=1, sort_keys=True)
    pending.clear_pending(config, "n1")
    assert pending.read_pending(config) == {}


def test_a_damaged_status_owes_no_reset_and_raises_nothing(config):
    """A status whose boot_started is no number (a hand edit) made every power job that
    settles boot devices fail with a TypeError."""
    pending.add_pending(config, "n1")
    path = Layout.of(config).status("n1")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"node": "n1", "phase": "ready", "boot_started": "soon"}))
    assert not pending.due_for_reset(config, "n1")


def test_clearing_a_reset_nobody_owes_writes_nothing(config):
    pending.clear_pending(config, "n9")
    assert not Layout.of(config).pending_bootdev.exists()
