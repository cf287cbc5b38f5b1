"""Sizing Hub models through the real huggingface_hub client against the local stand-in."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch
from hubserver import HubServer, Repo
from huggingface_hub import HfApi
from safetensors.torch import save, save_file

from model_support import hub
from model_support.sizing import Exclusion, MetadataError, Plan, size_model
from model_support.vocabulary import ExclusionReason, Parallelism

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
}


def _checkpoint(config: dict, shards: int = 1) -> dict[str, bytes]:
    """config.json plus real safetensors files (one or sharded with an index)."""
    h, inter, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    tensors = {"model.embed_tokens.weight": torch.zeros(v, h), "lm_head.weight": torch.zeros(v, h)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors[p + "self_attn.q_proj.weight"] = torch.zeros(h, h)
        tensors[p + "self_attn.k_proj.weight"] = torch.zeros(h // 2, h)
        tensors[p + "self_attn.v_proj.weight"] = torch.zeros(h // 2, h)
        tensors[p + "self_attn.o_proj.weight"] = torch.zeros(h, h)
        tensors[p + "mlp.up_proj.weight"] = torch.zeros(inter, h)
        tensors[p + "input_layernorm.weight"] = torch.zeros(h)
    files = {"config.json": json.dumps(config).encode()}
    names = sorted(tensors)
    if shards == 1:
        files["model.safetensors"] = save({k: tensors[k].to(torch.bfloat16) for k in names})
        return files
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: tensors[k].to(torch.bfloat16) for k in names[s::shards]}
        files[fname] = save(part)
        weight_map.update(dict.fromkeys(part, fname))
    files["model.safetensors.index.json"] = json.dumps({"weight_map": weight_map}).encode()
    return files


PARAMS = 2 * 1000 * 64 + 2 * (64 * 64 * 2 + 32 * 64 * 2 + 128 * 64 + 64)


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    # Nothing here should write the Hub cache (see the test below); if it did, not the user's.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    repos = [
        Repo("org/tiny", files=_checkpoint(LLAMA), downloads=50, likes=3),
        Repo("org/sharded", files=_checkpoint(LLAMA, shards=3), downloads=10, likes=30),
        Repo("org/gated", files=_checkpoint(LLAMA), gated="manual", access={"hf_good"}),
        Repo(
            "org/pickle",
            files={"config.json": json.dumps(LLAMA).encode(), "pytorch_model.bin": b"x" * 64},
        ),
        Repo(
            "org/custom",
            files=_checkpoint(
                LLAMA
                | {
                    "model_type": "my_custom_lm",
                    "architectures": ["MyCustomForCausalLM"],
                    "auto_map": {"AutoModelForCausalLM": "modeling_custom.MyCustomForCausalLM"},
                }
            ),
        ),
        Repo("org/diffusion", files=_checkpoint(LLAMA), pipeline_tag="text-to-image"),
        Repo(
            "org/versions",
            revisions={
                "main": _checkpoint(LLAMA),
                "v2": _checkpoint(LLAMA | {"num_hidden_layers": 1}),
            },
        ),
    ]
    with HubServer(repos, page_size=2) as s:
        yield s


def test_public_repo_is_sized_from_headers_without_downloading_weights(
    server: HubServer,
) -> None:
    plan = size_model("org/tiny", endpoint=server.url)
    assert isinstance(plan, Plan)
    assert plan.parameters == PARAMS
    assert plan.memory.weights_replicated == 2 * PARAMS
    weight_gets = [
        r for r in server.requests if r["method"] == "GET" and r["path"].endswith(".safetensors")
    ]
    assert weight_gets, "the headers must have been read"
    assert all(r["range"] == "bytes=0-100000" for r in weight_gets)


def test_a_single_safetensors_file_the_model_info_lists_is_read_without_asking_first(
    server: HubServer,
) -> None:
    """The model info's file list says model.safetensors exists: no HEAD asks it again (one
    request fewer per model, at a sweep's thousands); a repository without safetensors is
    known from the list alone."""
    size_model("org/tiny", endpoint=server.url)
    asked = [r for r in server.requests if r["method"] == "HEAD"]
    assert not [r for r in asked if r["path"].endswith(".safetensors")], asked
    gets = [r for r in server.requests if r["path"].endswith("/model.safetensors")]
    assert [r["range"] for r in gets] == ["bytes=0-100000"]

    before = len(server.requests)
    api = hub.hub_api(server.url)
    assert hub.hub_tensors(api, "org/pickle", None, None, files={"pytorch_model.bin"}) is None
    assert len(server.requests) == before


def test_sharded_repo_reads_every_shard_header(server: HubServer) -> None:
    plan = size_model("org/sharded", endpoint=server.url)
    assert isinstance(plan, Plan) and plan.parameters == PARAMS
    gets = [
        r for r in server.requests if r["method"] == "GET" and r["path"].endswith(".safetensors")
    ]
    assert sorted(r["path"].rsplit("/", 1)[1] for r in gets) == [
        f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)
    ]
    assert all(r["range"] == "bytes=0-100000" for r in gets)


def test_gated_repo_without_token_is_excluded_before_reading_files(
    server: HubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    result = size_model("org/gated", endpoint=server.url)
    assert isinstance(result, Exclusion)
    assert result.reason is ExclusionReason.GATED_WITHOUT_TOKEN
    assert "no Hub token" in result.message
    assert not [r for r in server.requests if "/resolve/" in r["path"]]


def test_gated_repo_with_a_refused_token_is_excluded(server: HubServer) -> None:
    result = size_model("org/gated", endpoint=server.url, token="hf_wrong")
    assert isinstance(result, Exclusion)
    assert result.reason is ExclusionReason.GATED_WITHOUT_TOKEN
    assert "refused the token" in result.message
    assert "hf_wrong" not in result.message  # tokens never appear in output


def test_gated_repo_with_an_accepted_token_is_sized(server: HubServer) -> None:
    plan = size_model("org/gated", endpoint=server.url, token="hf_good")
    assert isinstance(plan, Plan) and plan.parameters == PARAMS


def test_a_gated_repo_the_token_opens_is_judged_by_its_weights(server: HubServer) -> None:
    """With access granted the gate is no longer the verdict: what the repository holds is."""
    pickle = {"config.json": json.dumps(LLAMA).encode(), "pytorch_model.bin": b"x" * 64}
    server.add(Repo("org/gated-pickle", files=pickle, gated="manual", access={"hf_good"}))
    result = size_model("org/gated-pickle", endpoint=server.url, token="hf_good")
    assert isinstance(result, Exclusion) and result.reason is ExclusionReason.NO_SAFETENSORS


def test_repo_without_safetensors_is_excluded(server: HubServer) -> None:
    result = size_model("org/pickle", endpoint=server.url)
    assert isinstance(result, Exclusion) and result.reason is ExclusionReason.NO_SAFETENSORS
    assert not [r for r in server.requests if r["path"].endswith(".bin") and r["method"] == "GET"]


def test_remote_code_config_is_excluded_unless_trusted(server: HubServer) -> None:
    result = size_model("org/custom", endpoint=server.url)
    assert isinstance(result, Exclusion)
    assert result.reason is ExclusionReason.REMOTE_CODE_REQUIRED
    assert "my_custom_lm" in result.message
    # trusted: sized from the raw config; without a TP plan a non-MoE model stays on one core
    plan = size_model("org/custom", endpoint=server.url, trust_remote_code=True)
    assert isinstance(plan, Plan) and plan.parallelism is Parallelism.NONE
    assert plan.memory.kv_cache == 2 * 2 * 2 * 16 * 160 * 3 * 2


def test_unsupported_pipeline_tag_is_excluded(server: HubServer) -> None:
    result = size_model("org/diffusion", endpoint=server.url)
    assert isinstance(result, Exclusion) and result.reason is ExclusionReason.UNSUPPORTED_TASK
    assert "text-to-image" in result.message


def test_revision_is_honoured_by_name_and_by_commit(server: HubServer) -> None:
    v2 = size_model("org/versions", "v2", endpoint=server.url)
    main = size_model("org/versions", endpoint=server.url)
    assert isinstance(v2, Plan) and isinstance(main, Plan)
    assert v2.memory.kv_cache * 2 == main.memory.kv_cache  # 1 layer instead of 2
    sha = HfApi(endpoint=server.url).model_info("org/versions", revision="v2").sha
    assert sha is not None
    by_sha = size_model("org/versions", sha, endpoint=server.url)
    assert isinstance(by_sha, Plan) and by_sha.memory == v2.memory


def test_unknown_repo_and_revision_are_bad_input(server: HubServer) -> None:
    with pytest.raises(MetadataError, match="no model 'org/missing'"):
        size_model("org/missing", endpoint=server.url)
    with pytest.raises(MetadataError, match="no revision 'nope'"):
        size_model("org/tiny", "nope", endpoint=server.url)


def test_hub_helpers_return_config_and_tensors(server: HubServer) -> None:
    api = hub.hub_api(server.url)
    assert hub.hub_config(api, "org/tiny", None, None)["model_type"] == "llama"
    tensors = hub.hub_tensors(api, "org/tiny", None, None)
    assert tensors is not None
    assert {t.dtype for t in tensors} == {"BF16"}
    assert sum(t.numel for t in tensors) == PARAMS
    assert hub.hub_tensors(api, "org/pickle", None, None) is None


# ---- the stand-in's listing, as list_models sees it (others build rankings on it)


def test_list_models_sorts_filters_limits_and_pages(server: HubServer) -> None:
    api = HfApi(endpoint=server.url)
    by_likes = [m.id for m in api.list_models(sort="likes", limit=2)]
    assert by_likes == ["org/sharded", "org/tiny"]
    # page_size=2: six text-generation repos come back over three pages via the Link header
    all_text = [m.id for m in api.list_models(pipeline_tag="text-generation")]
    assert len(all_text) == 6 and "org/diffusion" not in all_text
    assert sum(1 for r in server.requests if r["path"] == "/api/models") == 4
    expanded = next(iter(api.list_models(sort="downloads", limit=1, expand=["safetensors"])))
    assert expanded.id == "org/tiny"
    assert expanded.safetensors is not None and expanded.safetensors.total == PARAMS
    assert expanded.downloads is None  # not expanded, as on the Hub


def test_gated_listing_flag_and_private_repos(server: HubServer) -> None:
    server.add(Repo("org/secret", files=_checkpoint(LLAMA), private=True, access={"hf_good"}))
    api = HfApi(endpoint=server.url)
    assert "org/secret" not in [m.id for m in api.list_models()]
    assert "org/secret" in [m.id for m in api.list_models(token="hf_good")]
    info = api.model_info("org/gated")
    assert info.gated == "manual"
    with pytest.raises(MetadataError, match="no model 'org/secret'"):
        size_model("org/secret", endpoint=server.url)


def test_repo_from_directory(server: HubServer, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    save_file({"lm_head.weight": torch.zeros(1000, 64)}, str(tmp_path / "model.safetensors"))
    server.add(Repo.from_dir("org/from-dir", tmp_path))
    tensors = hub.hub_tensors(hub.hub_api(server.url), "org/from-dir", None, None)
    assert tensors == [hub.TensorSpec("lm_head.weight", "F32", (1000, 64))]


def test_pinning_then_sizing_reads_the_repository_information_once(server: HubServer) -> None:
    from model_support.config import RunConfig
    from model_support.runpath import pin_revision, prepare

    def info_reads() -> int:
        return sum(1 for r in server.requests if r["path"].startswith("/api/models/org/versions"))

    v2 = RunConfig(model="org/versions", revision="v2")
    prepared = prepare(v2, profile="trn2", max_cores=8, endpoint=server.url)
    assert info_reads() == 1  # the pin's read, handed over to the sizing
    sha = HfApi(endpoint=server.url).model_info("org/versions", revision="v2").sha
    assert prepared.config.revision == sha
    assert isinstance(prepared.plan, Plan) and prepared.plan.revision == sha
    # Handed over once: a second sizing of that commit asks the Hub again.
    size_model("org/versions", sha, endpoint=server.url)
    assert info_reads() == 3
    # One token's read is never another token's answer.
    pin_revision(v2, token="hf_a", endpoint=server.url)
    size_model("org/versions", sha, endpoint=server.url, token="hf_b")
    assert info_reads() == 5
    size_model("org/versions", sha, endpoint=server.url, token="hf_a")
    assert info_reads() == 5


def test_sizing_reads_config_json_with_one_get_and_caches_nothing(
    server: HubServer, tmp_path: Path
) -> None:
    # An operator sizes each model of a sweep once per commit: a HEAD before the GET, and a
    # cached copy of every model ever sized in the pod's size-limited /tmp, would be waste.
    plan = size_model("org/tiny", endpoint=server.url)
    assert isinstance(plan, Plan)
    config_reads = [r["method"] for r in server.requests if r["path"].endswith("/config.json")]
    assert config_reads == ["GET"]
    assert not (tmp_path / "hub-cache").exists()


def test_a_missing_config_json_is_told_apart_from_a_broken_hub(server: HubServer) -> None:
    weights_only = {"model.safetensors": _checkpoint(LLAMA)["model.safetensors"]}
    server.add(Repo("org/no-config", files=weights_only))
    with pytest.raises(MetadataError, match=r"has no config\.json"):
        size_model("org/no-config", endpoint=server.url)
