"""The project's images, built here from their own Dockerfiles, offline, and cached by content.

No public base image can be pulled on these machines, and pip inside a build cannot reach the
package index. So:

* the base is Debian bookworm made from Debian's packages (``debootstrap --variant=minbase`` with
  python3, pip and venv, imported with ``docker import``); on it the runner's own plain-OS base
  recipe (``images/runner/torchneuron-base.Dockerfile``) is built with CPU torch in place of
  TorchNeuron and no Neuron apt packages, playing the runner's production base (the Neuron DLC,
  which carries torch), passed as the ``BASE_IMAGE`` build arg; where the engine shares layers, the
  operator is built on the runner image (its Python base, with most of its packages found
  installed, see ``build_images``);
* the wheels come from a wheelhouse built on the host (``pip wheel`` of the package's
  dependencies, the runner's pinned transformers / huggingface_hub, CPU torch), constrained to the
  versions installed in this virtualenv, served over HTTP on 127.0.0.1 to a ``--network host``
  build through the Dockerfiles' ``PIP_NO_INDEX`` / ``PIP_FIND_LINKS`` build args;
* every image is tagged with a hash of what it is made of (Dockerfile, build context after
  .dockerignore, build args, base image, wheelhouse inputs): a second run on the same machine
  finds it and builds nothing. Older tags of the same image are removed when a new one is built.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import tomllib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
import docker.utils.build
from filelock import FileLock
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(
    os.environ.get(
        "MODEL_SUPPORT_CONTAINER_CACHE", Path.home() / ".cache" / "model-support" / "containers"
    )
)
IMAGE_PREFIX = "model-support-test"
RUNNER_DOCKERFILE = "images/runner/Dockerfile"
OPERATOR_DOCKERFILE = "operator/Dockerfile"
# The runner's base here: its plain-OS base recipe on Debian, with CPU torch in TorchNeuron's
# place and no Neuron apt packages (none can be fetched here), standing in for the Neuron DLC.
TORCHNEURON_BASE_DOCKERFILE = "images/runner/torchneuron-base.Dockerfile"
TORCHNEURON_BASE_STAND_IN_ARGS = {"TORCHNEURON_PACKAGES": "torch", "NEURON_APT_PACKAGES": ""}

DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = os.environ.get("MODEL_SUPPORT_DEBIAN_MIRROR", "http://deb.debian.org/debian")
DEBOOTSTRAP = [
    "debootstrap",
    "--variant=minbase",
    "--include=python3,python3-pip,python3-venv,ca-certificates",
    DEBIAN_SUITE,
]
# Left out of the base: package caches and docs (as Debian's own slim images do), and Debian's
# EXTERNALLY-MANAGED marker, so `pip install` behaves as in the production bases' Pythons.
TRIM = [
    "var/cache/apt/archives",
    "var/lib/apt/lists",
    "usr/share/doc",
    "usr/share/man",
    "usr/share/locale",
    "usr/share/info",
    "usr/lib/python3.11/EXTERNALLY-MANAGED",
]
BASE_RECIPE = json.dumps({"debootstrap": DEBOOTSTRAP, "mirror": DEBIAN_MIRROR, "trim": TRIM})


class BuildFailed(RuntimeError):
    """An image could not be built; the message holds the tail of the build log."""


def _digest(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def _image(client: docker.DockerClient, tag: str) -> Any | None:
    try:
        return client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None


def _drop_older_tags(client: docker.DockerClient, repository: str, keep: str) -> None:
    """Remove the other tags of ``repository`` (older builds), so disk use stays bounded."""
    for image in client.images.list(name=repository):
        for tag in image.tags:
            if tag.startswith(f"{repository}:") and tag != keep:
                # An image in use by a concurrent session's container stays until next time.
                with contextlib.suppress(docker.errors.APIError):
                    client.images.remove(tag, noprune=False)


@contextmanager
def _build_lock() -> Iterator[None]:
    CACHE.mkdir(parents=True, exist_ok=True)
    with FileLock(str(CACHE / "build.lock"), timeout=3600):
        yield


# ----------------------------------------------------------------------------- the base


def debian_base(client: docker.DockerClient, log: list[str]) -> str:
    """The local Debian bookworm + python3 base image (made with debootstrap once per machine)."""
    tag = f"{IMAGE_PREFIX}/debian-python:{DEBIAN_SUITE}-{_digest(BASE_RECIPE)[:16]}"
    if _image(client, tag) is not None:
        return tag
    if shutil.which("debootstrap") is None:
        raise BuildFailed(
            "the local base image needs `debootstrap` (Debian package): apt-get install -y debootstrap"
        )
    started = time.monotonic()
    work = CACHE / "debootstrap"
    shutil.rmtree(work, ignore_errors=True)
    rootfs = work / "rootfs"
    rootfs.mkdir(parents=True)
    proc = subprocess.run(
        [*DEBOOTSTRAP, str(rootfs), DEBIAN_MIRROR],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        raise BuildFailed(
            f"debootstrap failed ({proc.returncode}); it needs root and {DEBIAN_MIRROR}:\n"
            f"{(proc.stdout + proc.stderr)[-3000:]}"
        )
    for path in TRIM:
        target = rootfs / path
        if target.is_dir():
            shutil.rmtree(target)
            if path.startswith("var/"):
                target.mkdir()  # apt expects these folders to exist
        else:
            target.unlink(missing_ok=True)
    archive = work / "rootfs.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(rootfs, arcname=".")
    repository, _, version = tag.partition(":")
    client.api.import_image_from_file(
        str(archive),
        repository=repository,
        tag=version,
        changes=["ENV LANG=C.UTF-8", 'CMD ["/bin/bash"]'],
    )
    shutil.rmtree(work, ignore_errors=True)
    _drop_older_tags(client, repository, tag)
    log.append(f"base image {tag}: {time.monotonic() - started:.0f} s (debootstrap + import)")
    return tag


# ----------------------------------------------------------------------------- the wheelhouse


def _dockerfile_args(dockerfile: str) -> dict[str, str]:
    """The ARG defaults a Dockerfile declares (ARG NAME=value)."""
    text = (REPO / dockerfile).read_text()
    return dict(re.findall(r"^ARG\s+([A-Za-z_][A-Za-z0-9_]*)=(\S+)\s*$", text, flags=re.M))


def wheelhouse_requirements() -> list[str]:
    """What the images install: the package's dependencies with its s3 extra, the runner's
    pinned transformers, huggingface_hub and task libraries, and the build backend of the package itself."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    build = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    runner = _dockerfile_args(RUNNER_DOCKERFILE)
    return [
        *project["dependencies"],
        *project["optional-dependencies"]["s3"],
        f"transformers=={runner['TRANSFORMERS_VERSION']}",
        f"huggingface_hub=={runner['HF_HUB_VERSION']}",
        f"sentence-transformers=={runner['SENTENCE_TRANSFORMERS_VERSION']}",
        f"diffusers=={runner['DIFFUSERS_VERSION']}",
        *build,
    ]


