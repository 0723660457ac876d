"""The benchmark's policy networks in plain eager torch, for the peer servers.

scripts/bench_peers.py serves the networks bench_server.py serves (an RLlib fully connected
network 16 -> 256 -> 256 (tanh) with a 4-way logits layer and a value head, and the same
layers feeding an LSTM(256) with its own logits and value heads) from other serving systems.
Those run in virtual environments of their own, without rlserve, so the networks are
written here again as plain torch modules; bench_peers.py saves rlserve's weights under
these modules' names (``save_weights``) and tests/unit/test_bench_peers.py checks that they
compute what rlserve's catalog model computes.

Every peer app hands its request bodies, one or a batch, to ``Policy.act_bodies``: the
bodies are rlserve's act bodies (``{"observation": [...]}``, ``{"observations": [[...], ...]}``,
with ``session_id``/``episode_start`` for the LSTM) and the answers have rlserve's keys
(``action``/``logp`` or ``actions``/``logp``). Actions are sampled, as rlserve's default
act does; the value head is loaded but, as there, not run for an act request.

The LSTM's state per ``session_id`` is kept in this process (``Policy.states``, a dict):
that holds only while one worker process serves every request of a session, which is how
bench_peers.py runs each peer. A body without ``session_id`` starts from the zero state.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

OBS, HIDDEN, ACTIONS = 16, 256, 4


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Sequential(nn.Linear(OBS, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh())
        self.logits = nn.Linear(HIDDEN, ACTIONS)
        self.value = nn.Linear(HIDDEN, 1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.logits(self.hidden(obs))


class LSTMPolicy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Sequential(nn.Linear(OBS, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh())
        self.lstm = nn.LSTM(HIDDEN, HIDDEN, batch_first=True)
        self.logits = nn.Linear(HIDDEN, ACTIONS)
        self.value = nn.Linear(HIDDEN, 1)

    def forward(self, obs: torch.Tensor, h: torch.Tensor, c: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out, (h_n, c_n) = self.lstm(self.hidden(obs)[:, None], (h[None], c[None]))
        return self.logits(out[:, 0]), h_n[0], c_n[0]


NETS = {"mlp": MLP, "lstm": LSTMPolicy}


def load_net(model: str, weights: str) -> nn.Module:
    net = NETS[model]()
    net.load_state_dict(torch.load(weights, weights_only=True))
    return net.eval()


class Policy:
    """One model's network, its sampler and (LSTM) the per-session state of this process."""

    def __init__(self, model: str, weights: str) -> None:
        torch.set_num_threads(1)  # as rlserve's one intra-op thread; every server here has one core
        self.model = model
        self.net = load_net(model, weights)
        self.states: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._zero = torch.zeros(HIDDEN)

    @torch.inference_mode()
    def act_bodies(self, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The answers to a batch of act bodies, all rows run through the network at once."""
        rows: list[list[float]] = []
        counts = []
        for body in bodies:
            obs = body.get("observations")
            if obs is None:
                obs = [body["observation"]]
            rows.extend(obs)
            counts.append(len(obs))
        x = torch.tensor(rows, dtype=torch.float32)
        if self.model == "lstm":
            logits = self._step(bodies, x)
        else:
            logits = self.net(x)
        logp_all = torch.log_softmax(logits, dim=1)
        actions = torch.multinomial(logp_all.exp(), 1)
        logp = logp_all.gather(1, actions)[:, 0].tolist()
        actions_list = actions[:, 0].tolist()
        answers, at = [], 0
        for body, n in zip(bodies, counts, strict=True):
            if "observations" in body:
                answers.append({"actions": actions_list[at:at + n], "logp": logp[at:at + n]})
            else:
                answers.append({"action": actions_list[at], "logp": logp[at]})
            at += n
        return answers

    def _step(self, bodies: list[dict[str, Any]], x: torch.Tensor) -> torch.Tensor:
        """One LSTM step per body (one observation each), the state gathered from and
        scattered back to this process's sessions."""
        ids = [body.get("session_id") for body in bodies]
        zero = (self._zero, self._zero)
        starts = [sid is None or body.get("episode_start") or sid not in self.states
                  for sid, body in zip(ids, bodies, strict=True)]
        pairs = [zero if start else self.states[sid] for sid, start in zip(ids, starts, strict=True)]
        h = torch.stack([p[0] for p in pairs])
        c = torch.stack([p[1] for p in pairs])
        logits, h_n, c_n = self.net(x, h, c)
        for i, sid in enumerate(ids):
            if sid is not None:
                self.states[sid] = (h_n[i], c_n[i])
        return logits

