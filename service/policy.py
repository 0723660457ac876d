"""One loaded model version: validate requests into ``Step``s, run batches of them.

``prepare`` does everything that can fail because of the client (decode, preprocess,
masks, reported actions) and touches no session state. ``run_batch`` is the batch
function handed to the ``Batcher``: gather session rows, one runtime call, masking,
sampling, scatter. It runs inline or in the batcher's thread, never concurrently with
itself for one policy.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from models.distributions import DistributionError, UnsupportedMethodError
from models.export.bundle import Bundle
from service import codec, masks
from service.batcher import Batcher
from service.errors import InvalidInput
from service.pipeline import Pipeline
from service.runtime import Runtime
from service.sessions import Session, SessionStore
from service.slabs import STATELESS_SLOT
from service.trees import tree_set_row, tree_slice, tree_where
from service.wire import Rows

MASK_KEY = "action_mask"  # RLlib's convention for a mask inside a Dict observation
_NO_RESET = np.zeros(1, dtype=bool)  # a single row's reset flag, shared read-only
_NO_RESET.flags.writeable = False
_RESET = np.ones(1, dtype=bool)
_RESET.flags.writeable = False
_FLOATS_ONLY = {float}
# A model input overflowing its dtype is refused right after the cast (see ``_preprocess``);
# numpy's warning about it would only be log noise.
warnings.filterwarnings("ignore", "overflow encountered in cast", RuntimeWarning, module=__name__)


@dataclass(eq=False, slots=True)
class Step:
    """One request's rows, validated. Arrays are (n, ...) for the request's n rows."""

    obs: np.ndarray | None  # None while ``obs_row`` holds the row (see ``Policy._plain_row``)
    explore: bool
    extras: frozenset[str]
    sessions: list[Session | None]
    reset: np.ndarray  # (n,) bool: episode start (or a new session)
    rewards: list[float | None]
    prev_actions: np.ndarray | None  # (n, A) reported taken actions, NaN rows where absent
    mask: np.ndarray | None  # (n, W) bool, all True where no mask was given
    rngs: list[np.random.Generator | None] = field(default_factory=list)  # per row; [] = none
    has_sessions: bool = False

    rows: int = 0  # n, set from obs
    obs_row: list[float] | None = None  # a validated plain Box row, converted with its batch


@dataclass(slots=True)
class BatchOutput:
    """A batch's results, JSON-ready once for the whole batch (one ``tolist`` per array)."""

    actions: Any  # model-space action structure, leading axis = batch rows (for clip/unsquash)
    actions_json: list[Any]  # env-space JSON values, one per row
    logp: list[Any] | None
    value: list[Any] | None  # only when some request asked for it
    entropy: list[Any] | None
    dist_inputs: list[Any] | None  # only when some request asked for it


@dataclass(slots=True)
class StepOutput:
    """One request's rows ``start:stop`` of its batch's output; the response slices what
    it uses (a single-row request takes items, not slices)."""

    batch: BatchOutput
    start: int
    stop: int

    def actions(self) -> Any:
        """The request's raw model-space actions (leading axis n)."""
        actions = self.batch.actions
        if isinstance(actions, np.ndarray):
            return actions[self.start:self.stop]
        return tree_slice(actions, self.start, self.stop)


