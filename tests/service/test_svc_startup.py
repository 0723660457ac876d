"""`rlserve serve`'s start in-process: refusals as lines, a failure that is no refusal in
one line (or its traceback when asked), and the flags' names when the flags were given."""

from __future__ import annotations

import pytest

from rlserve.service import server
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
    def broken(settings):
        raise RuntimeError("the disk is full\nand more detail")

    monkeypatch.setattr(server, "serve", broken)
    monkeypatch.delenv("RLSERVE_LOG_LEVEL", raising=False)
    assert server.serve_main(["--port", "0"]) == 1
    err = capsys.readouterr().err
    assert err == ("rlserve serve: the start failed: RuntimeError: the disk is full and more detail "
                   "(--traceback shows the details)\n")
    with pytest.raises(RuntimeError, match="the disk is full"):
        server.serve_main(["--port", "0", "--traceback"])
    with pytest.raises(RuntimeError, match="the disk is full"):
        server.serve_main(["--port", "0", "--log-level", "debug"])
