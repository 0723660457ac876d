"""Prepare: one request's rows, validated into a ``Step`` (decode, preprocess, masks).

Everything that can fail because of the client happens here, and nothing here touches
session state: a refused request leaves every session as it was. The batch step
(``rlserve.service.step.batch``) later runs many ``Step``s as one batch.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
from gymnasium import spaces as gs

from rlserve.service.engine.pipeline import Pipeline
from rlserve.service.errors import InvalidInput
from rlserve.service.sessions.lifecycle import Bound
from rlserve.service.sessions.store import Session
from rlserve.service.step import codec, columns, masks, windows
from rlserve.service.step.codec import F32_LIMIT, F32_MAX
from rlserve.service.step.rows import Rows

MASK_KEY = "action_mask"  # RLlib's convention for a mask inside a Dict observation
_NO_RESET = np.zeros(1, dtype=bool)  # a single row's reset flag, shared read-only
_NO_RESET.flags.writeable = False
_RESET = np.ones(1, dtype=bool)
_RESET.flags.writeable = False
# A model input overflowing its dtype is refused right after the cast (see ``_preprocess``);
# numpy's warning about it would only be log noise.
warnings.filterwarnings("ignore", "overflow encountered in cast", RuntimeWarning, module=__name__)


@dataclass(eq=False, slots=True)
class Step:
    """One request's rows, validated. Arrays are (n, ...) for the request's n rows."""

    obs: np.ndarray | None  # None while ``obs_row`` holds the row (see ``Preparer.prepare``)
    explore: bool
    extras: frozenset[str]
    sessions: list[Session | None]
    reset: np.ndarray  # (n,) bool: episode start (or a new session)
    rewards: list[float | None]
    prev_actions: np.ndarray | None  # (n, A) reported taken actions, NaN rows where absent
    mask: np.ndarray | None  # (n, W) bool, all True where no mask was given
    # Per row, the generator a seeded session draws from; set when the batch runs ([] = none).
    rngs: list[np.random.Generator | None] = field(default_factory=list)
    # Existing sessions this request starts a new episode in, with their new seed (None:
    # keep the generator); applied when the batch runs, after the session's earlier steps.
    restarts: list[tuple[Session, int | None]] | None = None
    windows: list[dict[str, np.ndarray] | None] | None = None  # sent trajectory windows, per row
    has_sessions: bool = False
    epsilon: float | None = None  # a Q-policy's exploration rate for this request (None: the model's)
    keep_answer: bool = False  # the request carried a step index: its sessions keep this answer
    expect_steps: int | None = None  # that index (not at an episode start): checked when the batch runs

    rows: int = 0  # n, set from obs
    obs_row: list[float] | None = None  # a validated plain Box row, converted with its batch
    # For the experience log (rlserve.service.experience), only where it records this model:
    # the observations as decoded, before preprocessing (None: ``obs_row`` is the row);
    # which rows end their episode (``Rows.ends``); which agent and policy of a policy set
    # the rows are (``Rows.agents``, ``Rows.module_id``); how the answer's action is made
    # from the sample; and, once logged, each row's event id.
    raw_obs: Any = None
    ends: list[int] | None = None
    agents: list[str] | None = None
    module_id: str | None = None
    unsquash: bool = False
    clip: bool = False
    event_ids: list[str | None] | None = None
    closed: list[Any] | None = None  # the transitions this request closed, until its answer stands

    def take_sessions(self, bound: Bound) -> None:
        """The sessions the request bound (``SessionLifecycle.bind``), for its batch."""
        self.sessions, self.restarts, self.has_sessions = bound.sessions, bound.restarts, True


class Preparer:
    """Validates requests for one model version (its spaces, pipeline and input dtype)."""

    def __init__(self, pipeline: Pipeline, obs_dtype: np.dtype, *, default_explore: bool,
                 window_layout: windows.WindowLayout | None = None):
        self.pipeline = pipeline
        self.obs_dtype = obs_dtype
        self.default_explore = default_explore
        self.mask_layout = masks.mask_layout(pipeline.dist_spec)
        self.window_layout = window_layout
        self.keep_raw = False  # the experience log records this model: keep ``Step.raw_obs``
        # A Q-policy (DQN's q_model): takes a request's epsilon and returns its Q-values.
        self.q_policy = pipeline.dist_spec.dist_class.inputs_are_q_values
        obs_space = pipeline.obs_space
        self.mask_in_obs = (pipeline.obs_mask_key is not None and hasattr(obs_space, "spaces")
                            and isinstance(obs_space.spaces, dict) and MASK_KEY in obs_space.spaces)
        self._decode_obs = codec.decode_value.dispatch(type(obs_space))  # skip per-call dispatch
        self._decode_column = columns.decode_column.dispatch(type(obs_space))
        self.plain_width = self._plain_box_width()
        # The codec already refused non-finite values of the space's own dtype; the model
        # input can still overflow when it is narrower (a float64 Box fed as float32) or a
        # filter divides by a small std without clipping. Only then is it checked again.
        # Integers (a uint8 image) are finite as float32 or float64 whatever their value: a
        # 1,024-row 84x84x4 batch is 29 million floats, not worth a second pass.
        space_dtype = np.dtype(obs_space.dtype)
        self._input_checked = (pipeline.passes_through and pipeline.obs_filter is None
                               and (space_dtype == obs_dtype
                                    or (space_dtype.kind in "iub" and obs_dtype in (np.float32, np.float64))))
        # An integer Box passed through unchanged (an 84x84x4 uint8 frame) stays in the
        # dtype it was decoded in until its batch is assembled: the batch casts once
        # (``BatchStep``), or the runtime's staging does on its copy to the device, instead
        # of a float copy per request (4x the bytes) copied again into the batch. The cast
        # is the same one, only later, so the model sees the same values.
        self.narrow_obs = (pipeline.passes_through and pipeline.obs_filter is None and space_dtype.kind in "iub"
                           and obs_dtype.kind == "f")

    def _plain_box_width(self) -> int:
        """Length of a flat float32 Box observation that goes to the model unchanged
        (identity preprocessor, no filter, float32 input), else 0.

        Such rows are checked in Python per request and converted to one array per batch
        (one ``np.array`` call for the batch instead of ~4 numpy calls per request)."""
        pipeline = self.pipeline
        space = pipeline.obs_space
        shape = space.shape  # None only for spaces without a fixed shape (never a plain Box)
        f32 = np.dtype(np.float32)
        if (not pipeline.passes_through or pipeline.obs_filter is not None or self.mask_in_obs
                or shape is None or len(shape) != 1 or space.dtype != f32 or self.obs_dtype != f32):
            return 0
        return int(shape[0])

    def prepare(self, rows: Rows, *, explore: bool | None, extras: frozenset[str],
                epsilon: float | None = None) -> Step:
        """Validate a request's rows into a ``Step``; raises a 4xx ``ServiceError``."""
        if "q_values" in extras and not self.q_policy:
            raise InvalidInput("outputs: 'q_values' come from Q-policies (a q_model) only; this model's "
                               "dist_inputs are not Q-values", field="outputs",
                               expected="outputs without 'q_values' for this model", received="q_values")
        step = self._prepare(rows, self.default_explore if explore is None else explore, extras)
        if rows.windows is not None:
            step.windows = self._windows(rows)
        if epsilon is not None:
            step.epsilon = self._epsilon(epsilon)
        return step

    def _epsilon(self, epsilon: float) -> float:
        if not self.q_policy:
            raise InvalidInput("epsilon: only Q-policies (a q_model) explore epsilon-greedily",
                               field="epsilon", expected="no epsilon for this model", received=repr(epsilon))
        if not 0.0 <= epsilon <= 1.0:
            raise InvalidInput("epsilon must be in [0, 1]", field="epsilon", expected="a number in [0, 1]",
                               received=repr(epsilon))
        return float(epsilon)

    def _prepare(self, rows: Rows, explore: bool, extras: frozenset[str]) -> Step:
        space = self.pipeline.obs_space
        field = "observation" if rows.single else "observations"
        if rows.single and self.plain_width and codec.is_plain_row(rows.observations[0], self.plain_width):
            return Step(
                obs=None, obs_row=rows.observations[0],
                explore=explore,
                extras=extras,
                sessions=[None],
                reset=_RESET if rows.episode_starts[0] else _NO_RESET,
                rewards=self._rewards(rows) if rows.has_rewards else rows.rewards,
                prev_actions=self._reported_actions(rows) if rows.has_prev_actions else None,
                mask=self._masks(rows, []) if rows.has_masks else None,
                rows=1,
                ends=rows.ends,
                agents=rows.agents,
                module_id=rows.module_id,
            )
        decoded: list[Any] | np.ndarray
        if rows.decoded:
            decoded = rows.observations
        elif isinstance(rows.observations, np.ndarray):  # one binary block of rows
            decoded = self._decode_block(rows.observations)
        elif rows.single:
            decoded = [self._decode_obs(space, rows.observations[0], field)]
        else:
            decoded = codec.decode_batch(space, rows.observations, field)
        obs = self._preprocess(decoded, field, narrow=self.narrow_obs)
        n = len(decoded)
        return Step(
            obs=obs,
            explore=explore,
            extras=extras,
            sessions=[None] * n,
            # Only session rows reset; a stateless request shares one read-only row of False.
            reset=np.asarray(rows.episode_starts, dtype=bool) if rows.has_sessions or n > 1 else _NO_RESET,
            rewards=self._rewards(rows) if rows.has_rewards else rows.rewards,
            prev_actions=self._reported_actions(rows) if rows.has_prev_actions else None,
            mask=self._masks(rows, decoded) if rows.has_masks or self.mask_in_obs else None,
            rows=n,
            raw_obs=decoded if self.keep_raw else None,
            ends=rows.ends,
            agents=rows.agents,
            module_id=rows.module_id,
        )

    def _decode_block(self, block: np.ndarray) -> np.ndarray:
        """A ``(B, *obs_shape)`` block validated as a whole, as the codec validates each row
        (shape, casts that lose nothing, finite floats); errors name the first bad row."""
        space = self.pipeline.obs_space
        if not isinstance(space, gs.Box):
            raise InvalidInput("observations: a binary block needs a Box observation space", field="observations",
                               expected=codec.describe_space(space), received="a binary block")
        return self._decode_column(space, block, "observations")

    def _preprocess(self, decoded: list[Any] | np.ndarray, field: str, narrow: bool = False) -> np.ndarray:
        """The model's ``obs`` rows; with ``narrow``, integer rows keep their dtype (see
        ``narrow_obs``)."""
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
        if narrow and obs.dtype.kind in "iub":
            return np.ascontiguousarray(obs)  # integers are finite in any float dtype
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
            if reward is not None and not -F32_LIMIT < reward < F32_LIMIT:
                name = "reward" if rows.single else f"rewards[{i}]"
                raise InvalidInput(f"{name}: must be a number that is finite as float32", field=name,
                                   expected=f"a number with |x| <= {F32_MAX:.8g}", received=reward)
        return rows.rewards

    def _windows(self, rows: Rows) -> list[dict[str, np.ndarray] | None]:
        """Validated trajectory windows of stateless rows (``rlserve.service.step.windows``)."""
        assert rows.windows is not None
        space = self.pipeline.obs_space

        def observation(raw: Any, name: str) -> np.ndarray:
            return self._preprocess([self._decode_obs(space, raw, name)], name)[0]

        out: list[dict[str, np.ndarray] | None] = []
        for i, value in enumerate(rows.windows):
            name = "window" if rows.single else f"windows[{i}]"
            out.append(None if value is None else windows.validate_window(
                value, self.window_layout, name, in_session=rows.session_ids[i] is not None,
                observation=observation, action=self._flat_action))
        return out

    def _flat_action(self, action: Any, name: str) -> np.ndarray:
        """One reported action as the model's flat (A,) row; 422 naming ``name`` if invalid."""
        pipeline = self.pipeline
        try:
            batch_of_one = pipeline.prev_action_from_json(action)
        except ValueError as exc:
            raise InvalidInput(f"{name}: {exc}", field=name, expected=codec.describe_space(pipeline.action_space),
                               received=action) from None
        flat = pipeline.flatten_actions(batch_of_one)[0]
        if not np.isfinite(flat).all():  # e.g. a Box action of 1e39: inf as float32
            raise InvalidInput(f"{name}: values must be finite as float32", field=name,
                               expected=codec.describe_space(pipeline.action_space), received=action)
        return flat

    def _reported_actions(self, rows: Rows) -> np.ndarray | None:
        """Reported taken actions as flat (n, A) rows; NaN rows where none was reported."""
        given = [(i, a) for i, a in enumerate(rows.prev_actions) if a is not msgspec.UNSET and a is not None]
        if not given:
            return None
        flat_rows = [self._flat_action(action, "prev_action" if rows.single else f"prev_actions[{i}]")
                     for i, action in given]
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
