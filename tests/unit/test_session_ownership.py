"""One owner for a session's life: outside ``service/sessions/`` no module reads or writes a
session's in-flight count, the external store's keys of a model (``remote``) or the
per-version stores of a model name (``stores``), nor calls a session store's route-side
lifecycle (``open_session``, ``end_session``, ``export_session``, ``import_session``) or its
idle sweep (``expire_idle``): they go through ``SessionLifecycle`` (docs/architecture.md, "session lifecycle")."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OWNED_ATTRIBUTES = {"inflight", "remote", "stores"}
OWNED_CALLS = {"open_session", "end_session", "export_session", "import_session", "expire_idle"}


def _uses(source: str, name: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source, filename=name)):
        if isinstance(node, ast.Attribute) and node.attr in OWNED_ATTRIBUTES:
            found.append(f"{name}:{node.lineno} .{node.attr}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in OWNED_CALLS):
            found.append(f"{name}:{node.lineno} .{node.func.attr}()")
    return found


def test_only_the_sessions_package_changes_session_state() -> None:
    outside = [p for p in sorted((ROOT / "service").rglob("*.py"))
               if not p.is_relative_to(ROOT / "service" / "sessions")
               and not p.is_relative_to(ROOT / "service" / "client")]
    assert len(outside) > 50
    offending = [use for path in outside for use in _uses(path.read_text(), str(path.relative_to(ROOT)))]
    assert offending == [], "session state changed outside service/sessions/:\n" + "\n".join(offending)


def test_the_check_sees_each_kind_of_use() -> None:
    planted = ("def sneak(entry, session, store):\n"
               "    session.inflight += 1\n"
               "    entry.sessions.remote.fetch([session.id])\n"
               "    entry.sessions.stores['1'].end(session.id)\n"
               "    return store.export_session(session)\n")
    assert sorted(use.split(" ")[1] for use in _uses(planted, "planted.py")) == [
        ".export_session()", ".inflight", ".remote", ".stores"]
