"""RLlib's observation preprocessors (the implementation lives in ``rlserve.models.preprocessing``).

``get_preprocessor(obs_space, model_config)`` returns a ``Preprocessor`` with
``transform`` (one observation), ``transform_batch`` (a list) and ``transform_columns``
(one array per leaf), the flat ``observation_space`` given to the model (carrying
``original_space``) and the leaf ``layout``. Torch-free.
"""

from rlserve.models.preprocessing import *  # noqa: F403
from rlserve.models.preprocessing import __all__  # noqa: F401
