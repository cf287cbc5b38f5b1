"""Metadata access for Hugging Face Hub repositories and local checkpoints, never weights.

:func:`read_snapshot` is the one reader sizing uses: it reads a model once into a
:class:`ModelSnapshot` (config, tensor headers, pipeline index, access, where it came from),
and sizing decides from that snapshot alone, without files or a Hub.

What a model is made of is read from ``config.json`` and the safetensors headers only: a
safetensors file starts with an 8-byte little-endian header length followed by a JSON header
of ``{name: {dtype, shape, data_offsets}}``. On the Hub, ``huggingface_hub`` reads those headers
with HTTP range requests (``get_safetensors_metadata``); locally the header is parsed here.

Every Hub call goes through an explicit ``HfApi(endpoint=...)`` so a test can point it at a
local stand-in without touching ``HF_ENDPOINT`` (which huggingface_hub reads at import time).
Library errors (gated, not found) are left to propagate: callers classify them.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
import re
import struct
import threading
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from huggingface_hub import HfApi, constants, get_token, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    NotASafetensorsRepoError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import ModelInfo
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

from model_support.tasks import TASK_SPECS, Loader, task_spec

PIPELINE_TASK = next(spec.task for spec in TASK_SPECS.values() if spec.loader is Loader.DIFFUSERS)
"""The task a diffusers pipeline folder is tested as when no task is given (text-to-image)."""

SAFETENSORS_SINGLE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
# A header larger than this is not a plausible safetensors header (the format caps it at 100 MB).
_MAX_HEADER_BYTES = 100_000_000


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a checkpoint as its safetensors header describes it (no data)."""

    name: str
    dtype: str  # safetensors dtype code: "BF16", "F32", "I8", "F8_E4M3", ...
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        """Number of elements (1 for a scalar)."""
        n = 1
        for dim in self.shape:
            n *= dim
        return n


class CheckpointError(ValueError):
    """A local checkpoint directory is missing files or holds a malformed safetensors header."""


def read_safetensors_header(path: str | Path) -> list[TensorSpec]:
    """Parse the header of one local safetensors file, reading only the header bytes."""
    path = Path(path)
    with path.open("rb") as f:
        prefix = f.read(8)
        if len(prefix) != 8:
            raise CheckpointError(f"{path} is shorter than a safetensors header (8 bytes)")
        (length,) = struct.unpack("<Q", prefix)
        if length > _MAX_HEADER_BYTES:
            raise CheckpointError(
                f"{path}: header length {length} is not plausible; is this a safetensors file?"
            )
        raw = f.read(length)
    if len(raw) != length:
        raise CheckpointError(f"{path}: header truncated ({len(raw)} of {length} bytes)")
    try:
        header = json.loads(raw)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: header is not valid JSON ({e})") from e
    return [
        TensorSpec(name=name, dtype=entry["dtype"], shape=tuple(entry["shape"]))
        for name, entry in header.items()
        if name != "__metadata__"
    ]


