"""`provisiond slurm config`: slurm.conf from the inventory, the power programs it names,
and the `slurm` overlay that gives nodes the same file and the munge key."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from provisiond import archive
from provisiond.config import load_config
from provisiond.inventory import load_nodes
from provisiond.inventory.secrets import SecretStore
from provisiond.overlays import OverlayBuildFailed, build_overlays, ensure_overlay
from provisiond.power.fake import read_fake_bmcs
from provisiond.slurm.conf import NODES_PER_LINE, render_conf
from provisiond.state.layout import Layout


@pytest.fixture
def cluster(cli):
    """n[1-3] Slurm nodes (n3 tagged into two partitions), n4 not (no slurm overlay)."""
    for args in (["n[1-3]", "--ipaddr", "10.0.0.11", "--runtime-overlay", "ssh,slurm",
                  "--slurm-cpus", "4", "--slurm-real-memory", "7800", "--bmc-driver", "fake",
                  "--bmc-address", "bmc"],
                 ["n4", "--ipaddr", "10.0.0.30"]):
        assert cli("node", "add", *args).code == 0
    assert cli("node", "set", "n3", "--tag", "partition=gpu,debug", "--slurm-feature",
               "a100").code == 0
    return cli


def settings(state_dir, **slurm) -> None:
    path = state_dir / "provisiond.yaml"
    data = yaml.safe_load(path.read_text())
    data["slurm"] = slurm
    path.write_text(yaml.safe_dump(data))


def conf_lines(config) -> list[str]:
    return render_conf(config, load_nodes(config)).text.splitlines()


def test_node_lines_group_equal_nodes_with_their_addresses(cluster, config):
    lines = conf_lines(config)
    assert "NodeName=n[1-2] NodeAddr=10.0.0.11,10.0.0.12 CPUs=4 RealMemory=7800" in lines
    assert "NodeName=n3 NodeAddr=10.0.0.13 CPUs=4 RealMemory=7800 Feature=a100" in lines
    assert not [line for line in lines if "n4" in line]  # it does not list the overlay


def test_partitions_come_from_the_tag_and_the_default_comes_first(cluster, config):
    partitions = [line for line in conf_lines(config) if line.startswith("PartitionName=")]
    assert partitions == [
        "PartitionName=compute Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP",
        "PartitionName=debug Nodes=n3 MaxTime=INFINITE State=UP",
        "PartitionName=gpu Nodes=n3 MaxTime=INFINITE State=UP"]


def test_power_saving_names_the_programs_and_settings_override_defaults(cluster, state_dir):
    settings(state_dir, suspend_time=120, resume_timeout=900, controller="ctl1",
             controller_address="10.0.0.1", options={"ReturnToService": 1, "SlurmUser": "slurm"})
    config = load_config(state_dir)
    lines = conf_lines(config)
    for line in ("SlurmctldHost=ctl1(10.0.0.1)", "SuspendTime=120", "ResumeTimeout=900",
                 f"ResumeProgram={state_dir}/slurm/resume",
                 f"SuspendProgram={state_dir}/slurm/suspend", "ReturnToService=1",
                 "SlurmUser=slurm", "AuthType=auth/munge"):
        assert line in lines
    assert "ReturnToService=2" not in lines


def test_without_suspend_time_power_saving_is_off(cluster, config):
    assert not [line for line in conf_lines(config) if line.startswith(("Suspend", "Resume"))]


def test_many_nodes_are_split_into_bounded_lines(cli, config):
    count = 2 * NODES_PER_LINE + 2
    assert cli("node", "add", f"c[1-{count}]", "--runtime-overlay", "slurm",
               "--ipaddr", "10.1.0.1", "--slurm-cpus", "2").code == 0
    lines = [line for line in conf_lines(config) if line.startswith("NodeName=")]
    assert [line.split()[0] for line in lines] == [
        f"NodeName=c[1-{NODES_PER_LINE}]",
        f"NodeName=c[{NODES_PER_LINE + 1}-{2 * NODES_PER_LINE}]",
        f"NodeName=c[{2 * NODES_PER_LINE + 1}-{count}]"]
    assert all(len(line.split()[1].split(",")) <= NODES_PER_LINE for line in lines)


def test_no_slurm_node_or_a_bad_partition_tag_is_one_line_and_writes_nothing(cli, config):
    assert cli("node", "add", "n1").code == 0
    result = cli("slurm", "config")
    assert result.code != 0
    assert result.err.strip() == ("provisiond: error: no node lists the 'slurm' runtime "
                                  "overlay: slurm.conf would name no node")
    assert cli("node", "set", "n1", "--runtime-overlay", "slurm", "--tag",
               "partition=a b").code == 0
    result = cli("slurm", "config")
    assert result.code != 0 and len(result.err.strip().splitlines()) == 1
    assert "n1: tag partition: 'a b' is not a partition name" in result.err
    assert not Layout.of(config).slurm_conf.exists()


def test_the_written_resume_program_pxe_boots_through_the_fake_bmc(cluster, config, tmp_path):
    """The program slurm.conf names, run as slurmctld runs it: the hostlist its only
    argument (a real process, this interpreter's provisiond), from a working directory
    whose own `provisiond` package it must not run."""
    assert cluster("slurm", "config").code == 0
    program = Layout.of(config).slurm / "resume"
    decoy = tmp_path / "cwd" / "provisiond"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("")
    (decoy / "__main__.py").write_text("raise SystemExit(99)\n")
    done = subprocess.run([str(program), "n[1-2]"], capture_output=True, text=True,
                          timeout=120, cwd=decoy.parent)
    assert done.returncode == 0, done.stderr
    bmcs = read_fake_bmcs(config.state_dir / "power" / "fake-bmcs.json")
    assert [bmcs[n]["boots"] for n in ("n1", "n2")] == [["pxe"], ["pxe"]]
    done = subprocess.run([str(Layout.of(config).slurm / "suspend"), "n[1-2]"], timeout=120)
    assert done.returncode == 0
    bmcs = read_fake_bmcs(config.state_dir / "power" / "fake-bmcs.json")
    assert {bmcs[n]["power"] for n in ("n1", "n2")} == {"off"}


def unpacked(path) -> dict[str, archive.Entry]:
    return {e.path: e for e in archive.unpack(archive.decompress(path.read_bytes()))}


def test_the_overlay_gives_nodes_the_written_file_and_their_munge_key(cluster, config):
    key = "bXVuZ2Uta2V5LW9mLXRoZS1jbHVzdGVyLWF0LWxlYXN0LTMyLWJ5dGVz"
    SecretStore(config).set("nodes", ["n1", "n2", "n3"], "munge.key", key)
    assert cluster("slurm", "config").code == 0
    files = unpacked(ensure_overlay(config, "n1", "runtime"))
    assert files["etc/slurm/slurm.conf"].data == Layout.of(config).slurm_conf.read_bytes()
    assert files["etc/munge/munge.key"].data == key.encode()  # byte for byte: munged's key
    assert files["etc/munge/munge.key"].mode & 0o777 == 0o400
    assert files["etc/munge"].mode & 0o777 == 0o700


def test_rewriting_an_unchanged_conf_rebuilds_no_overlay_a_changed_one_all(cluster, config):
    SecretStore(config).set("nodes", ["n1", "n2", "n3"], "munge.key", "k" * 40)
    assert cluster("slurm", "config").code == 0
    assert build_overlays(config, kinds=("runtime",))["rebuilt"]["runtime"] == 4
    assert cluster("slurm", "config").code == 0
    assert build_overlays(config, kinds=("runtime",))["rebuilt"]["runtime"] == 0
    assert cluster("node", "set", "n1", "--slurm-cpus", "8").code == 0
    assert cluster("slurm", "config").code == 0
    assert build_overlays(config, kinds=("runtime",))["rebuilt"]["runtime"] == 3  # not n4


def test_a_slurm_node_built_before_slurm_config_fails_with_a_hint(cluster, config):
    SecretStore(config).set("nodes", ["n1"], "munge.key", "k" * 40)
    with pytest.raises(OverlayBuildFailed) as failed:
        build_overlays(config, ["n1"], kinds=("runtime",))
    assert "run `provisiond slurm config`" in str(failed.value)


@pytest.mark.parametrize("slurm, message", [
    ({"options": {"SlurmUser": "a b"}}, "slurm.options.SlurmUser: 'a b': a slurm.conf value"),
    ({"options": {"Slurm-User": "x"}}, "'Slurm-User' is not a slurm.conf key"),
    ({"options": {"Prolog": "/x#y"}}, "without blanks, '#' or control characters"),
    ({"resume_program": "resume"}, "'resume': an absolute path without blanks"),
    ({"default_partition": "a,b"}, "'a,b': 1-64 letters, digits"),
    ({"suspend_time": -5}, "-5 is outside 0-"),
])
def test_a_bad_slurm_setting_is_one_clear_line(cli, state_dir, slurm, message):
    settings(state_dir, **slurm)
    result = cli("slurm", "config")
    assert result.code == 2 and len(result.err.strip().splitlines()) == 1, result.err
    assert message in result.err and "provisiond.yaml: slurm." in result.err


def test_cpus_come_from_reported_facts_when_the_record_has_none(cluster, config, cli):
    from provisiond.discovery.facts import Cpu, Facts, record_facts

    assert cli("node", "add", "n5", "--ipaddr", "10.0.0.15", "--runtime-overlay",
               "slurm").code == 0
    for name in ("n1", "n5"):  # n1's record says 4 CPUs: the record wins
        record_facts(config, name, Facts(cpu=Cpu(sockets=2, cores=16, threads=32),
                                         memory_mib=131072))
    lines = conf_lines(config)
    assert "NodeName=n5 NodeAddr=10.0.0.15 CPUs=32" in lines
    assert "NodeName=n[1-2] NodeAddr=10.0.0.11,10.0.0.12 CPUs=4 RealMemory=7800" in lines


def test_a_slurm_node_without_a_munge_key_fails_saying_how_to_set_it(cluster, config):
    assert cluster("slurm", "config").code == 0
    result = cluster("overlay", "build", "n1")
    assert result.code != 0 and len(result.err.strip().splitlines()) == 1, result.err
    assert "secret munge.key of node n1 is not set" in result.err, result.err
    assert "provisiond secret set node n1 munge.key" in result.err, result.err
