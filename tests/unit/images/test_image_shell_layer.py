"""`write_layer`: an image shell's overlayfs upper dir as an OCI layer tarball."""

from __future__ import annotations

import io
import socket
import tarfile

from provisiond.images.shell import write_layer


def test_a_socket_left_by_the_session_is_skipped(tmp_path):
    """A daemon the session ran can leave a Unix socket behind (tar holds none; docker
    skips them too): it was an AttributeError traceback, the session's work lost."""
    upper = tmp_path / "upper"
    (upper / "run").mkdir(parents=True)
    (upper / "run/kept").write_text("x\n")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(upper / "run/daemon.sock"))
    listener.close()
    out = io.BytesIO()
    write_layer(upper, out)
    out.seek(0)
    with tarfile.open(fileobj=out) as layer:
        assert layer.getnames() == ["run", "run/kept"]
