"""The GPU image's Python, here: what bench/gpu.py carries there, and a rehearsal where only what
the image has can be imported.

    python bench/gpu_env.py site                      bench/.gpu_site: the packages to carry
    python bench/gpu_env.py shaped [--site DIR] -- CMD ...

For a GPU host where nothing can be installed and whose Python (3.12 on the host this was
written for) has torch, Lightning, torchmetrics and transformers (and their dependencies); on
any other GPU machine, install as bench/gpu.py says. `site` installs what train.py needs beyond
that (CARRIED: hydra-core, omegaconf and its parser runtime, torchao for float8), at the
versions installed here, into `bench/.gpu_site` (ignored by git; copy it to the GPU machine
with the checkout; it stays under 60 MiB). They are pure Python, so a 3.11 install serves 3.12;
torchao's compiled kernels are optional and not used by float8 training.

`shaped` runs CMD in a throwaway virtual environment that sees only the image's packages (the
dependency closure of IMAGE, linked from this environment) and, on PYTHONPATH, the carried site
(`--site`, default bench/.gpu_site; `--site here` links the CARRIED packages from this
environment instead, so no install is needed). An import the image cannot satisfy fails here
as it would there. What it cannot show: the image's Python (3.12) and torch (2.11) versions.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import os
import shutil
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "bench" / ".gpu_site"
IMAGE = ("torch", "lightning", "torchmetrics", "transformers")
"""What the GPU image this was written for has installed, with their dependencies."""
CARRIED = ("hydra-core", "omegaconf", "antlr4-python3-runtime", "torchao")
"""What train.py needs beyond the image, carried as bench/.gpu_site."""
CARRY_LIMIT_BYTES = 60 * 2**20


def closure(names) -> list[metadata.Distribution]:
    """The installed distributions `names` need, themselves included (markers evaluated for
    this interpreter, extras not followed)."""
    from packaging.requirements import Requirement

    seen: dict[str, metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        key = name.lower().replace("_", "-")
        if key in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # an optional dependency this environment does not have
        seen[key] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def top_level(dist: metadata.Distribution) -> set[str]:
    """The names a distribution installed at the top of site-packages (packages, modules and
    its .dist-info)."""
    names = set()
    for file in dist.files or []:
        first = file.parts[0]
        if first not in ("..", "__pycache__") and not first.endswith(".pth"):
            names.add(first)
    return names


def link(dists, into: Path) -> None:
    into.mkdir(parents=True, exist_ok=True)
    for dist in dists:
        base = Path(dist.locate_file(""))
        for name in top_level(dist):
            source, target = base / name, into / name
            if source.exists() and not target.exists():
                target.symlink_to(source)


def build_site(target: Path = SITE) -> int:
    """pip-install CARRIED (this environment's versions, no dependencies) into `target`."""
    pins = [f"{name}=={metadata.version(name)}" for name in CARRIED]
    shutil.rmtree(target, ignore_errors=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--no-compile",
        "--target",
        str(target),
        *pins,
    ]
    subprocess.run(cmd, check=True)
    size = sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
    print(f"{target}: {', '.join(pins)}; {size / 2**20:.1f} MiB")
    if size > CARRY_LIMIT_BYTES:
        print(
            f"error: {size / 2**20:.1f} MiB is over the {CARRY_LIMIT_BYTES / 2**20:.0f} MiB "
            "meant to travel with a checkout",
            file=sys.stderr,
        )
        return 1
    return 0


def shaped(cmd: list[str], site: str) -> int:
    """Run `cmd` where only the image's packages and the carried site can be imported."""
    with tempfile.TemporaryDirectory(prefix="gpu-image-") as tmp:
        env_dir = Path(tmp) / "venv"
        venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)
        image = Path(tmp) / "image"
        link(closure(IMAGE), image)
        purelib = subprocess.run(
            [
                str(env_dir / "bin" / "python"),
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['purelib'])",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        Path(purelib, "gpu_image.pth").write_text(f"{image}\n")
        if site == "here":
            carried = Path(tmp) / "carried"
            link([metadata.distribution(n) for n in CARRIED], carried)
        else:
            carried = Path(site)
            if not carried.is_dir():
                print(
                    f"error: no carried site at {carried}; build it with "
                    "`python bench/gpu_env.py site`, or pass --site here",
                    file=sys.stderr,
                )
                return 2
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(carried.resolve())])
        env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env['PATH']}"
        env["VIRTUAL_ENV"] = str(env_dir)
        return subprocess.run(cmd, env=env, cwd=ROOT).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("site", help="install the carried packages into bench/.gpu_site")
    run = sub.add_parser("shaped", help="run a command in the GPU image's shape")
    run.add_argument("--site", default=str(SITE), help="the carried site, or 'here'")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args(argv)
    if args.command == "site":
        return build_site()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("shaped needs a command after --")
    return shaped(cmd, args.site)


if __name__ == "__main__":
    sys.exit(main())
