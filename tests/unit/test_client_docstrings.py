"""The client package documents itself: ``help(PolicyClient)`` shows real docstrings.

Every public class, function and method of ``service/client/`` (and the special methods a
user calls: ``__init__``, ``__enter__``, ...) has a docstring, read from the source with
``ast`` so a comment in its place does not count; and pydoc renders the client classes with
them.
"""

from __future__ import annotations

import ast
import pydoc
from pathlib import Path

from rlserve.client import AsyncPolicyClient, PolicyClient, RLServeError

CLIENT = Path(__file__).resolve().parents[2] / "service" / "client"
USER_SPECIALS = {"__init__", "__enter__", "__exit__", "__aenter__", "__aexit__"}


def _undocumented(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    missing = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("_"):
            if ast.get_docstring(node) is None:
                missing.append(f"{path.name}:{node.name}")
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            if ast.get_docstring(node) is None:
                missing.append(f"{path.name}:{node.name}")
            for item in node.body:
                public = not item.name.startswith("_") or item.name in USER_SPECIALS \
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) else False
                if public and ast.get_docstring(item) is None:  # type: ignore[arg-type]
                    missing.append(f"{path.name}:{node.name}.{item.name}")  # type: ignore[union-attr]
    return missing


def test_every_public_method_of_the_client_has_a_docstring() -> None:
    missing = [name for path in sorted(CLIENT.glob("*.py")) for name in _undocumented(path)]
    assert not missing, f"client functions without a docstring: {missing}"


def test_help_shows_the_docstrings() -> None:
    sync, asynchronous = pydoc.render_doc(PolicyClient), pydoc.render_doc(AsyncPolicyClient)
    for method in ("act", "act_batch", "create_session", "start_episode", "get_action", "log_returns",
                   "end_episode"):
        assert getattr(PolicyClient, method).__doc__, method
        assert getattr(AsyncPolicyClient, method).__doc__, method
    assert PolicyClient.close.__doc__ and AsyncPolicyClient.aclose.__doc__
    assert "One observation in, one action out" in sync
    assert "Awaitable: one observation in, one action out" in asynchronous
    assert "max_retries" in sync  # the constructor's arguments are explained
    assert "retry_after" in pydoc.render_doc(RLServeError)
