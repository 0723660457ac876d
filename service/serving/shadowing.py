"""Which shadow runs on which live model version: starting, describing and stopping them.

One shadow per live model name (``rlserve.service.shadow``): a candidate (another version
of the model, or another loaded model with the same observation and action spaces) run on
one live version's traffic. Set by the admin API (``PUT/GET/DELETE
/v1/admin/models/{name}/shadow``) or at start (``RLSERVE_SHADOW``). Unloading the live
version or the candidate stops the shadow (its state says why); nothing else changes.
"""

from __future__ import annotations

import logging
from typing import Any

from rlserve.service.errors import InvalidInput, NotFound, quoted
from rlserve.service.serving import shadow_child
from rlserve.service.serving.policy import Policy
from rlserve.service.serving.shadow_child import ChildConfig
from rlserve.service.shadow.durable import namespace
from rlserve.service.shadow.process import CandidateProcess
from rlserve.service.shadow.queue import ShadowQueue
from rlserve.service.shadow.shadow import Shadow

log = logging.getLogger("rlserve.shadow")

SPACES = ("observation_space", "action_space")


def admission_mark(queue_rows: int) -> int:
    """Rows waiting below which a new episode is admitted to the shadow: half the queue (the
    other half is the admitted episodes' room), at least 1."""
    return max(1, queue_rows // 2)


class ShadowControl:
    """The shadows of one registry, by live model name (stopped ones stay until replaced or deleted)."""

    def __init__(self, settings: Any, experience: Any = None):
        self.settings = settings
        self.experience = experience  # the experience log (its shadow table), or None
        self.shadows: dict[str, Shadow] = {}
        self._live: dict[str, Policy] = {}  # live name -> the live version's policy

    def start(self, live: Policy, candidate: Policy, queue_rows: int) -> Shadow:
        """Shadow ``live`` with ``candidate`` (replacing the model's shadow); 422 when their
        spaces differ or ``queue_rows`` is not positive."""
        if queue_rows < 1:
            raise InvalidInput("queue_rows must be a positive number of rows", field="queue_rows",
                               expected="an integer >= 1", received=queue_rows)
        ours, theirs = live.bundle.manifest.data, candidate.bundle.manifest.data
        for space in SPACES:
            if ours[space] != theirs[space]:
                raise InvalidInput(f"candidate {quoted(candidate.key)} has another {space.replace('_', ' ')} than "
                                   f"{quoted(live.key)}: a shadow needs the same spaces", field="candidate",
                                   expected={space: ours[space]}, received={space: theirs[space]})
        self.stop(live.name, "replaced")
        settings = self.settings
        label, live_label = f"{candidate.name}@{candidate.version}", f"{live.name}@{live.version}"
        store = settings.session_store
        config = ChildConfig(candidate.bundle.root, label, live_label, settings, self._model_log(live),
                             None if store is None else namespace(settings.session_store_prefix, live_label, label))
        process = CandidateProcess(shadow_child.__name__, config)
        shadow = Shadow(live_label, label, ShadowQueue(queue_rows, admit_below=admission_mark(queue_rows)), process,
                        state_store="this process" if store is None else "external")
        # The raw observations (a candidate may preprocess them its own way) are kept
        # on the step, as the experience log keeps them.
        live.preparer.keep_raw = True
        live.step.shadow = shadow
        self.shadows[live.name] = shadow
        self._live[live.name] = live
        log.info("shadow: %s runs on %s's traffic (queue %d rows)", label, live.key, queue_rows)
        return shadow

    def _model_log(self, live: Policy) -> Any:
        """Where the scores of logged steps go: the live model's part of the experience log."""
        return None if self.experience is None else self.experience.model_log(live.name)

    def get(self, name: str) -> Shadow:
        shadow = self.shadows.get(name)
        if shadow is None:
            raise NotFound(f"model {quoted(name)} has no shadow", field="name", received=name)
        return shadow

    def delete(self, name: str) -> Shadow:
        shadow = self.get(name)
        self.stop(name, "deleted")
        del self.shadows[name]
        self._live.pop(name, None)
        return shadow

    def stop(self, name: str, reason: str, wait: bool = False) -> None:
        shadow = self.shadows.get(name)
        if shadow is None or shadow.stopped is not None:
            return
        stopped: Shadow = shadow
        stopped.stop(reason, wait)
        live = self._live.get(name)
        if live is not None and live.step.shadow is stopped:
            live.step.shadow = None
            live.preparer.keep_raw = live.step.recorder is not None
        log.info("shadow: %s on %s stopped (%s)", stopped.candidate, stopped.live, reason)

    def removed(self, policy: Policy) -> None:
        """``policy`` is being unloaded: stop the shadows it is the live version or the candidate of."""
        key = f"{policy.name}@{policy.version}"
        for name, shadow in list(self.shadows.items()):
            if shadow.live == key:
                self.stop(name, "live version unloaded")
            elif shadow.candidate == key:
                self.stop(name, "candidate unloaded")

    def close(self) -> None:
        for name in list(self.shadows):
            self.stop(name, "server stopping", wait=True)  # its log written before the server's ends

    def stats(self):
        """(live model, live version, candidate, counts, queue depth) per shadow, for /metrics."""
        for shadow in list(self.shadows.values()):
            model, _, version = shadow.live.rpartition("@")
            yield model, version, shadow.candidate, shadow.counts(), shadow.depth()