class Policy:
    def __init__(self, bundle: Bundle, runtime: Runtime, pipeline: Pipeline, sessions: SessionStore,
                 *, default_explore: bool, seed: int | None = None):
        manifest = bundle.manifest
        self.bundle = bundle
        self.name: str = manifest.name
        self.version: str = manifest.version
        self.signature = manifest.signature
        self.runtime = runtime
        self.pipeline = pipeline
        self.sessions = sessions
        self.default_explore = default_explore
        self.rng = np.random.default_rng(seed)
        self.mask_layout = masks.mask_layout(pipeline.dist_spec)
        obs_space = pipeline.obs_space
        self.mask_in_obs = hasattr(obs_space, "spaces") and isinstance(obs_space.spaces, dict) and MASK_KEY in obs_space.spaces
        self.obs_dtype = runtime.input_dtypes.get("obs", np.dtype(np.float32))
        self._decode_obs = codec.decode_value.dispatch(type(obs_space))  # skip per-call dispatch
        self.batcher: Batcher | None = None  # attached by registry.build_policy
        self.stateful = self.signature.is_recurrent or self.signature.uses_prev_actions or self.signature.uses_prev_rewards
        self._plain_width = self._plain_box_width(pipeline)
        # The codec already refused non-finite values of the space's own dtype; the model
        # input can still overflow when it is narrower (a float64 Box fed as float32) or a
        # filter divides by a small std without clipping. Only then is it checked again.
        self._input_checked = (pipeline.passes_through and pipeline.obs_filter is None
                               and np.dtype(obs_space.dtype) == self.obs_dtype)

    @property
    def key(self) -> str:
        return f"{self.name}:{self.version}"

    # ------------------------------------------------------------------ validation

    def _plain_box_width(self, pipeline: Pipeline) -> int:
        """Length of a flat float32 Box observation that goes to the model unchanged
        (identity preprocessor, no filter, float32 input), else 0.

        Such rows are checked in Python per request and converted to one array per batch
        (one ``np.array`` call for the batch instead of ~4 numpy calls per request)."""
        space = pipeline.obs_space
        shape = space.shape  # None only for spaces without a fixed shape (never a plain Box)
        f32 = np.dtype(np.float32)
        if (not pipeline.passes_through or pipeline.obs_filter is not None or self.mask_in_obs
                or shape is None or len(shape) != 1 or space.dtype != f32 or self.obs_dtype != f32):
            return 0
        return int(shape[0])

    def _plain_row(self, data: Any) -> bool:
        """True when ``data`` is a list of exactly ``_plain_width`` Python floats that are all
        finite in float32 -- rows the full decoder would accept unchanged. Anything else
        (ints, NaN, overflow, wrong length) takes the full decoder, which names the problem."""
        width = self._plain_width
        if not width or type(data) is not list or len(data) != width or set(map(type, data)) != _FLOATS_ONLY:
            return False
        # The sum is nan or inf if any value is; the bounds keep float32 from overflowing.
        return math.isfinite(sum(data)) and -_F32_MAX <= min(data) and max(data) <= _F32_MAX

    def prepare(self, rows: Rows, *, explore: bool | None, extras: frozenset[str]) -> Step:
        """Validate a request's rows into a ``Step``; raises a 4xx ``ServiceError``."""
        space = self.pipeline.obs_space
        field = "observation" if rows.single else "observations"
        if rows.single and self._plain_width and self._plain_row(rows.observations[0]):
            return Step(
                obs=None, obs_row=rows.observations[0],
                explore=self.default_explore if explore is None else explore,
                extras=extras,
                sessions=[None],
                reset=_RESET if rows.episode_starts[0] else _NO_RESET,
                rewards=self._rewards(rows) if rows.has_rewards else rows.rewards,
                prev_actions=self._reported_actions(rows) if rows.has_prev_actions else None,
                mask=self._masks(rows, []) if rows.has_masks else None,
                rows=1,
            )
        decoded: list[Any] | np.ndarray
        if rows.single:
            decoded = [self._decode_obs(space, rows.observations[0], field)]
        else:
            decoded = codec.decode_batch(space, rows.observations, field)
        obs = self._preprocess(decoded, field)
        n = len(decoded)
        return Step(
            obs=obs,
            explore=self.default_explore if explore is None else explore,
            extras=extras,
            sessions=[None] * n,
            # Only session rows reset; a stateless request shares one read-only row of False.
            reset=np.asarray(rows.episode_starts, dtype=bool) if rows.has_sessions or n > 1 else _NO_RESET,
            rewards=self._rewards(rows) if rows.has_rewards else rows.rewards,
            prev_actions=self._reported_actions(rows) if rows.has_prev_actions else None,
            mask=self._masks(rows, decoded) if rows.has_masks or self.mask_in_obs else None,
            rows=n,
        )

    def _preprocess(self, decoded: list[Any] | np.ndarray, field: str) -> np.ndarray:
        try:
            obs = self.pipeline.preprocess(decoded)
        except ValueError as exc:
            # The preprocessor's ObservationError names path/expected/received.
            path = getattr(exc, "path", None)
            expected, received = getattr(exc, "expected", None), getattr(exc, "received", None)
            raise InvalidInput(
                f"{field}: {exc}",
                field=f"{field}{'' if not path else '.' + str(path)}",
                expected=codec.describe_space(self.pipeline.obs_space) if expected is None else expected,
                received=str(exc) if received is None else received,
            ) from None
        obs = np.ascontiguousarray(obs, dtype=self.obs_dtype)
        if not self._input_checked and obs.dtype.kind == "f" and not np.isfinite(obs).all():
            row = int(np.argmin(np.isfinite(obs.reshape(len(obs), -1)).all(axis=1)))
            name = field if field == "observation" else f"{field}[{row}]"
            raise InvalidInput(f"{name}: values overflow the model's {self.obs_dtype.name} input",
                               field=name, expected=f"values that are finite as {self.obs_dtype.name}",
                               received="a value that becomes inf or nan")
        return obs

    def _rewards(self, rows: Rows) -> list[float | None]:
        for i, reward in enumerate(rows.rewards):
            # The model's prev_reward is float32: a double such as 1e39 would be stored as inf.
            # (NaN fails both comparisons.)
            if reward is not None and not -_F32_LIMIT < reward < _F32_LIMIT:
                name = "reward" if rows.single else f"rewards[{i}]"
                raise InvalidInput(f"{name}: must be a number that is finite as float32", field=name,
                                   expected=f"a number with |x| <= {_F32_MAX:.8g}", received=reward)
        return rows.rewards

    def _reported_actions(self, rows: Rows) -> np.ndarray | None:
        """Reported taken actions as flat (n, A) rows; NaN rows where none was reported."""
        given = [(i, a) for i, a in enumerate(rows.prev_actions) if a is not msgspec.UNSET and a is not None]
        if not given:
            return None
        flat_rows = []
        for i, action in given:
            name = "prev_action" if rows.single else f"prev_actions[{i}]"
            try:
                batch_of_one = self.pipeline.action_from_json(action)
            except ValueError as exc:
                raise InvalidInput(f"{name}: {exc}", field=name, expected=codec.describe_space(self.pipeline.action_space),
                                   received=action) from None
            flat = self.pipeline.flatten_actions(batch_of_one)[0]
            if not np.isfinite(flat).all():  # e.g. a Box action of 1e39: inf as float32
                raise InvalidInput(f"{name}: values must be finite as float32", field=name,
                                   expected=codec.describe_space(self.pipeline.action_space), received=action)
            flat_rows.append(flat)
        out = np.full((len(rows), flat_rows[0].shape[0]), np.nan, dtype=np.float32)
        out[[i for i, _ in given]] = np.stack(flat_rows)
        return out

    def _masks(self, rows: Rows, decoded: list[Any] | np.ndarray) -> np.ndarray | None:
        row_masks: list[np.ndarray | None] = []
        for i, explicit in enumerate(rows.action_masks):
            name = "action_mask" if rows.single else f"action_masks[{i}]"
            value = explicit
            if value is None and self.mask_in_obs:
                value = decoded[i][MASK_KEY]
                name = f"observation.{MASK_KEY}" if rows.single else f"observations[{i}].{MASK_KEY}"
            row_masks.append(None if value is None else masks.validate_mask(value, self.mask_layout, name))
        if all(m is None for m in row_masks):
            return None
        width = self.mask_layout.width if self.mask_layout is not None else 0
        return np.stack([np.ones(width, bool) if m is None else m for m in row_masks])

    # ------------------------------------------------------------------ the batch

    def run_batch(self, steps: list[Step]) -> list[StepOutput]:
        inputs = {"obs": self._batch_obs(steps)}
        if self.stateful:
            slots, live = self._slots([s for step in steps for s in step.sessions])
            self._gather(steps, slots, live, inputs)
        outputs = self.runtime.run(inputs)
        dist_inputs = outputs["dist_inputs"]
        dist_inputs = self._apply_masks(steps, dist_inputs)
        actions, logp, entropy = self._act(steps, dist_inputs)
        if self.stateful:
            self._scatter(outputs, slots, live, actions)
        return self._split(steps, actions, logp, entropy, outputs["value"], dist_inputs)

    def _batch_obs(self, steps: list[Step]) -> np.ndarray:
        rows = [s.obs_row for s in steps]
        if None not in rows:  # every request a plain row: one conversion for the batch
            return np.array(rows, dtype=self.obs_dtype)
        if len(steps) == 1:
            obs = steps[0].obs
            assert obs is not None  # its obs_row is None, so it was decoded into obs
            return obs
        return np.concatenate([np.array([s.obs_row], dtype=self.obs_dtype) if s.obs is None else s.obs
                               for s in steps])

    def _slots(self, sessions: list[Session | None]) -> tuple[np.ndarray, np.ndarray]:
        slots = np.fromiter((STATELESS_SLOT if s is None else s.slot for s in sessions), np.int64, len(sessions))
        return slots, slots != STATELESS_SLOT

    def _gather(self, steps: list[Step], slots: np.ndarray, live: np.ndarray, inputs: dict[str, np.ndarray]) -> None:
        reset = np.concatenate([s.reset for s in steps]) & live
        rewards = [r for s in steps for r in s.rewards]
        reward_rows = np.fromiter((r is not None for r in rewards), bool, len(rewards)) & live & ~reset
        reported = self._reported(steps)
        slabs = self.sessions.slabs
        with slabs.lock:
            if reward_rows.any():
                values = np.fromiter((0.0 if r is None else r for r in rewards), np.float32, len(rewards))
                slabs.report(slots[reward_rows], values[reward_rows], None)
            if reported is not None:
                rows = ~np.isnan(reported[:, 0]) & live & ~reset
                slabs.report(slots[rows], None, reported[rows])
            slabs.reset(slots[reset])
            inputs.update(slabs.gather(slots))

    @staticmethod
    def _reported(steps: list[Step]) -> np.ndarray | None:
        if all(s.prev_actions is None for s in steps):
            return None
        width = next(s.prev_actions.shape[1] for s in steps if s.prev_actions is not None)
        parts = [s.prev_actions if s.prev_actions is not None else np.full((s.rows, width), np.nan, np.float32) for s in steps]
        return np.concatenate(parts)

    def _apply_masks(self, steps: list[Step], dist_inputs: np.ndarray) -> np.ndarray:
        if all(s.mask is None for s in steps):
            return dist_inputs
        layout = self.mask_layout
        assert layout is not None  # prepare() accepts a mask only when the model has a layout
        mask = np.concatenate([s.mask if s.mask is not None else np.ones((s.rows, layout.width), np.bool_)
                               for s in steps])
        return masks.apply_mask(dist_inputs, mask, layout)

    def _act(self, steps: list[Step], dist_inputs: np.ndarray) -> tuple[Any, Any, Any]:
        spec = self.pipeline.dist_spec
        dist = spec.build(dist_inputs)
        modes = {s.explore for s in steps}
        if len(modes) == 1:
            explore = np.full(dist_inputs.shape[0], modes.pop())
        else:
            explore = np.repeat([s.explore for s in steps], [s.rows for s in steps])
        if explore.all():
            actions = dist.sample(self.rng)
        elif not explore.any():
            actions = dist.deterministic_sample()
        else:
            actions = tree_where(explore, dist.sample(self.rng), dist.deterministic_sample())
        # Seeded sessions draw from their own generator (the one they had when the request
        # was accepted), one row at a time, so an episode replays whatever shares its batch.
        start = 0
        for step in steps:
            if step.rngs:
                for offset, rng in enumerate(step.rngs):
                    row = start + offset
                    if rng is not None and explore[row]:
                        tree_set_row(actions, row, spec.build(dist_inputs[row:row + 1]).sample(rng))
            start += step.rows
        logp = _optional(lambda: dist.logp(actions))
        wants_entropy = any("entropy" in s.extras for s in steps)
        entropy = _optional(dist.entropy) if wants_entropy else None
        return actions, logp, entropy

    def _scatter(self, outputs: dict[str, np.ndarray], slots: np.ndarray, live: np.ndarray, actions: Any) -> None:
        if not live.any():
            return
        state_out = [outputs[f"state_out_{i}"][live] for i in range(len(self.signature.state))]
        flat = self.pipeline.flatten_actions(actions)[live] if self.signature.uses_prev_actions else None
        slabs = self.sessions.slabs
        with slabs.lock:
            slabs.scatter(slots[live], state_out, flat)

    def _split(self, steps, actions, logp, entropy, value, dist_inputs) -> list[StepOutput]:
        """Encode the batch once (one ``tolist`` per array); each request gets its row range."""
        batch = BatchOutput(
            actions=actions,
            actions_json=codec.encode_batch(self.pipeline.action_space, actions),
            logp=floats_json(logp),
            value=floats_json(value) if any("value" in s.extras for s in steps) else None,
            entropy=floats_json(entropy),
            dist_inputs=dist_inputs.tolist() if any("dist_inputs" in s.extras for s in steps) else None,
        )
        results, start = [], 0
        for step in steps:
            stop = start + step.rows
            results.append(StepOutput(batch, start, stop))
            start = stop
        return results

    # ------------------------------------------------------------------ description

    def metadata(self) -> dict[str, Any]:
        manifest = self.bundle.manifest
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
                for s in self.signature.state
            ],
            "prev": {
                "n_prev_actions": self.signature.prev.n_prev_actions,
                "n_prev_rewards": self.signature.prev.n_prev_rewards,
                "action_width": self.signature.prev.action_width,
            },
            "explore_default": self.default_explore,
            "action_mask": {"in_observation": self.mask_in_obs,
                            "width": None if self.mask_layout is None else self.mask_layout.width},
            "runtime": self.runtime.describe(),
            "sessions": {"active": len(self.sessions), "max": self.sessions.max_sessions,
                         "idle_ttl_s": self.sessions.idle_ttl_s},
        }


_F32_MAX = float(np.finfo(np.float32).max)
# The smallest double that rounds to inf as float32: float32's max plus half its last step
# (the tie rounds to even, i.e. up, since the max has an odd mantissa).
_F32_LIMIT = _F32_MAX + 2.0 ** 103


def floats_json(values: np.ndarray | None) -> list[Any] | None:
    """Floats as JSON lists; non-finite entries (JSON has none) become null."""
    if values is None:
        return None
    arr = np.asarray(values, dtype=np.float64)
    if np.isfinite(arr).all():
        return arr.tolist()
    return _nulls(arr.tolist())


def _nulls(value: Any) -> Any:
    if isinstance(value, list):
        return [_nulls(v) for v in value]
    return value if value == value and value not in (float("inf"), float("-inf")) else None


def _optional(fn):
    """Methods RLlib leaves undefined (Deterministic.logp, SquashedGaussian.entropy) -> None."""
    try:
        return fn()
    except (UnsupportedMethodError, NotImplementedError):
        return None
    except DistributionError:
        raise
