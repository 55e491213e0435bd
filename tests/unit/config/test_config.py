"""Settings: defaults, the commented template, clear errors for bad files."""

from pathlib import Path

import pytest

from provisiond.config import CONFIG_TEMPLATE, load_config, resolve_state_dir, write_default_config
from provisiond.errors import InvalidConfig
from provisiond.state.layout import overlay_search_path


def test_template_parses_to_the_defaults(tmp_path):
    write_default_config(tmp_path)
    assert (tmp_path / "provisiond.yaml").read_text() == CONFIG_TEMPLATE
    config = load_config(tmp_path)
    assert config.http.port == 9873 and config.tftp.root == "/usr/lib/ipxe"
    assert config.state_dir == tmp_path
    assert config.blob_dir == tmp_path / "blobs" / "sha256"


def test_existing_config_is_kept(tmp_path):
    (tmp_path / "provisiond.yaml").write_text("http: {port: 8080}\n")
    write_default_config(tmp_path)
    assert load_config(tmp_path).http.port == 8080


@pytest.mark.parametrize("text, message", [
    ("http: [", "not valid YAML"),
    ("- a\n- b\n", "expected a mapping"),
    ("http: {port: eighty}\n", "http.port"),
    ("dhcp: {colour: red}\n", "dhcp.colour"),
    ("server: {address: 10.0.0.300}\n", "server.address"),
])
def test_bad_config_is_one_clear_error(tmp_path, text, message):
    (tmp_path / "provisiond.yaml").write_text(text)
    with pytest.raises(InvalidConfig, match=message):
        load_config(tmp_path)


def test_site_overlays_shadow_shipped_ones(tmp_path):
    search = overlay_search_path(load_config(tmp_path))
    assert search[0] == tmp_path / "overlays"
    assert search[-1].name == "overlays"


def test_server_url_brackets_ipv6(tmp_path):
    (tmp_path / "provisiond.yaml").write_text("server: {address: 10.0.0.1}\nhttp: {port: 8080}\n")
    assert load_config(tmp_path).server_url == "http://10.0.0.1:8080"
    (tmp_path / "provisiond.yaml").write_text("server: {address: 'fd00::1'}\n")
    assert load_config(tmp_path).server_url == "http://[fd00::1]:9873"


