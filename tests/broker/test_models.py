"""Request sizes and names: what a user may ask for, and the errors they see otherwise."""

from __future__ import annotations

import math

import pytest

from jupyter_gpubroker.broker.clock import VirtualClock
from jupyter_gpubroker.broker.models import Device, JobClass, Request, RequestState, check_name
from jupyter_gpubroker.wire.errors import BrokerError, InvalidRequest, UnknownProfile
from jupyter_gpubroker.wire.sizes import Size

# ---------------------------------------------------------------- Size


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"gpus": 1, "profile": "1g.10gb"},
        {"gpus": 1, "min_memory_gb": 10},
        {"profile": "1g.10gb", "min_memory_gb": 10},
        {"gpus": 1, "profile": "1g.10gb", "min_memory_gb": 10},
    ],
)
def test_size_needs_exactly_one_field(kwargs):
    with pytest.raises(InvalidRequest, match="exactly one of"):
        Size(**kwargs)


def test_size_names_the_fields_given_twice():
    with pytest.raises(InvalidRequest, match=r"got gpus, profile"):
        Size(gpus=1, profile="1g.10gb")


@pytest.mark.parametrize("gpus", [0, -1, 1025, True, False, 2.5, 2.0, "2"])
def test_size_rejects_bad_gpu_counts(gpus):
    with pytest.raises(InvalidRequest, match="'gpus'"):
        Size(gpus=gpus)


@pytest.mark.parametrize("gpus", [1, 8, 1024])
def test_size_accepts_gpu_counts_in_range(gpus):
    assert Size(gpus=gpus).gpus == gpus


def test_unknown_profile_lists_the_known_ones():
    with pytest.raises(UnknownProfile) as info:
        Size(profile="1g.11gb")
    err = info.value
    assert isinstance(err, InvalidRequest)  # rendered as a 400 like any bad input
    assert err.code == "unknown_profile"
    assert "'1g.11gb'" in err.message
    for known in ("1g.10gb", "3g.40gb", "7g.141gb", "1g.5gb+me"):
        assert known in err.message


@pytest.mark.parametrize("mem", [0, -5, math.nan, math.inf, 1e9, 4096.5, True, "20"])
def test_size_rejects_bad_memory(mem):
    with pytest.raises(InvalidRequest, match="min_memory_gb"):
        Size(min_memory_gb=mem)


@pytest.mark.parametrize("mem", [0.5, 20, 79.6474609375, 4096])
def test_size_accepts_memory_in_range(mem):
    assert Size(min_memory_gb=mem).min_memory_gb == mem


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2", Size(gpus=2)),
        (" 2 ", Size(gpus=2)),
        ("gpus=2", Size(gpus=2)),
        ("gpus = 2", Size(gpus=2)),
        ("1g.10gb", Size(profile="1g.10gb")),
        ("profile=3g.40gb", Size(profile="3g.40gb")),
        ("20GB", Size(min_memory_gb=20.0)),
        ("20gb", Size(min_memory_gb=20.0)),
        ("12.5GB", Size(min_memory_gb=12.5)),
        ("min_memory_gb=20", Size(min_memory_gb=20.0)),
        ("min_memory_gb=0.5", Size(min_memory_gb=0.5)),
        ("2@H100-80GB", Size(gpus=2, model="H100-80GB")),
        ("gpus=1@A100-80GB", Size(gpus=1, model="A100-80GB")),
    ],
)
def test_size_parse_forms(text, expected):
    assert Size.parse(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "0",
        "gpus=0",
        "gpus=two",
        "gpus=",
        "gpus=1.5",
        "cpus=2",
        "min_memory_gb=lots",
        "min_memory_gb=0",
        "min_memory_gb=nan",
        "0GB",
        "5000GB",
        "bogus",
        "",
        "-2",
        "²",  # a digit to str.isdigit, not to int()
        "2²GB",
        "gpus=1@",
        "1@H100 80GB",
        "min_memory_gb=20@H100-80GB",
    ],
)
def test_size_parse_refuses_bad_text_with_invalid_request(text):
    with pytest.raises(InvalidRequest):
        Size.parse(text)


@pytest.mark.parametrize(
    "size",
    [
        Size(gpus=3),
        Size(profile="1g.10gb+me"),
        Size(min_memory_gb=20),
        Size(min_memory_gb=0.1),
        Size(min_memory_gb=81559 / 1024),  # exactly one H100's memory
        Size(min_memory_gb=20.123456789),
        Size(gpus=2, model="H100-80GB"),
    ],
)
def test_size_key_round_trips_through_parse(size):
    """The key is what the store keeps: a restarted broker must read back the same size."""
    assert Size.parse(size.key) == size


