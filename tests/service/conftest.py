"""Fixtures for the service tests: bundles built once per session, apps over them."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest
import svc_bundles

from rlserve.models.export.policy_set_export import policy_set_from_bundles
from rlserve.models.multiagent.mapping import AgentMapping
from rlserve.service.app import create_app
from rlserve.service.settings import Settings


@pytest.fixture(scope="session")
def bundle_store(tmp_path_factory) -> Path:
    """Every bundle of ``svc_bundles.SPECS``, exported once per run (torch at build time only;
    ``svc_bundles.shared``). Read only: tests copy what they change (``make_repo``)."""
    return svc_bundles.shared(tmp_path_factory)


@pytest.fixture
def make_repo(tmp_path, bundle_store):
    """``make_repo(*names)`` -> a fresh repository directory holding copies of those bundles."""

    count = iter(range(1_000))

    def make(*names: str) -> Path:
        repo = tmp_path / f"repo{next(count)}"
        repo.mkdir()
        for name in names:
            shutil.copytree(bundle_store / name, repo / name)
        return repo

    return make


@pytest.fixture
def make_client(make_repo):
    """``make_client(names, **settings)`` -> (app, httpx.AsyncClient over ASGITransport)."""
    clients = []

    def make(names=("mlp",), **settings):
        settings.setdefault("repository", make_repo(*names))
        app = create_app(Settings(**settings))
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
        clients.append(client)
        return app, client

    yield make


def error_of(response: httpx.Response) -> dict:
    """The error object of an error response, checking the one JSON error shape."""
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "field", "expected", "received"}, body
    return body["error"]


# The policy set of the multi-agent service tests: "boss" and red_* act with the LSTM, blue_*
# with the MLP, any other agent is refused.
TEAM_MAPPING = AgentMapping({"boss": "rnn"}, [("red_*", "rnn"), ("blue_*", "ff")], None)


@pytest.fixture(scope="module")
def team_set(bundle_store, tmp_path_factory) -> Path:
    """The policy set ``team`` (``TEAM_MAPPING`` over the mlp and lstm bundles), made once per module."""
    out = tmp_path_factory.mktemp("sets") / "team"
    with policy_set_from_bundles({"ff": bundle_store / "mlp", "rnn": bundle_store / "lstm"}, out, TEAM_MAPPING,
                                 name="team"):
        pass
    return out
