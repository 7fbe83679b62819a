"""The training queue (python -m convnn.zoo): which GPU each job sees."""

import pytest

from convnn.zoo import device_ids


@pytest.mark.parametrize(("num_gpus", "visible", "expected"), [
    (1, None, ["0"]),  # unset on a one-GPU machine: the job must see GPU 0, not an empty list (no GPU at all)
    (1, "", ["0"]),
    (2, None, ["0", "1"]),
    (2, "3,5", ["3", "5"]),  # the parent's own selection is passed on
    (1, "GPU-4b1c", ["GPU-4b1c"]),
    (2, "3", ["0", "1"]),  # a list that does not match the count: indices
])
def test_each_job_is_shown_one_of_the_gpus_the_queue_counted(num_gpus, visible, expected):
    assert device_ids(num_gpus, visible) == expected
