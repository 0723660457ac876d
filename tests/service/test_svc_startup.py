"""`rlserve serve`'s start in-process: refusals as lines, a failure that is no refusal in
one line (or its traceback when asked), and the flags' names when the flags were given."""

from __future__ import annotations

import pytest

from rlserve.service import serve_command, startup
from rlserve.service.startup import StartRefused, check_start, load_settings


def test_a_flag_is_named_as_the_flag_and_a_variable_as_the_variable(monkeypatch) -> None:
    monkeypatch.setenv("RLSERVE_WORKERS", "0")
    with pytest.raises(StartRefused) as info:
        load_settings({})
    assert info.value.lines == ["RLSERVE_WORKERS: expected a number >= 1, received '0'"]
    monkeypatch.delenv("RLSERVE_WORKERS")
    with pytest.raises(StartRefused) as info:
        load_settings({"workers": 0})
    assert info.value.lines == ["--workers: expected a number >= 1, received 0"]


def test_a_long_value_is_shortened(monkeypatch) -> None:
    monkeypatch.setenv("RLSERVE_PORT", "9" * 500)
    with pytest.raises(StartRefused) as info:
        load_settings({})
    (line,) = info.value.lines
    assert len(line) < 160 and "(500 characters)" in line, line


def test_every_problem_of_the_checks_is_one_line(tmp_path) -> None:
    settings = load_settings({"repository": tmp_path / "nope", "checkpoints": [f"x={tmp_path / 'gone'}"]})
    with pytest.raises(StartRefused) as info:
        check_start(settings, given={"repository", "checkpoints"})
    assert [line.split(":")[0] for line in info.value.lines] == ["--repository", f"--checkpoint x={tmp_path}/gone"]


def test_a_failed_start_is_one_line_unless_the_traceback_is_asked_for(monkeypatch, capsys) -> None:
    def broken(settings, sockets, announce):
        raise RuntimeError("the disk is full\nand more detail")

    monkeypatch.setattr(serve_command, "serve", broken)
    monkeypatch.delenv("RLSERVE_LOG_LEVEL", raising=False)
    assert serve_command.serve_main(["--port", "0"]) == 1
    err = capsys.readouterr().err
    assert err == ("rlserve serve: the start failed: RuntimeError: the disk is full and more detail "
                   "(--traceback shows the details)\n")
    with pytest.raises(RuntimeError, match="the disk is full"):
        serve_command.serve_main(["--port", "0", "--traceback"])
    with pytest.raises(RuntimeError, match="the disk is full"):
        serve_command.serve_main(["--port", "0", "--log-level", "debug"])


def test_an_experience_log_that_cannot_be_written_is_refused_in_one_line(tmp_path, monkeypatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    settings = load_settings({"experience_log": blocker})
    with pytest.raises(StartRefused) as info:
        check_start(settings, given=set())
    assert info.value.lines == [f"RLSERVE_EXPERIENCE_LOG: expected a folder to write the experience log in, "
                                f"received {str(blocker)!r} (a file is there)"]
    monkeypatch.setattr(startup, "missing", lambda modules: [m for m in modules if m == "pyarrow"])
    with pytest.raises(StartRefused) as info:
        check_start(load_settings({"experience_log": tmp_path / "log"}), given=set())
    (line,) = info.value.lines
    assert line.startswith("RLSERVE_EXPERIENCE_LOG: the experience log writes Parquet") and line.endswith("pyarrow")
    monkeypatch.setenv("RLSERVE_EXPERIENCE_MODELS", '{"cartpole": 2}')
    with pytest.raises(StartRefused) as info:
        load_settings({})
    assert info.value.lines == ["RLSERVE_EXPERIENCE_MODELS: expected a fraction of episodes in [0, 1] for each "
                                "model, 'cartpole': 2.0, received '{\"cartpole\": 2}'"]
