"""run.py end to end for every task beyond text generation: the tiny fixture loads with its
library's from_pretrained, compiles, runs, is verified against the CPU reference, and PASSes;
the document says what ran and what was compared."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import torch
from PIL import Image

from model_support.checkpoints import DemoModel, build_demo_models, default_cache_dir
from model_support.config import RunConfig
from model_support.dataset import record_to_row
from model_support.execution import run_local
from model_support.records import MetricStatistics, ResultDocument
from model_support.runner import run as runner
from model_support.script import render_script
from model_support.tasks import FAMILIES, TASK_SPECS, Family, Shows
from model_support.viewer import output
from model_support.vocabulary import TASK_METHODS, Result, Task

pytestmark = pytest.mark.slow

# Every task of a family with a tiny checkpoint (model_support/tasks.py), run on the checkpoint
# built for it (or its family's first: the embedding model is also a feature-extraction model).
CASES = [
    (family, spec.task, checkpoint.name)
    for family in FAMILIES
    for spec in family.tasks
    if (checkpoint := family.checkpoint_for(spec.task)) is not None
]


def _fixture(name: str) -> DemoModel:
    (model,) = build_demo_models(default_cache_dir(), [name])
    return model


def _labels(path: str) -> set[str]:
    """The class names the checkpoint's config gives its head."""
    import json
    from pathlib import Path

    id2label = json.loads((Path(path) / "config.json").read_text())["id2label"]
    return set(id2label.values())


@pytest.mark.parametrize(("family", "task", "fixture"), CASES, ids=[c[1].value for c in CASES])
def test_every_task_runs_and_passes_through_run_py(
    family: Family, task: Task, fixture: str
) -> None:
    config = RunConfig(
        model=str(_fixture(fixture).require_path()), task=task, compile_backend="aot_eager"
    )
    record = run_local(config, timeout_s=900)
    assert record.run_py == render_script(config)
    doc: ResultDocument = record.document
    assert doc.result == Result.PASS, (doc.error, doc.traceback, doc.verification.reason)
    assert doc.task == task.value and doc.error_class is None and doc.stage == "verify"
    v = doc.verification
    assert v.passed is True and v.failed_checks == []
    assert v.method == family.method == TASK_METHODS[task]
    assert v.error_ratio is not None and v.error_ratio <= v.parameters["max_error_ratio"]

    t = doc.timings
    assert t.load_s and t.first_generate_s and t.steady_generate_s and t.reference_s
    assert t.first_generate_s > t.steady_generate_s > 0  # the first call compiled
    assert t.wall_time_s == pytest.approx(t.load_s + t.first_generate_s)
    assert doc.compilation.graphs and doc.compilation.graphs >= 1
    assert doc.parameters and doc.parameters > 10_000
    assert doc.stack.torch == torch.__version__
    library = TASK_SPECS[task].loader.library
    if library != "transformers":  # the loader's library: recorded, and installed by reproduce
        assert getattr(doc.stack, library.replace("-", "_")) is not None
        assert any(p.startswith(f"{library}==") for p in doc.packages)

    n = len(config.prompts)
    if family.generates:
        assert doc.max_new_tokens == 32
        assert len(doc.tokens) == n and all(len(row) == 32 for row in doc.tokens)
        assert t.prefill_s and t.decode_tokens_per_s and t.decode_tokens_per_s > 0
        assert len(v.positions) == 32 * n and v.bad_tokens == 0
        # Both the encoder's forward and the decoder steps were compiled.
        assert doc.compilation.graphs >= 2
        assert len(doc.text) == n and all(doc.text)
    else:
        assert doc.max_new_tokens is None and doc.tokens == [] and t.prefill_s is None
        assert t.decode_tokens_per_s is None
        assert v.metrics and all(m.median_ratio is not None for m in v.metrics)
        # run.py fills every field of the typed record (unknown ones are refused on reading).
        assert all(m.model_fields_set == set(MetricStatistics.model_fields) for m in v.metrics)
        assert [m.check for m in v.metrics] == list(family.measures)
        assert v.items
    if family.shows is Shows.LABELS:
        # Each item's predicted label beside the float32 reference's (the viewer's table), a
        # class the checkpoint's head names.
        labels = _labels(config.model)
        assert {i["label"] for i in v.items} | {i["reference_label"] for i in v.items} <= labels
        for item in v.items:
            same_class = item["class"] == item["reference_class"]
            assert (item["label"] == item["reference_label"]) == same_class
        table = output.label_table(record_to_row(record), v.model_dump(mode="json"))
        assert list(table["predicted (device)"]) == [i["label"] for i in v.items]
        assert set(table["device vs reference"]) == {output.SAME}  # a PASS: the same labels
        assert len(doc.text) == n and all(doc.text)
        for item in v.items:  # the text per input names its predicted labels
            assert item["label"] in doc.text[item.get("input", item["item"])]
    else:
        assert all("label" not in i for i in v.items)
    if family.shows is Shows.PICTURES:
        _assert_pictures(config, doc)
        steps = {i["step"] for i in v.items}
        assert steps == set(range(config.denoising_steps))
    else:
        assert v.images is None
    if family.method == "embeddings":
        assert len(v.items) == n  # one per sentence, with its ranking swaps


