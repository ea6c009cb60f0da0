"""A share of a GPU in the size grammar: kept apart from "a device with at least 20 GB"
in every spelling, and each bad share refused in one sentence."""

from __future__ import annotations

import pytest

from jupyter_gpubroker.wire.errors import InvalidRequest
from jupyter_gpubroker.wire.sizes import Size
from jupyter_gpubroker.wire.text import size_text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("share=8GB", Size(share_gb=8.0)),
        ("share=8", Size(share_gb=8.0)),
        ("share_gb=7.5", Size(share_gb=7.5)),
        ("share=8GB,compute=50", Size(share_gb=8.0, compute_percent=50)),
        ("share = 8 GB , compute = 50%", Size(share_gb=8.0, compute_percent=50)),
        ("share_gb=8,compute_percent=50", Size(share_gb=8.0, compute_percent=50)),
    ],
)
def test_a_share_is_typed_as_share(text, expected):
    assert Size.parse(text) == expected
    assert Size.parse(expected.key) == expected  # the stored form reads back


def test_a_share_and_a_device_of_that_size_are_two_things():
    share, device = Size.parse("share=20GB"), Size.parse("20GB")
    assert share != device and share.key != device.key
    assert share.shared and not device.shared
    assert size_text(share.to_json()) == "20 GB of a shared GPU"
    assert size_text(Size(min_memory_gb=20).to_json()) == "at least 20 GB"


@pytest.mark.parametrize(
    ("kwargs", "sentence"),
    [
        (
            {"share_gb": 8, "compute_percent": 150},
            "the compute share must be a whole percent from 1 to 100, not 150",
        ),
        (
            {"share_gb": 8, "compute_percent": 0},
            "the compute share must be a whole percent from 1 to 100, not 0",
        ),
        (
            {"profile": "1g.10gb", "share_gb": 4},
            "a MIG slice is never shared: ask for the slice itself, or for part of a GPU "
            "without MIG",
        ),
        ({"compute_percent": 50}, "a compute share goes with a share of a GPU's memory only"),
        ({"share_gb": 0}, "a share's memory must be a number of GB from 0.001 to 4096, not 0"),
    ],
)
def test_a_bad_share_is_refused_in_one_sentence(kwargs, sentence):
    with pytest.raises(InvalidRequest) as e:
        Size(**kwargs)
    assert e.value.message == sentence


@pytest.mark.parametrize(
    "text",
    ["share=8GB,compute=150", "profile=1g.10gb,share=4GB", "share=8GB,gpus=2", "compute=50"],
)
def test_a_bad_typed_share_is_refused(text):
    with pytest.raises(InvalidRequest):
        Size.parse(text)