@pytest.mark.parametrize("text, message", [
    ("dhcp: {lease_seconds: -5}\n", "dhcp.lease_seconds: -5 is outside 60-4294967295"),
    ("dhcp: {port: 99999}\n", "dhcp.port: 99999 is outside 1-65535"),
    ("http: {port: 70000}\n", "http.port: 70000 is outside 1-65535"),
    ("http: {port: 0}\n", "http.port: 0 is outside"),
    ("dns: {ttl: -1}\n", "dns.ttl: -1 is outside"),
    ("server: {domain: a..b}\n", "server.domain: 'a..b': label ''"),
    (f"server: {{domain: {'x' * 70}.org}}\n", "server.domain: .* label 'xxx"),
    ("server: {domain: -a.org}\n", "server.domain"),
    ("server: {domain: 'a_b'}\n", "server.domain"),
    ('server: {domain: "cluster\\n"}\n', "server.domain: .* label 'cluster"),  # $ matched before \n
    ("http: {workers: 0}\n", "http.workers: 0 is outside 1-64"),
    ("http: {connections: 0}\n", "http.connections: 0 is outside"),
    ("http: {bind: 'not an address'}\n", "http.bind: not an IP address"),
    ("http: {bind: 'fe80::1%eth0'}\n", "http.bind: .*scope id"),
    ("tftp: {port: -1}\n", "tftp.port"),
    ("tftp: {root: relative/dir}\n", "tftp.root: 'relative/dir': an absolute path"),
    ("dns: {port: 65536}\n", "dns.port"),
    ("dns: {ttl: 2147483648}\n", "dns.ttl"),
    ("dhcp: {bind: '::'}\n", "dhcp.bind: .*IPv4"),
    ("dhcp: {dns_servers: ['fd00::1']}\n", "dhcp.dns_servers.0: .*IPv4"),
    ("dhcp: {dns_servers: [10.0.0.256]}\n", "dhcp.dns_servers.0: not an IP address"),
    ("dhcp: {interface: 'eth0 x'}\n", "dhcp.interface"),
    ("dhcp: {interface: 'averyveryverylongname'}\n", "dhcp.interface"),
    ("server: {address: 0.0.0.0}\n", "server.address: .*not an address nodes can reach"),
    ("server: {address: 224.0.0.1}\n", "server.address"),
    ("server: {address: '::ffff:10.0.0.1'}\n",
     "server.address: .*IPv4-mapped.*write 10.0.0.1"),
    ("server: {ssh_authorized_keys: [\"ssh-ed25519 AAAA a\\nssh-rsa evil\"]}\n",
     "server.ssh_authorized_keys.0: .*control or format character"),
    ("server: {ssh_authorized_keys: [\"ssh-ed25519 AAAA \\u202egnp.exe\"]}\n",
     "server.ssh_authorized_keys.0: .*control or format character"),
    ("build: {compression: lzma}\n", "build.compression: 'lzma' is not one of zstd, gzip"),
    ("build: {workers: -1}\n", "build.workers"),
    ("power: {concurrency: 0}\n", "power.concurrency"),
    ("power: {timeout: -5}\n", "power.timeout"),
    ("power: {timeout: .nan}\n", "power.timeout: nan is outside"),
    ("power: {timeout: .inf}\n", "power.timeout"),
    ("dns: {upstream: 'a b'}\n", "dns.upstream: .*'a b'"),
    ("dns: {upstream: 'fe80::1%lo'}\n", "dns.upstream: .*scope id"),
    ("dns: {upstream: '[fe80::1%lo]:53'}\n", "dns.upstream: .*scope id"),
    ("dns: {upstream: '10.0.0.300:53'}\n", "dns.upstream: not an IP address"),
    ("dns: {upstream: 'resolver.example-:53'}\n", "dns.upstream: .*label 'example-'"),
    ("dns: {upstream: '127.0.0.1'}\n", "dns: upstream 127.0.0.1 is this DNS server itself"),
    ("dns: {bind: '::', port: 5353, upstream: '[::1]:5353'}\n", "dns: .* itself"),
    ("dns: {bind: 10.0.0.1, upstream: '10.0.0.1:53'}\n", "dns: .* itself"),
    ("server: {address: 10.0.0.5}\ndiscovery: {pool: 10.0.0.2-10.0.0.9}\n",
     "discovery.pool: .* holds 10.0.0.5, the server.address"),
    ("discovery: {pool: 10.0.0.2-10.0.0.9, gateway: 10.0.0.3}\n",
     "discovery: pool: .* holds 10.0.0.3, the discovery.gateway"),
    ("discovery: {pool: 10.0.0.0-10.0.0.9}\n", "discovery: pool: .* holds 10.0.0.0, the network address"),
    ("discovery: {pool: 10.0.0.250-10.0.1.9}\n", "discovery: pool: .* holds 10.0.0.255, the broadcast address"),
    ("discovery: {pool: 10.0.0.10-10.0.0.20, gateway: 10.1.0.1}\n",
     "discovery: gateway: 10.1.0.1 is outside"),
    ("peers: {urls: ['ftp://10.0.0.2']}\n", "peers.urls.0: 'ftp://10.0.0.2': an http://"),
    ("peers: {urls: ['10.0.0.2:9873']}\n", "peers.urls.0: .*an http://"),
    ("peers: {urls: ['http://a b:9873']}\n", "peers.urls.0"),
    ("peers: {urls: ['http://10.0.0.2:9873/?x=1']}\n", "peers.urls.0"),
    ("peers: {urls: ['http://10.0.0.2:99999']}\n", "peers.urls.0: .*an http://"),
    ("peers: {urls: ['http://10.0.0.2:98x3']}\n", "peers.urls.0: .*an http://"),
    ("peers: {urls: ['http://10.0.0.2:0']}\n", "peers.urls.0: .*an http://"),
    ("peers: {urls: ['http://admin:pw@10.0.0.2:9873']}\n", "peers.urls.0: .*an http://"),
    ("peers: {timeout: 0}\n", "peers.timeout: 0.0 is outside 0.5-300"),
    ("peers: {fetch_seconds: .inf}\n", "peers.fetch_seconds"),
])
def test_out_of_range_settings_are_one_line_at_load(tmp_path, text, message):
    """Each of these gave a traceback or a dead service once `serve` ran; now the settings
    do not load, with one line naming the setting."""
    (tmp_path / "provisiond.yaml").write_text(text)
    with pytest.raises(InvalidConfig, match=message) as caught:
        load_config(tmp_path)
    assert "\n" not in str(caught.value) and "Value error" not in str(caught.value)


