"""The secrets file: never taken for empty when it is not what it should be."""

import pytest

from provisiond.errors import InvalidInput
from provisiond.inventory.secrets import BMC_PASSWORD, SecretStore


@pytest.mark.parametrize("text, message", [
    ("- a list\n", "expected a mapping"),
    ("nodes:\n  n1: {bmc_password: one}\n  n1: {bmc_password: two}\n", "duplicate key 'n1'"),
    ("nodes: {n1: {bmc_password: 'hunter2}\n", "not valid YAML"),
])
def test_a_bad_secrets_file_is_an_error_and_is_not_overwritten(config, text, message):
    config.secrets_path.write_text(text)
    store = SecretStore(config)
    with pytest.raises(InvalidInput, match=message) as error:
        store.set("nodes", ["n2"], BMC_PASSWORD, "new")
    assert "hunter2" not in str(error.value) and "one" not in str(error.value).split("'")
    assert config.secrets_path.read_text() == text
