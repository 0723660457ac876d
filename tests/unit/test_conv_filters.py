"""RLlib's default ``conv_filters`` (``rlserve.models.conv_filters``): the one table both the
old stack's VisionNetwork and the new stack's CNN encoder take when a config names none."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlserve.models.conv_filters import default_conv_filters


@pytest.mark.parametrize("shape", [(84, 84, 4), (4, 84, 84), (84, 84)])
def test_an_image_takes_rllibs_filters_by_height_and_width(shape):
    assert default_conv_filters(shape) == [[16, [8, 8], 4], [32, [4, 4], 2], [256, [11, 11], 1]]


def test_each_answer_is_a_copy_of_its_own():
    first = default_conv_filters((42, 42, 3))
    first[0][0] = 99
    first[0][1][0] = 99  # the kernel's list too
    first.append([1, [1, 1], 1])
    assert default_conv_filters((42, 42, 3)) == [[16, [4, 4], 2], [32, [4, 4], 2], [256, [11, 11], 1]]


@pytest.mark.parametrize("shape", [(50, 50, 3), (84, 84, 4, 1), (84,)])
def test_a_shape_rllib_has_no_default_for_is_refused_naming_the_known_ones(shape):
    with pytest.raises(ValueError, match=r"no default for observation shape .*\[84, 84, K\]"):
        default_conv_filters(shape)


def test_both_stacks_use_this_one_lookup_and_it_needs_no_torch():
    from rlserve.models.networks import visionnet
    from rlserve.models.rlmodules import encoders

    assert visionnet.default_conv_filters is encoders.default_conv_filters is default_conv_filters
    code = "import sys, rlserve.models.conv_filters; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
