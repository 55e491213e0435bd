"""Mounted layer formats measured on real layer trees: pack time, size, and the time to
read every file back through a read-only loop mount (a cold page cache: the image is
mounted fresh), beside the layer's cpio blob. Run as root on built layers:

    .venv/bin/python bench/bench_mounted_layers.py STATE_DIR IMAGE
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from provisiond.config import load_config  # noqa: E402
from provisiond.images import load_manifest  # noqa: E402
from provisiond.images.layers import layer_dir  # noqa: E402
from provisiond.images.squash import pack_image  # noqa: E402

# (format, compressor, level, squashfs block size); the default is squash.FORMATS's
CANDIDATES = [("squashfs", "zstd", 3, "128K"), ("squashfs", "zstd", 3, "1M"),
              ("squashfs", "zstd", 12, "256K"), ("squashfs", "zstd", 16, "256K"),
              ("squashfs", "zstd", 19, "256K"), ("squashfs", "zstd", 19, "1M"),
              ("squashfs", "lz4", None, "128K"), ("squashfs", "xz", None, "1M"),
              ("erofs", "lz4", None, None), ("erofs", "lz4hc", None, None)]


def read_back(image: Path, fs: str, mnt: Path) -> float:
    subprocess.run(["mount", "-t", fs, "-o", "loop,ro", str(image), str(mnt)], check=True)
    try:
        started = time.monotonic()
        subprocess.run(["tar", "-cf", "/dev/null", "--one-file-system", "-C", str(mnt), "."],
                       check=True, stdout=subprocess.DEVNULL)
        return time.monotonic() - started
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def main(state_dir: str, image: str) -> None:
    config = load_config(Path(state_dir))
    manifest = load_manifest(config, image)
    trees = [layer_dir(config) / layer["key"] for layer in manifest["layers"]]
    cpio = sum(layer["size"] for layer in manifest["layers"])
    print(f"{image}: {len(trees)} layers, cpio ({manifest['layers'][0]['compression']}) "
          f"{cpio / 2**20:.1f} MiB")
    print(f"{'format':10} {'comp':6} {'level':5} {'block':5} {'MiB':>7} {'pack s':>7} "
          f"{'read s':>7}")
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        mnt = Path(tmp) / "mnt"
        mnt.mkdir()
        for fs, comp, level, block in CANDIDATES:
            size = pack = read = 0.0
            for index, tree in enumerate(trees):
                out = Path(tmp) / f"{index}.{fs}"
                started = time.monotonic()
                pack_image(fs, tree, out, comp, level, block)
                pack += time.monotonic() - started
                size += out.stat().st_size
                read += read_back(out, fs, mnt)
                out.unlink()
            print(f"{fs:10} {comp:6} {str(level or '-'):5} {block or '-':5} "
                  f"{size / 2**20:7.1f} {pack:7.1f} {read:7.1f}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
