from __future__ import annotations

import pytest

from sglang_prorsa.client import InvalidArgument, grpo_advantages


def test_advantages_hand_computed():
    # mean 0.5, population std 0.5
    assert grpo_advantages([1, 0, 0, 1], eps=0) == [1.0, -1.0, -1.0, 1.0]
    # mean 2, std sqrt(2/3)
    adv = grpo_advantages([1, 2, 3], eps=0)
    assert adv == pytest.approx([-1.224744871, 0.0, 1.224744871])


def test_equal_rewards_give_zero_advantage():
    assert grpo_advantages([0.3, 0.3]) == [0.0, 0.0]


@pytest.mark.parametrize("rewards", [[], [1.0, float("nan")]])
def test_bad_rewards(rewards):
    with pytest.raises(InvalidArgument, match="'rewards'"):
        grpo_advantages(rewards)


def test_bad_group_size(fake):
    from sglang_prorsa.client import ProrsaClient

    with ProrsaClient(fake.url) as client, pytest.raises(InvalidArgument, match="'n'"):
        client.run_group(0, lambda t: None)