def test_size_to_json_has_only_the_field_given():
    assert Size(gpus=2).to_json() == {"gpus": 2}
    assert Size(profile="2g.20gb").to_json() == {"profile": "2g.20gb"}
    assert Size.parse("20GB").to_json() == {"min_memory_gb": 20.0}


def test_errors_render_as_api_json():
    with pytest.raises(BrokerError) as info:
        Size(gpus=0)
    assert info.value.to_json() == {"error": "invalid_request", "message": info.value.message}
    assert info.value.status == 400


# ---------------------------------------------------------------- names


HUB_NAMES = [
    "alice",
    "a",
    "ML Team",  # groups synced from an identity provider
    "/staff",  # a Keycloak group path
    "/org/ml team",
    "org:team",
    "-alice",
    "alice;drop",
    "<script>alert(1)</script>",  # shown escaped, never refused
    "élodie",
    "🦊 fox",
    "x" * 255,
    "👩\u200d🔬 ada",  # an emoji joined by a zero-width joiner, a format character too
    "\u05d3\u05e0\u05d4",  # Hebrew: read right to left by itself, no control needed
]


@pytest.mark.parametrize("name", HUB_NAMES)
def test_check_name_accepts_every_name_jupyterhub_takes(name):
    assert check_name(name, "user") == name
    assert check_name(name, "group") == name


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("", "user name must be non-empty text, not ''"),
        (None, "user name must be non-empty text, not None"),
        (42, "user name must be non-empty text, not 42"),
        ("x" * 256, "user name 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'... is too long: 256 "),
        ("alice\n", "user name 'alice\\n' holds '\\n'"),
        ("a\x00", "holds '\\x00'"),
        ("a\x1b[31m", "holds '\\x1b'"),  # a terminal escape in the CLI's tables
        ("a\x85b", "holds '\\x85'"),
        ("a\u2028b", "holds '\\u2028'"),
        ("a\ud800", "holds '\\ud800'"),  # half a UTF-16 pair: SQLite cannot store it
        ("ann\u202egro", "holds '\\u202e'"),  # reads "annorg": a right-to-left override
        ("a\u202ab", "holds '\\u202a'"),  # the embeddings, overrides and isolates
        ("a\u2069b", "holds '\\u2069'"),
    ],
)
def test_check_name_refuses_only_what_is_unsafe_saying_why(name, says):
    with pytest.raises(InvalidRequest) as refused:
        check_name(name, "user")
    assert says in refused.value.message


def test_check_name_says_which_kind_of_name():
    with pytest.raises(InvalidRequest, match="^group name"):
        check_name("bad\tname", "group")


# ---------------------------------------------------------------- derived values


def test_device_gpu_equivalents_and_label():
    whole = Device("GPU-1", "gpu", 3, "GPU-1", 81559)
    mig = Device("MIG-1", "mig", 3, "GPU-1", 40448, 3, "3g.40gb", 4)
    assert whole.gpu_equivalents == 1.0
    assert mig.gpu_equivalents == pytest.approx(3 / 7)
    assert whole.label == "GPU 3"
    assert mig.label == "GPU 3 / 3g.40gb@4"


def test_request_group_and_state_ends():
    r = Request("r-1", "alice", ("ml", "lab"), Size(gpus=1), JobClass.BATCH, 0.0)
    assert r.group == "ml"
    assert Request("r-2", "bob", (), Size(gpus=1), JobClass.BATCH, 0.0).group == ""
    assert r.to_json()["gpus"] == 1 and r.to_json()["job_class"] == "batch"
    assert not RequestState.QUEUED.ended and not RequestState.GRANTED.ended
    assert all(
        s.ended for s in RequestState if s not in (RequestState.QUEUED, RequestState.GRANTED)
    )


def test_virtual_clock_never_goes_backwards():
    clock = VirtualClock(100.0)
    assert clock.advance(5) == 105.0
    assert clock.set(200) == 200.0 == clock.now()
    with pytest.raises(ValueError):
        clock.advance(-1)
    with pytest.raises(ValueError):
        clock.set(199)
    assert clock.now() == 200.0


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"profile": "1g.10gb", "model": "H100-80GB"}, "'model' goes with 'gpus' only"),
        ({"min_memory_gb": 20, "model": "H100-80GB"}, "'model' goes with 'gpus' only"),
        ({"gpus": 1, "model": ""}, "'model' must be a GPU model"),
        ({"gpus": 1, "model": 7}, "'model' must be a GPU model"),
        ({"gpus": 1, "model": "H100/../x"}, "'model' must be a GPU model"),
    ],
)
def test_a_size_names_a_model_only_beside_whole_gpus(fields, said):
    with pytest.raises(InvalidRequest, match=said):
        Size(**fields)
