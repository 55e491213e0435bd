"""Layer cache benchmark: full build of an image vs a rebuild after its top layer changed.

    python bench/bench_images.py [--image tiny] [--image debian12] [--runs 3]

Each run builds the recipe in a fresh state dir with only the downloaded .debs cached (as
on a server that has built before; `--warm` also keeps the kernel module selection cached
beside the .deb, which makes a tiny "full" build mostly fixed overhead), then edits the top
layer's input (a copy recipe gets a changed file, a run recipe an extra command, a packages
recipe an extra package) and rebuilds. Target (DESIGN.md section 8): the top-layer rebuild
takes < 10% of the full build.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from provisiond.config import SHIPPED_DIR, load_config, write_default_config  # noqa: E402
from provisiond.images import build_image  # noqa: E402

TARGET = 0.10


def prepare(work: Path, image: str) -> tuple[object, Path]:
    """A fresh state dir whose recipe dir holds a copy of the shipped recipe."""
    recipes = work / "recipes"
    shutil.copytree(SHIPPED_DIR / "images", recipes)
    write_default_config(work / "state")
    (work / "state/provisiond.yaml").write_text(yaml.safe_dump({"image_dirs": [str(recipes)]}))
    return load_config(work / "state"), recipes / image


def touch_top_layer(folder: Path, run: int) -> None:
    """Change only the top layer's inputs."""
    path = folder / "image.yaml"
    recipe = yaml.safe_load(path.read_text())
    top = recipe["layers"][-1]
    if top["kind"] == "copy":
        source = folder / top["files"][0]["src"]
        source.write_text(source.read_text() + f"# bench change {run}\n")
    elif top["kind"] == "run":
        top["commands"].append(f"echo bench {run} > /etc/bench-change")
    elif top["kind"] == "packages":
        top["install"] = [*top["install"], "less"]
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))


def timed_build(config, image: str) -> tuple[float, dict]:
    started = time.monotonic()
    manifest = build_image(config, image)
    return time.monotonic() - started, manifest


def forget_derived(cache: Path) -> None:
    """Drop the kernel module selections kept beside the .debs (not the downloads)."""
    for path in (cache / "debs").glob("*.deb.*.tar"):
        path.unlink()


def bench(image: str, runs: int, warm: bool) -> dict:
    fulls, tops = [], []
    for run in range(runs):
        if not warm:
            forget_derived(Path(os.environ["PROVISIOND_CACHE_DIR"]))
        with tempfile.TemporaryDirectory(prefix="bench-images-") as tmp:
            config, folder = prepare(Path(tmp), image)
            full, first = timed_build(config, image)
            touch_top_layer(folder, run)
            top, second = timed_build(config, image)
            kept = sum(a["digest"] == b["digest"] for a, b in zip(first["layers"],
                                                                  second["layers"]))
            print(f"  run {run + 1}: full {full:7.2f}s  top-layer {top:6.2f}s  "
                  f"layers kept {kept}/{len(first['layers'])}  size "
                  f"{first['total_size'] / 2**20:.1f} MiB", flush=True)
            fulls.append(full)
            tops.append(top)
    full, top = statistics.median(fulls), statistics.median(tops)
    return {"image": image, "full": full, "top": top, "ratio": top / full}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", action="append", help="recipe to bench (default tiny)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warm", action="store_true",
                        help="keep derived download caches (module selections) between runs")
    args = parser.parse_args()
    os.environ.setdefault("PROVISIOND_CACHE_DIR", "/var/tmp/provisiond-test-cache")
    failed = False
    for image in args.image or ["tiny"]:
        print(f"{image}: {args.runs} run(s)", flush=True)
        result = bench(image, args.runs, args.warm)
        verdict = "PASS" if result["ratio"] < TARGET else "FAIL"
        failed |= verdict == "FAIL"
        print(f"{image}: full build {result['full']:.2f}s, top-layer rebuild "
              f"{result['top']:.2f}s, ratio {result['ratio']:.3f} "
              f"(target < {TARGET}) {verdict}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