@pytest.mark.parametrize("text, check", [
    ("http: {bind: '[::]'}\n", lambda c: c.http.bind == "::"),
    ("server: {domain: Cluster.Example.}\n", lambda c: c.server.domain == "cluster.example"),
    ("server: {address: 'FD00:0::1'}\n", lambda c: c.server.address == "fd00::1"),
    ("dhcp: {lease_seconds: 4294967295}\n", lambda c: c.dhcp.lease_seconds == 0xFFFFFFFF),
    ("dns: {upstream: '[::1]:5353'}\n", lambda c: c.dns.upstream_address == ("::1", 5353)),
    ("dns: {upstream: 'resolver.example'}\n",
     lambda c: c.dns.upstream_address == ("resolver.example", 53)),
    ("dns: {upstream: 'FD00:0::1'}\n", lambda c: c.dns.upstream_address == ("fd00::1", 53)),
    ("dns: {upstream: '10.0.0.1:5353'}\n",
     lambda c: c.dns.upstream_address == ("10.0.0.1", 5353)),
    ("dns: {port: 5300, upstream: '127.0.0.1'}\n",  # a local resolver on 53
     lambda c: c.dns.upstream_address == ("127.0.0.1", 53)),
    ("dns: {bind: 10.0.0.1, upstream: '127.0.0.1'}\n",
     lambda c: c.dns.upstream_address == ("127.0.0.1", 53)),
    ("peers: {urls: ['http://10.0.0.2:9873/', 'https://[fd00::2]:9873/pv']}\n",
     lambda c: c.peers.urls == ["http://10.0.0.2:9873", "https://[fd00::2]:9873/pv"]),
])
def test_good_settings_are_normalised(tmp_path, text, check):
    (tmp_path / "provisiond.yaml").write_text(text)
    assert check(load_config(tmp_path))


def test_an_unreadable_or_non_utf8_file_is_one_line(tmp_path):
    (tmp_path / "provisiond.yaml").write_bytes(b"server: {domain: caf\xe9}\n")
    with pytest.raises(InvalidConfig, match="not UTF-8"):
        load_config(tmp_path)


def test_check_serving_needs_the_tftp_root_and_ipv4_for_dhcp(tmp_path):
    from provisiond.config import check_serving

    (tmp_path / "provisiond.yaml").write_text(
        f"tftp: {{root: {tmp_path}/nothing}}\nserver: {{address: 'fd00::1'}}\n")
    config = load_config(tmp_path)  # loads: the root matters only to serve TFTP
    check_serving(config, {"tftp": False, "dhcp": False})
    with pytest.raises(InvalidConfig, match="tftp.root: .*/nothing is not a readable directory"):
        check_serving(config, {"tftp": True})
    with pytest.raises(InvalidConfig, match="server.address: DHCP .* IPv4"):
        check_serving(config, {"dhcp": True})


def test_a_relative_state_dir_is_made_absolute(tmp_path, monkeypatch):
    """`--state-dir state` then `serve`: Flask resolved the relative overlay paths against
    its package directory and answered 500 for every runtime overlay."""
    monkeypatch.chdir(tmp_path)
    write_default_config(Path("state"))
    assert load_config(Path("state")).state_dir == tmp_path / "state"
    assert resolve_state_dir("state") == tmp_path / "state"


def test_older_settings_are_migrated_with_a_backup_and_comments_kept(tmp_path, capsys):
    """Schema 1 (no `schema:` key) had http.threads; a file that used it is rewritten
    without it, one that did not only gets the schema line; the original stays beside."""
    from provisiond.cli import main

    path = tmp_path / "provisiond.yaml"
    plain = "# my site\nhttp:\n  port: 9999   # our port\n"
    path.write_text(plain)
    assert main(["--state-dir", str(tmp_path), "node", "list"]) == 0
    assert path.read_text() == "schema: 2\n" + plain
    assert (tmp_path / "provisiond.yaml.schema-1.bak").read_text() == plain
    old = "http:\n  threads: 8\n  port: 9998\n"
    path.write_text(old)
    assert load_config(tmp_path).http.port == 9998  # in memory, by any reader
    assert main(["--state-dir", str(tmp_path), "node", "list"]) == 0
    assert "threads" not in path.read_text() and "schema: 2" in path.read_text()
    assert (tmp_path / "provisiond.yaml.schema-1.bak").read_text() == old
    assert load_config(tmp_path).http.port == 9998


@pytest.mark.parametrize("schema, words", [(3, "written by a newer provisiond (settings "
                                               "schema 3; this one reads up to 2)"),
                                           ("two", "is not a version"), (0, "is not a version")])
def test_a_newer_or_bad_settings_schema_is_refused_untouched(tmp_path, capsys, schema, words):
    from provisiond.cli import main

    path = tmp_path / "provisiond.yaml"
    path.write_text(f"schema: {schema}\nhttp: {{port: 9999}}\n")
    before = path.read_bytes()
    assert main(["--state-dir", str(tmp_path), "node", "list"]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1
    assert path.read_bytes() == before and not list(tmp_path.glob("*.bak"))


def test_the_template_names_the_discovery_rules_file_that_is_read(tmp_path):
    from provisiond.discovery.rules import rules_path

    config = load_config(tmp_path)
    where = rules_path(config).relative_to(config.state_dir)
    assert f"<state>/{where}" in " ".join(CONFIG_TEMPLATE.replace("#", " ").split())
