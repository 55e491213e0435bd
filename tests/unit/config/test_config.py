"""Settings: defaults, the commented template, clear errors for bad files."""

import pytest

from provisiond.config import CONFIG_TEMPLATE, load_config, write_default_config
from provisiond.errors import InvalidConfig


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
    config = load_config(tmp_path)
    assert config.overlay_search_path[0] == tmp_path / "overlays"
    assert config.overlay_search_path[-1].name == "overlays"


def test_server_url_brackets_ipv6(tmp_path):
    (tmp_path / "provisiond.yaml").write_text("server: {address: 10.0.0.1}\nhttp: {port: 8080}\n")
    assert load_config(tmp_path).server_url == "http://10.0.0.1:8080"
    (tmp_path / "provisiond.yaml").write_text("server: {address: 'fd00::1'}\n")
    assert load_config(tmp_path).server_url == "http://[fd00::1]:9873"