def _picture(encoded: str) -> np.ndarray:
    data = base64.b64decode(encoded, validate=True)
    assert len(data) <= runner.PICTURE_BYTES
    image = Image.open(io.BytesIO(data))
    assert image.format == "PNG" and max(image.size) <= runner.PICTURE_SIDE
    return np.asarray(image.convert("RGB"), dtype=np.int16)


def _assert_pictures(config: RunConfig, doc: ResultDocument) -> None:
    """The record holds, per prompt, the picture the run drew and the reference's: the
    reference's is the float32 pipeline's own output (same seed and steps), shrunk; the
    device's (a correct run) looks like it."""
    from diffusers import DiffusionPipeline

    pictures = doc.verification.images
    assert pictures is not None and pictures.error is None, pictures
    assert pictures.format == "png" and pictures.max_side == runner.PICTURE_SIDE
    assert len(pictures.device) == len(pictures.reference) == len(config.prompts)
    pipeline = DiffusionPipeline.from_pretrained(config.model, dtype=torch.float32)
    pipeline.set_progress_bar_config(disable=True)
    drawn = pipeline(
        prompt=list(config.prompts),
        num_inference_steps=config.denoising_steps,
        generator=torch.Generator("cpu").manual_seed(runner.SEED),
        output_type="pil",
    ).images
    for image, reference, device in zip(drawn, pictures.reference, pictures.device, strict=True):
        image.thumbnail((runner.PICTURE_SIDE, runner.PICTURE_SIDE))
        expected = np.asarray(image.convert("RGB"), dtype=np.int16)
        ours, theirs = _picture(reference), _picture(device)
        assert ours.shape == expected.shape == theirs.shape
        assert np.abs(ours - expected).max() <= 2  # the same picture (rounding aside)
        assert np.abs(theirs - ours).mean() < 8  # a correct run draws the same picture
    assert len(set(pictures.reference)) == len(config.prompts)  # each prompt its own picture


def test_a_picture_is_shrunk_until_its_png_fits_the_bound() -> None:
    side = runner.PICTURE_SIDE
    noise = torch.randint(0, 256, (3, side, side), generator=torch.Generator().manual_seed(0))
    assert 3 * side * side > runner.PICTURE_BYTES  # noise does not compress: too large
    image = _picture(runner.png_base64(noise.to(torch.uint8)))
    assert image.shape == (side // 2, side // 2, 3)  # so drawn again at half the side
    flat = runner.png_base64(torch.full((3, 512, 256), 200, dtype=torch.uint8))
    assert _picture(flat).shape == (runner.PICTURE_SIDE, runner.PICTURE_SIDE // 2, 3)


def test_pictures_of_latents_that_are_not_an_image_say_why() -> None:
    decoder = runner.PictureDecoder(object())  # a pipeline without a vae
    pictures = decoder.pictures(torch.zeros(1, 4, 8, 8), torch.zeros(1, 4, 8, 8))
    assert pictures["device"] == pictures["reference"] == []
    assert "no vae" in pictures["error"]


def test_a_sharded_run_of_a_single_core_task_is_refused_before_it_starts() -> None:
    with pytest.raises(ValueError, match="runs on one core"):
        RunConfig(model="org/m", task=Task.TEXT_TO_IMAGE, cores=2, parallelism="tensor")  # type: ignore[arg-type]


def test_image_classification_prompts_name_the_drawn_test_images() -> None:
    assert RunConfig(model="org/m", task=Task.IMAGE_CLASSIFICATION).prompts[0] == (
        "gradient-checkerboard"
    )
    with pytest.raises(ValueError, match="choose from"):
        RunConfig(model="org/m", task=Task.IMAGE_CLASSIFICATION, prompts=["a cat"])
