"""One loaded model version: a record of its parts, and how it describes itself.

The work is done elsewhere: ``Preparer`` validates requests (``rlserve.service.step.prepare``),
``BatchStep`` runs batches (``rlserve.service.step.batch``), the ``Batcher`` groups requests,
the session store keeps episodes. ``rlserve.service.serving.loading`` builds the record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlserve.models.export.bundle import Bundle
from rlserve.service.engine.batcher import Batcher
from rlserve.service.engine.live_results import VersionResults
from rlserve.service.engine.pipeline import Pipeline
from rlserve.service.engine.runtime import Runtime
from rlserve.service.sessions.base import SessionStore
from rlserve.service.step.batch import BatchStep
from rlserve.service.step.prepare import Preparer


@dataclass(eq=False)
class Policy:
    bundle: Bundle
    runtime: Runtime
    pipeline: Pipeline
    sessions: SessionStore
    preparer: Preparer
    step: BatchStep
    batcher: Batcher | None = None  # attached once the record exists (the batcher runs ``step.run``)
    # How a request's ``action`` is made from the model's sample unless it says otherwise:
    # RLlib's normalize_actions (unsquash to the Box bounds) and clip_actions.
    unsquash_default: bool = False
    clip_default: bool = False
    # This version's live results (requests, latency, episodes), attached on its first answer.
    live: VersionResults | None = None

    async def close(self) -> None:
        """Stop serving: the batcher fails what is queued (503), the session store lets go of
        what a cancelled batch held, and the files an archive was unpacked into are deleted
        (a bundle directory of the repository is never touched). The runtime keeps nothing
        open on them: ONNX Runtime and torch read the model at load."""
        if self.batcher is not None:
            await self.batcher.close()
        await self.sessions.close()
        self.bundle.close()

    @property
    def name(self) -> str:
        return self.bundle.manifest.name

    @property
    def version(self) -> str:
        return self.bundle.manifest.version

    @property
    def key(self) -> str:
        return f"{self.name}:{self.version}"

    def metadata(self) -> dict[str, Any]:
        """What ``GET /v1/models/{name}`` shows of this version."""
        manifest = self.bundle.manifest
        signature = manifest.signature
        layout = self.preparer.mask_layout
        return {
            "name": self.name,
            "version": self.version,
            "created_at": manifest.created_at,
            "observation_space": manifest.data["observation_space"],
            "action_space": manifest.data["action_space"],
            "model_config": manifest.model_config,
            "action_dist": manifest.action_dist,
            "num_outputs": manifest.num_outputs,
            "preprocessor": manifest.preprocessor,
            "filter": manifest.filter is not None,
            "signature": manifest.data["signature"],
            "state": [
                {"name": s.name, "shape": list(s.shape), "dtype": s.dtype, "initial_value": s.initial_value}
                for s in signature.state
            ],
            "prev": {
                "n_prev_actions": signature.prev.n_prev_actions,
                "n_prev_rewards": signature.prev.n_prev_rewards,
                "action_width": signature.prev.action_width,
            },
            "explore_default": self.preparer.default_explore,
            "unsquash_actions_default": self.unsquash_default,
            "clip_actions_default": self.clip_default,
            "action_mask": {"in_observation": self.preparer.mask_in_obs,
                            "width": None if layout is None else layout.width},
            "runtime": self.runtime.describe(),
            "sessions": {"active": len(self.sessions), "max": self.sessions.max_sessions,
                         "idle_ttl_s": self.sessions.idle_ttl_s},
        }