def local_config(directory: str | Path) -> dict[str, Any]:
    """The ``config.json`` of a local checkpoint directory."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{directory} has no config.json; is it a transformers checkpoint?")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path} is not valid JSON ({e})") from e
    if not isinstance(config, dict):
        raise CheckpointError(f"{path} does not hold a JSON object")
    return config


def local_tensors(directory: str | Path) -> list[TensorSpec] | None:
    """Tensors of a local checkpoint from its safetensors headers; None if it has none."""
    directory = Path(directory)
    index = directory / SAFETENSORS_INDEX
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text()).get("weight_map", {})
        files = sorted(set(weight_map.values()))
    elif (directory / SAFETENSORS_SINGLE).is_file():
        files = [SAFETENSORS_SINGLE]
    else:
        files = sorted(p.name for p in directory.glob("*.safetensors"))
        if not files:
            return None
    tensors: list[TensorSpec] = []
    for name in files:
        if not (directory / name).is_file():
            raise CheckpointError(f"{directory}: the index names {name}, which is missing")
        tensors.extend(read_safetensors_header(directory / name))
    return tensors


def hub_api(endpoint: str | None = None, token: str | None = None) -> HfApi:
    """An HfApi bound to ``endpoint`` (None: the library default, honouring HF_ENDPOINT)."""
    return HfApi(endpoint=endpoint, token=token)


HANDED_OVER_MAX = 1024
"""Pinned repository information waiting for its sizing (a bound: a pin never sized is dropped)."""
_handed_over: collections.OrderedDict[tuple[str, str, str, str], ModelInfo] = (
    collections.OrderedDict()
)
_handed_over_lock = threading.Lock()


def _handover_key(
    api: HfApi, repo_id: str, commit: str, token: str | None
) -> tuple[str, str, str, str]:
    # Keyed by whose token read it too: one tenant's read of a private repository is never
    # another's answer.
    bound = api.token if isinstance(api.token, str) else None
    secret = token or bound or get_token() or ""  # the token the request was sent with
    return (api.endpoint, repo_id, commit, hashlib.sha256(secret.encode()).hexdigest())


def hand_over_model_info(api: HfApi, repo_id: str, token: str | None, info: ModelInfo) -> None:
    """Keep what pinning a revision read (``info``, at commit ``info.sha``) for the sizing that
    follows, which reads the same commit: one Hub request per test instead of two."""
    if not info.sha:
        return
    with _handed_over_lock:
        _handed_over[_handover_key(api, repo_id, info.sha, token)] = info
        while len(_handed_over) > HANDED_OVER_MAX:
            _handed_over.popitem(last=False)


def hub_model_info(api: HfApi, repo_id: str, revision: str | None, token: str | None) -> ModelInfo:
    """Repository information (gated flag, pipeline tag, sha); no files are read. What pinning
    this commit handed over (:func:`hand_over_model_info`) is taken once, not read again."""
    if revision is not None:
        with _handed_over_lock:
            info = _handed_over.pop(_handover_key(api, repo_id, revision, token), None)
        if info is not None:
            return info
    return api.model_info(repo_id, revision=revision, token=token)


def hub_config(api: HfApi, repo_id: str, revision: str | None, token: str | None) -> dict[str, Any]:
    """Read and parse only ``config.json`` of a Hub repository."""
    config = hub_json(api, repo_id, "config.json", revision, token)
    if not isinstance(config, dict):
        raise ValueError(f"config.json of {repo_id} does not hold a JSON object")
    return config


def hub_json(
    api: HfApi, repo_id: str, filename: str, revision: str | None, token: str | None
) -> Any:
    """A small JSON file of a Hub repository, parsed, read with one GET into memory.

    Sizing reads each model's metadata once per commit; ``hf_hub_download`` would ask with a
    HEAD first, then write the file into the local cache (a lock, a blob, a link), which took
    four times the CPU of the read itself and left a file behind for every model ever sized.
    The request is the one the client makes for a safetensors header
    (``HfApi.parse_safetensors_file_metadata``): the same URL, headers and error types
    (``RemoteEntryNotFoundError`` for no such file, ``GatedRepoError``, ...).
    """
    url = hf_hub_url(repo_id, filename, revision=revision, endpoint=api.endpoint)
    headers = build_hf_headers(
        token=api.token if token is None else token,
        library_name=api.library_name,
        library_version=api.library_version,
        user_agent=api.user_agent,
        headers=api.headers,
    )
    response = get_session().get(url, headers=headers, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT)
    hf_raise_for_status(response)
    return json.loads(response.content)


def hub_tensors(
    api: HfApi,
    repo_id: str,
    revision: str | None,
    token: str | None,
    files: Collection[str] | None = None,
) -> list[TensorSpec] | None:
    """Tensors of a Hub repository from its safetensors headers (range requests); None if it
    publishes no safetensors. ``files``: the repository's file names at ``revision`` when
    known (its model info's siblings): a single ``model.safetensors`` is then read without
    first asking whether it exists, one request fewer per model."""
    if files is not None and SAFETENSORS_SINGLE not in files and SAFETENSORS_INDEX not in files:
        return None
    if files is not None and SAFETENSORS_SINGLE in files:
        single = api.parse_safetensors_file_metadata(
            repo_id, SAFETENSORS_SINGLE, revision=revision, token=token
        )
        metadata = [single]
    else:
        try:
            meta = api.get_safetensors_metadata(repo_id, revision=revision, token=token)
        except NotASafetensorsRepoError:
            return None
        metadata = list(meta.files_metadata.values())
    return [
        TensorSpec(name=name, dtype=info.dtype, shape=tuple(info.shape))
        for file_meta in metadata
        for name, info in file_meta.tensors.items()
    ]


def unreachable_message(model: str, exc: BaseException, endpoint: str | None = None) -> str:
    """What to tell a user whose Hub request for ``model`` failed in transport (``is_unreachable``)."""
    if isinstance(exc, OfflineModeIsEnabled):
        return (
            f"HF_HUB_OFFLINE is set, so {model!r} cannot be read from the Hugging Face Hub: "
            "unset HF_HUB_OFFLINE, or give a local checkpoint directory"
        )
    where = endpoint or os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    return (
        f"could not reach the Hugging Face Hub at {where} to read {model!r} ({exc}); "
        "check the network or HF_ENDPOINT, or give a local checkpoint directory"
    )


def is_unreachable(exc: BaseException) -> bool:
    """True when ``exc`` is a transport failure reaching the Hub (refused, DNS, timeout, offline)."""
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    # huggingface_hub talks through httpx (packaged as httpx or httpx2): its TransportError
    # covers connect/read/DNS failures but not HTTP status errors, which are real answers.
    return any(
        cls.__name__ == "TransportError" and cls.__module__.startswith("httpx")
        for cls in type(exc).__mro__
    )


# ---- diffusers pipelines (text-to-image): model_index.json and one folder per component

PIPELINE_INDEX = "model_index.json"
# The weights a component folder holds as diffusers loads them by default (no variant such as
# ``.fp16``, which from_pretrained loads only when asked): one file or numbered shards.
_COMPONENT_WEIGHTS = re.compile(
    r"^(?P<component>[^/]+)/(diffusion_pytorch_model|model)(-\d+-of-\d+)?\.safetensors$"
)


def pipeline_components(index: dict[str, Any]) -> dict[str, str]:
    """The components of a model_index.json: name -> class (library entries only)."""
    return {
        name: str(value[1])
        for name, value in index.items()
        if not name.startswith("_") and isinstance(value, list) and len(value) == 2 and value[1]
    }


def component_weight_files(files: list[str]) -> dict[str, list[str]]:
    """The default safetensors files of each component folder (relative paths)."""
    found: dict[str, list[str]] = {}
    for name in sorted(files):
        match = _COMPONENT_WEIGHTS.fullmatch(name)
        if match:
            found.setdefault(match["component"], []).append(name)
    return found


def local_pipeline(directory: str | Path) -> tuple[dict[str, Any], list[TensorSpec] | None] | None:
    """A local diffusers pipeline's model_index.json and its components' tensors (names
    prefixed by the component); None when the directory holds no pipeline."""
    directory = Path(directory)
    if not (directory / PIPELINE_INDEX).is_file():
        return None
    try:
        index = json.loads((directory / PIPELINE_INDEX).read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{directory / PIPELINE_INDEX} is not valid JSON ({e})") from e
    files = [p.relative_to(directory).as_posix() for p in directory.glob("*/*.safetensors")]
    weights = component_weight_files(files)
    if not weights:
        return index, None
    tensors = [
        TensorSpec(f"{component}.{t.name}", t.dtype, t.shape)
        for component, names in weights.items()
        for name in names
        for t in read_safetensors_header(directory / name)
    ]
    return index, tensors


def hub_pipeline(
    api: HfApi, repo_id: str, revision: str | None, token: str | None
) -> tuple[dict[str, Any], list[TensorSpec] | None] | None:
    """A Hub diffusers pipeline's model_index.json and its components' tensors, read from the
    safetensors headers (range requests); None when the repository holds no pipeline."""
    files = api.list_repo_files(repo_id, revision=revision, token=token)
    if PIPELINE_INDEX not in files:
        return None
    index = hub_json(api, repo_id, PIPELINE_INDEX, revision, token)
    weights = component_weight_files(list(files))
    if not weights:
        return index, None
    tensors = []
    for component, names in weights.items():
        for name in names:
            meta = api.parse_safetensors_file_metadata(
                repo_id, name, revision=revision, token=token
            )
            tensors += [
                TensorSpec(f"{component}.{key}", info.dtype, tuple(info.shape))
                for key, info in meta.tensors.items()
            ]
    return index, tensors


# ---- one read of a model, everything sizing needs


class MetadataError(ValueError):
    """The model's metadata cannot be read (not found, no config); says what to check."""


class ModelNotFound(MetadataError):
    """No such model or revision (or no access to it): the reference itself is wrong."""


@dataclass(frozen=True)
class ModelSnapshot:
    """What one read of a model found, no weights: the input of sizing's decisions.

    ``config`` is config.json (None when it was not read: no weights to run, gated without
    access, a pipeline, or a non-transformers checkpoint of a task that needs none);
    ``tensors`` the safetensors headers' tensors as stored (None: no safetensors weights);
    ``pipeline_index`` a diffusers pipeline's model_index.json, its components' tensors
    prefixed by the component. ``task`` is the test's task, else the Hub's pipeline tag.
    """

    model: str
    revision: str | None = None
    source: Literal["hub", "local"] = "hub"
    task: str | None = None
    gated: bool = False
    token_available: bool = False
    access_refused: bool = False
    config: dict[str, Any] | None = None
    tensors: list[TensorSpec] | None = None
    pipeline_index: dict[str, Any] | None = None


def read_snapshot(
    model: str,
    revision: str | None = None,
    *,
    task: str | None = None,
    token: str | None = None,
    endpoint: str | None = None,
) -> ModelSnapshot:
    """Read ``model`` once: a local checkpoint directory when one exists at that path, else a
    Hub id (no weights; only what the answer needs is requested).

    Raises ModelNotFound for a missing directory, model or revision, MetadataError for a
    transformers-task model without config.json, CheckpointError for a malformed local
    checkpoint; transport errors propagate (see :func:`is_unreachable`).
    """
    if os.path.isdir(model):
        return _local_snapshot(model, revision, task)
    if model.startswith((".", "/", "~")):
        raise ModelNotFound(f"no checkpoint directory at {model}")
    return _hub_snapshot(model, revision, task, token or get_token(), hub_api(endpoint))


def _local_snapshot(directory: str, revision: str | None, task: str | None) -> ModelSnapshot:
    pipeline = local_pipeline(directory)
    if pipeline is not None:
        index, tensors = pipeline
        return ModelSnapshot(
            directory, revision, "local", task or PIPELINE_TASK.value,
            tensors=tensors, pipeline_index=index,
        )  # fmt: skip
    return ModelSnapshot(
        directory, revision, "local", task,
        config=local_config(directory), tensors=local_tensors(directory),
    )  # fmt: skip


def _hub_snapshot(
    model: str, revision: str | None, task: str | None, token: str | None, api: HfApi
) -> ModelSnapshot:
    try:
        info = hub_model_info(api, model, revision, token)
    except RepositoryNotFoundError as e:
        raise ModelNotFound(
            f"no model {model!r} on {api.endpoint} (or it is private and the token has no "
            "access); check the id"
        ) from e
    except RevisionNotFoundError as e:
        raise ModelNotFound(
            f"{model} has no revision {revision!r}; check the branch/tag/commit"
        ) from e
    task = task if task is not None else info.pipeline_tag
    found = ModelSnapshot(
        model, revision, "hub", task, gated=bool(info.gated), token_available=bool(token)
    )
    if found.gated and not token:
        return found
    refused = dataclasses.replace(found, gated=True, access_refused=True)
    loader = spec.loader if (spec := task_spec(task)) is not None else None
    if loader is Loader.DIFFUSERS or info.library_name == "diffusers":
        try:
            pipeline = hub_pipeline(api, model, revision, token)
        except GatedRepoError:
            return refused
        if pipeline is not None:
            index, tensors = pipeline
            return dataclasses.replace(
                found, task=task or PIPELINE_TASK.value, tensors=tensors,
                pipeline_index=index,
            )  # fmt: skip
        if loader is Loader.DIFFUSERS:  # no pipeline: unsupported, whatever else it holds
            return found
    try:
        files = None if info.siblings is None else {s.rfilename for s in info.siblings}
        tensors = hub_tensors(api, model, revision, token, files)
        if tensors is None:  # without weights the verdict is settled; config.json is not needed
            return found
        config = hub_config(api, model, revision, token)
    except GatedRepoError:
        return refused
    except RemoteEntryNotFoundError as e:
        if loader is not Loader.CAUSAL_LM:
            # Another library's checkpoint (open_clip, timm, setfit, ...) tagged with a task
            # model-support tests: its loader cannot take it, which is an exclusion
            # (unsupported-task), not a broken model.
            return dataclasses.replace(found, tensors=tensors)
        raise MetadataError(f"{model} has no config.json; it is not a transformers model") from e
    return dataclasses.replace(found, config=config, tensors=tensors)
