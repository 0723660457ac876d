"""A real PettingZoo parallel game played through the Python client against ``rlserve serve``.

The server (a real uvicorn process) serves the recorded two-policy RLlib checkpoint
(``tests/fixtures/checkpoints/ppo_rps_multiagent``: ``player_0`` by an LSTM, ``player_1`` by
an MLP) as a policy set, given on the command line with its mapping; the client plays
PettingZoo's rock-paper-scissors (``pettingzoo.classic.rps_v2``, the parallel API) through
``rlserve.client.pettingzoo_runner``: whole episodes, each agent's state on the server, a
seeded episode replayed identically, and the episode's state gone once it ended; over the
policy set's stream (``stream=True``, JSON and msgpack frames, and ``AsyncAgentsStream``) the
same seeded episodes play the same actions as over HTTP.
"""

from __future__ import annotations

import pytest
from checkpoint_cases import case_path, multi_agent_case_ids
from plain_http import HTTP

from rlserve.client.agents_client import AgentsClient
from rlserve.client.pettingzoo_runner import play_parallel_episode, play_parallel_episodes
from tests.e2e.server_process import running_server

pytestmark = pytest.mark.e2e


def _env():
    from pettingzoo.classic import rps_v2

    return rps_v2.parallel_env()


def test_rock_paper_scissors_episodes_play_to_the_end_and_replay_with_a_seed() -> None:
    case = case_path(multi_agent_case_ids()[0])
    args = ["--policy-set", f"rps={case / 'checkpoint'}", "--map", "player_0=p0", "--map", "player_1=p1"]
    with running_server(args) as url, AgentsClient(url, "rps", explore=True) as client:
        info = client.model_info()
        assert info["kind"] == "policy_set" and info["policies"]["p0"]["recurrent"] is True
        assert info["policies"]["p1"]["recurrent"] is False
        played = play_parallel_episodes(client, _env, 3, seed=100, env_seed=0)
        for episode in played:  # rps_v2 plays 15 rounds, then truncates both players
            assert episode.steps == 15 and set(episode.returns) == {"player_0", "player_1"}
            # Zero-sum: each round one player's +1 is the other's -1.
            assert episode.returns["player_0"] == pytest.approx(-episode.returns["player_1"])
            assert all(set(actions) == {"player_0", "player_1"} for actions in episode.actions)
        # Sampling (explore) with a seed replays the very same actions; another seed differs.
        again = play_parallel_episode(client, _env(), seed=100, env_seed=0)
        assert again.actions == played[0].actions and again.returns == played[0].returns
        other = play_parallel_episode(client, _env(), seed=999, env_seed=0)
        assert other.actions != played[0].actions
        # Every episode ended on the server: its agents' sessions are gone.
        sessions = HTTP.get(f"{url}/v1/models/rps").json()["episodes"]
        assert sessions["active"] == 0
        _streams_play_as_http(url, client)  # the same server: no second start



def test_the_experience_log_writes_each_player_as_an_episode_of_its_policy(tmp_path) -> None:
    """With the log on, each player's episode is in its own policy's folder, whole, truncated
    as PettingZoo said, with its agent and module id: the runner sent every last observation."""
    from rlserve.service.experience import reader

    case = case_path(multi_agent_case_ids()[0])
    args = ["--policy-set", f"rps={case / 'checkpoint'}", "--map", "player_0=p0", "--map", "player_1=p1"]
    log, scratch = tmp_path / "log", tmp_path / "tmp"
    scratch.mkdir()
    with running_server(args, {"RLSERVE_EXPERIENCE_LOG": str(log), "TMPDIR": str(scratch)}) as url, \
            AgentsClient(url, "rps", explore=True) as client:
        played = play_parallel_episodes(client, _env, 2, seed=7, env_seed=0)
        assert len(list(scratch.glob("rlserve-policy-set-*"))) == 1  # the checkpoint's export, while served
    # The server stopped (SIGTERM): its shutdown wrote what the log held, and deleted the export
    # (torch keeps its own caches there).
    assert [p.name for p in scratch.iterdir() if p.name.startswith(("rlserve-", "rlsb-"))] == []
    for player, policy in (("player_0", "p0"), ("player_1", "p1")):
        episodes = reader.episodes(log, f"rps.{policy}")
        assert [(e.agent_id, e.module_id) for e in episodes] == [(player, policy)] * 2
        assert all(e.whole and e.is_truncated and not e.is_terminated and len(e) == 15 for e in episodes)
        assert sorted(e.episode_return for e in episodes) == pytest.approx(
            sorted(p.returns[player] for p in played))


def _streams_play_as_http(url: str, client: AgentsClient) -> None:
    """``stream=True`` (one WebSocket per episode, JSON or msgpack frames) plays the seeded
    episodes of the recurrent set action for action as HTTP does; ``AsyncAgentsStream`` too."""
    import asyncio

    over_http = play_parallel_episodes(client, _env, 2, seed=40, env_seed=3)
    for binary in (False, True):
        streamed = play_parallel_episodes(client, _env, 2, seed=40, env_seed=3, stream=True, binary=binary)
        assert [e.actions for e in streamed] == [e.actions for e in over_http]
        assert [e.returns for e in streamed] == [e.returns for e in over_http]
    assert play_parallel_episode(client, _env(), seed=41, env_seed=3, stream=True).actions \
        != over_http[0].actions

    async def replay() -> list[dict]:
        env = _env()
        observations, _ = env.reset(seed=3)
        taken = []
        async with client.async_stream(seed=40) as stream:
            while env.agents:
                actions = await stream.get_actions({a: int(observations[a]) for a in env.agents})
                taken.append(actions)
                observations, rewards, *_ = env.step(actions)
                stream.log_returns(rewards)
            # rlserve serve takes the upgrade in its own protocol: the gauge counts it there too
            assert 'rlserve_streams_open{kind="agents"} 1.0' in HTTP.get(f"{url}/metrics").text
            await stream.end_episode()
        return taken

    assert asyncio.run(replay()) == over_http[0].actions
    assert HTTP.get(f"{url}/v1/models/rps").json()["episodes"]["active"] == 0
    metrics = HTTP.get(f"{url}/metrics").text
    assert 'rlserve_streams_open{kind="agents"} 0.0' in metrics
