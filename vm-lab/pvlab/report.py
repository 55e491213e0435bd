"""The node status table: each phase's time since the domain started, failures explained."""

from __future__ import annotations

from provisiond.states import NodePhase

SHOWN = ["dhcp", "ipxe", "kernel", "booted", "runtime", "ready"]


def status_rows(lab, statuses: dict[str, dict]) -> list[list[str]]:
    """One row per node: name, firmware, result, then seconds to each shown phase."""
    rows = []
    for name, status in statuses.items():
        node = lab.nodes[name]
        times = lab.phase_times(name, status) if node.started else {}
        phase = status.get("phase") or "none"
        result = "ready" if phase == NodePhase.READY.value else f"FAILED (last: {phase})"
        if not node.started:
            result = "not booted"
        rows.append([name, node.firmware, node.image, result,
                     *[f"{times[p]:.1f}" if p in times else "-" for p in SHOWN]])
    return rows


def format_table(rows: list[list[str]]) -> str:
    header = ["node", "firmware", "image", "result", *[f"{p} s" for p in SHOWN]]
    table = [header, *rows]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    return "\n".join("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip()
                     for row in table)


def failure_report(lab, statuses: dict[str, dict], lines: int = 15) -> str:
    """For each node that is not ready: its last phase, detail and serial console tail."""
    parts = []
    for name, status in statuses.items():
        if status.get("phase") == NodePhase.READY.value:
            continue
        detail = status.get("detail") or ""
        parts.append(f"--- {name}: last phase {status.get('phase') or 'none'} {detail}".rstrip()
                     + f"\n--- serial console tail ({lab.nodes[name].serial_log}):\n"
                     + lab.serial_tail(name, lines))
    return "\n".join(parts)


def describe(lab) -> str:
    """Where the lab's parts are and how to reach them."""
    state = lab.state
    lines = [f"lab dir {state.lab_dir}; namespace {state.netns} (br0 10.99.77.1/24); "
             f"accel {state.accel}",
             f"provisiond: --state-dir {state.state_dir}, serve pid {state.pids.get('serve', '-')}",
             f"libvirt: virsh -c '{state.libvirt_uri}'",
             f"lab network shell: ip netns exec {state.netns} bash",
             f"redfish: http://127.0.0.1:{state.redfish_port}/redfish/v1/Systems"]
    for node in lab.nodes.values():
        lines.append(f"  {node.name}: domain {node.domain} {node.firmware} mac {node.mac} "
                     f"ip {node.ipaddr} ipmi 127.0.0.1:{node.ipmi_port} uuid {node.uuid} "
                     f"serial {node.serial_log}")
    return "\n".join(lines)
