"""RLlib's observation preprocessors, torch-free (see ``factory.get_preprocessor``)."""

from rlserve.models.preprocessing.base import LeafSpec, Preprocessor
from rlserve.models.preprocessing.containers import (
    DictFlatteningPreprocessor,
    RepeatedValuesPreprocessor,
    TupleFlatteningPreprocessor,
)
from rlserve.models.preprocessing.errors import ObservationError, describe_space, describe_value
from rlserve.models.preprocessing.factory import (
    ATARI_RAM_OBS_SHAPE,
    get_preprocessor,
    preprocessor_options,
)
from rlserve.models.preprocessing.leaves import (
    AtariRamPreprocessor,
    NoPreprocessor,
    OneHotPreprocessor,
)
from rlserve.models.preprocessing.pixels import ATARI_OBS_SHAPE, GenericPixelPreprocessor
from rlserve.models.preprocessing.resize import resize_area

__all__ = [
    "ATARI_OBS_SHAPE",
    "ATARI_RAM_OBS_SHAPE",
    "AtariRamPreprocessor",
    "DictFlatteningPreprocessor",
    "GenericPixelPreprocessor",
    "LeafSpec",
    "NoPreprocessor",
    "ObservationError",
    "OneHotPreprocessor",
    "Preprocessor",
    "RepeatedValuesPreprocessor",
    "TupleFlatteningPreprocessor",
    "describe_space",
    "describe_value",
    "get_preprocessor",
    "preprocessor_options",
    "resize_area",
]
