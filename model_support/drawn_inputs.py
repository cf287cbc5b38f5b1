"""The inputs run.py draws itself, copied here for the builders of the tiny checkpoints.

run.py stands alone (it cannot import this package), and the package does not import run.py:
the test images' patterns and the tone-spelled speech are written in both, and
``tests/test_standalone_copies.py`` holds each copy to run.py's source, byte for byte. The
builders train the tiny image classifier, Stable Diffusion and Whisper on exactly what a test
feeds them.
"""

from __future__ import annotations

# Spoken inputs: run.py spells each prompt as a sequence of tones, one per character, so the
# waveform is deterministic, needs no audio file, and a model trained on such "speech" (the
# tiny test fixture) transcribes it back.
TONE_ALPHABET = " abcdefghijklmnopqrstuvwxyz0123456789.,:;()[]=+-*/_'\"\n"
TONE_SECONDS = 0.04  # one character
TONE_LOW_HZ, TONE_HIGH_HZ = 150.0, 7000.0


def tone_frequency(char: str) -> float | None:
    """The tone of one character (mel-spaced over the alphabet); None: silence."""
    import math

    index = TONE_ALPHABET.find(char.lower())
    if index < 0:
        return None

    def mel(hz: float) -> float:
        return 2595.0 * math.log10(1.0 + hz / 700.0)

    low, high = mel(TONE_LOW_HZ), mel(TONE_HIGH_HZ)
    point = low + (high - low) * index / (len(TONE_ALPHABET) - 1)
    return 700.0 * (10 ** (point / 2595.0) - 1.0)


def spoken_waveform(text: str, sampling_rate: int):
    """The text as tones (float32 numpy array at ``sampling_rate``), with 5 ms ramps."""
    import numpy as np

    n = round(TONE_SECONDS * sampling_rate)
    ramp = np.minimum(1.0, np.minimum(np.arange(n), np.arange(n)[::-1]) / (0.005 * sampling_rate))
    t = np.arange(n) / sampling_rate
    pieces = []
    for char in text:
        frequency = tone_frequency(char)
        tone = np.zeros(n) if frequency is None else 0.5 * np.sin(2 * np.pi * frequency * t)
        pieces.append(tone * ramp)
    return np.concatenate(pieces or [np.zeros(n)]).astype(np.float32)


def draw_pattern(kind: str, period: int, colour_a, colour_b, size: int = 224, phase: int = 0):
    """An RGB PIL image of stripes or a checkerboard (numpy), two colours, given period."""
    import numpy as np
    from PIL import Image

    y, x = np.mgrid[0:size, 0:size]
    half = max(period // 2, 1)
    if kind == "horizontal":
        mask = ((y + phase) // half) % 2 == 0
    elif kind == "vertical":
        mask = ((x + phase) // half) % 2 == 0
    elif kind == "checkerboard":
        mask = (((x + phase) // half) + ((y + phase) // half)) % 2 == 0
    elif kind == "diagonal":
        mask = ((x + y + phase) // half) % 2 == 0
    else:
        raise ValueError(f"unknown pattern {kind!r}")
    pixels = np.where(mask[..., None], np.array(colour_a), np.array(colour_b)).astype(np.uint8)
    return Image.fromarray(pixels, "RGB")