def _installed_versions(pinned: list[str]) -> str:
    """This virtualenv's versions (pip freeze): the images get the versions the suite tests,
    except for what ``pinned`` requirements fix themselves (the runner image's own ``==`` pins).

    A pin wins over the virtualenv: the package's open range (``sentence-transformers>=5.0``)
    takes the newest release into the virtualenv, and a constraint to it beside the Dockerfile's
    older pin would leave pip no version to install.
    """
    fixed = {
        canonicalize_name(requirement.name)
        for requirement in map(Requirement, pinned)
        if any(spec.operator == "==" for spec in requirement.specifier)
    }
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # Direct references (name @ file://...) cannot be constraints; they are pinned by name instead.
    lines = []
    for line in frozen.splitlines():
        if " @ " in line:
            continue
        if canonicalize_name(line.partition("==")[0]) in fixed:
            continue
        lines.append(line)
    return "\n".join(sorted(lines)) + "\n"


@dataclass(frozen=True)
class Wheelhouse:
    """A folder of wheels for the images, and the hash of what went into it."""

    path: Path
    digest: str


def wheelhouse(log: list[str]) -> Wheelhouse:
    """The wheelhouse for these requirements and versions (built once per machine and inputs)."""
    requirements = wheelhouse_requirements()
    constraints = _installed_versions(requirements)
    digest = _digest(json.dumps(requirements), constraints, sys.version.split()[0])[:16]
    root = CACHE / "wheelhouse"
    target = root / digest
    if (target / ".complete").exists():
        return Wheelhouse(target, digest)
    started = time.monotonic()
    root.mkdir(parents=True, exist_ok=True)
    building = root / f".building-{digest}"
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir()
    (building / "constraints.txt").write_text(constraints)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--disable-pip-version-check",
            "--wheel-dir",
            str(building),
            "--constraint",
            str(building / "constraints.txt"),
            *requirements,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        shutil.rmtree(building, ignore_errors=True)
        raise BuildFailed(f"pip wheel failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
    (building / "constraints.txt").unlink()
    (building / ".complete").write_text(json.dumps(requirements))
    for old in root.iterdir():  # one wheelhouse per machine is enough
        if old.name != digest and not old.name.startswith(".building-"):
            shutil.rmtree(old, ignore_errors=True)
    building.rename(target)
    size = sum(f.stat().st_size for f in target.iterdir()) / 2**20
    log.append(
        f"wheelhouse {digest}: {len(list(target.glob('*.whl')))} wheels, {size:.0f} MiB, "
        f"{time.monotonic() - started:.0f} s"
    )
    return Wheelhouse(target, digest)


@contextmanager
def serve(directory: Path) -> Iterator[str]:
    """Serve ``directory`` over HTTP on 127.0.0.1 (pip's --find-links reads the listing)."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(directory))
    )
    thread = threading.Thread(target=server.serve_forever, name="wheelhouse", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


# ----------------------------------------------------------------------------- the images


def _context_digest(dockerfile: str) -> str:
    """Hash of the build context as the daemon receives it (after .dockerignore)."""
    ignore = REPO / ".dockerignore"
    patterns = [
        line.strip()
        for line in ignore.read_text().splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    h = hashlib.sha256()
    for rel in sorted(docker.utils.build.exclude_paths(str(REPO), patterns, dockerfile)):
        path = REPO / rel
        if path.is_file() and not path.is_symlink():
            h.update(rel.encode() + b"\0" + oct(path.stat().st_mode & 0o111).encode() + b"\0")
            h.update(path.read_bytes())
    return h.hexdigest()


@dataclass(frozen=True)
class Images:
    """The tags of the images the container tests run."""

    base: str
    torchneuron_base: str
    runner: str
    operator: str


def build_image(
    client: docker.DockerClient,
    *,
    name: str,
    dockerfile: str,
    base: str,
    wheels: Wheelhouse,
    log: list[str],
    with_context: bool = True,
    buildargs: dict[str, str] | None = None,
) -> str:
    """Build ``dockerfile`` on ``base`` offline from ``wheels`` (or find it built already).

    ``with_context=False``: a Dockerfile that copies nothing is built without the repository as
    its context, so source changes neither rebuild it nor enter its hash. ``buildargs`` are
    passed beside the base and the wheelhouse (and enter the hash).
    """
    extra = dict(buildargs or {})
    base_id = client.images.get(base).id
    context = _context_digest(dockerfile) if with_context else ""
    digest = _digest(
        (REPO / dockerfile).read_bytes(), context, base_id, wheels.digest, json.dumps(extra)
    )[:16]
    repository = f"{IMAGE_PREFIX}/{name}"
    tag = f"{repository}:{digest}"
    if _image(client, tag) is not None:
        return tag
    started = time.monotonic()
    output: list[str] = []
    with serve(wheels.path) as url:
        source: dict[str, Any] = (
            {"path": str(REPO), "dockerfile": dockerfile}
            if with_context
            else {"fileobj": io.BytesIO((REPO / dockerfile).read_bytes())}
        )
        stream = client.api.build(
            **source,
            tag=tag,
            buildargs={"BASE_IMAGE": base, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": url, **extra},
            network_mode="host",
            rm=True,
            forcerm=True,
            decode=True,
        )
        for chunk in stream:
            if "stream" in chunk:
                output.append(str(chunk["stream"]))
            if "error" in chunk:
                tail = "".join(output)[-4000:]
                raise BuildFailed(f"building {dockerfile} failed: {chunk['error']}\n{tail}")
    if _image(client, tag) is None:
        raise BuildFailed(f"building {dockerfile} produced no image:\n{''.join(output)[-4000:]}")
    _drop_older_tags(client, repository, tag)
    size = client.images.get(tag).attrs["Size"] / 2**20
    log.append(f"image {tag}: {size:.0f} MiB, built in {time.monotonic() - started:.0f} s")
    return tag


def _layers_are_shared(client: docker.DockerClient) -> bool:
    """Whether the engine's storage driver shares a parent's files with its children (overlay2)
    rather than copying them into every build step's container (vfs)."""
    return str(client.info().get("Driver", "")) != "vfs"


def build_images(client: docker.DockerClient, log: list[str]) -> Images:
    """The base, runner and operator images (each built only if its content changed).

    Where the storage driver shares layers, the operator is built on the runner image: pip finds
    torch and most of the package's requirements (transformers, diffusers, sentence-transformers
    and theirs) installed and unpacks only the rest (125 s -> 64 s on an idle 2-core machine);
    on vfs, where every build step copies its parent's files, the small Debian base is faster.
    """
    with _build_lock():
        # The base (debootstrap: downloads and dpkg) and the wheelhouse (pip: downloads and
        # unpacking) need nothing of each other: made side by side, they wait on the network
        # and the disk at once.
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="image-inputs") as pool:
            making_base = pool.submit(debian_base, client, log)
            making_wheels = pool.submit(wheelhouse, log)
            base, wheels = making_base.result(), making_wheels.result()
        dlc = build_image(
            client,
            name="torchneuron-base",
            dockerfile=TORCHNEURON_BASE_DOCKERFILE,
            base=base,
            wheels=wheels,
            log=log,
            with_context=False,
            buildargs=TORCHNEURON_BASE_STAND_IN_ARGS,
        )
        runner = build_image(
            client, name="runner", dockerfile=RUNNER_DOCKERFILE, base=dlc, wheels=wheels, log=log
        )
        operator = build_image(
            client,
            name="operator",
            dockerfile=OPERATOR_DOCKERFILE,
            base=runner if _layers_are_shared(client) else base,
            wheels=wheels,
            log=log,
        )
    return Images(base=base, torchneuron_base=dlc, runner=runner, operator=operator)
