"""The build chroot's own logic without mounts: the privileges a build checks for first."""

from __future__ import annotations

import pytest

from provisiond.errors import Forbidden
from provisiond.images import chroot


def test_a_build_without_cap_mknod_is_refused_before_it_starts(monkeypatch):
    """The chroot's /dev is a tmpfs with device nodes made by the build: without CAP_MKNOD a
    build would stop half-way, so it is refused first, in one line naming what is missing."""
    monkeypatch.setattr(chroot, "effective_capabilities", lambda: ~(1 << 27))
    with pytest.raises(Forbidden) as refused:
        chroot.require_build_privileges()
    assert "CAP_MKNOD" in str(refused.value) and "CAP_SYS_ADMIN" not in str(refused.value)
    assert str(refused.value).count("\n") == 0
    monkeypatch.setattr(chroot, "effective_capabilities", lambda: ~0)
    chroot.require_build_privileges()
