"""`rlserve inspect` says what applies to the bundle, and its reference line reads as the
check it was (passed, within a stated tolerance), not as a list of violations."""

from __future__ import annotations

from pathlib import Path

from rlserve.models.export import report
from rlserve.service.cli import main as rlserve

CARTPOLE = Path(__file__).resolve().parents[2] / "service" / "default_models" / "cartpole"


def test_a_vector_observation_shows_no_image_options(capsys) -> None:
    assert rlserve(["inspect", str(CARTPOLE)]) == 0
    text = capsys.readouterr().out
    (line,) = [line for line in text.splitlines() if line.startswith("preprocessor:")]
    assert line == "preprocessor: NoPreprocessor -> (4,) float32", line
    assert "dim=" not in text and "grayscale=" not in text


def test_the_reference_check_reads_as_passed(capsys) -> None:
    assert rlserve(["inspect", str(CARTPOLE)]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("reference:"))
    first, tolerance, seen = lines[start:start + 3]
    assert first.endswith(": passed"), first
    assert tolerance.startswith("  tolerance: |runtime - eager| <= atol + rtol*|eager|"), tolerance
    assert seen.startswith("  largest difference seen (within that tolerance): onnx "), seen


def test_an_image_preprocessor_shows_its_options() -> None:
    data = {"preprocessor": {"class": "GenericPixelPreprocessor", "output_shape": [42, 42, 3],
                             "output_dtype": "float32", "options": {"dim": 42, "grayscale": False,
                                                                    "zero_mean": True}}}
    line = report._preprocessing(data).splitlines()[0]
    assert line == ("preprocessor: GenericPixelPreprocessor -> (42, 42, 3) float32  "
                    "(image options: dim=42 grayscale=False zero_mean=True)")
