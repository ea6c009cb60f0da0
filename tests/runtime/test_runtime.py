"""GPUBroker: the broker built from c.GPUBroker.* configuration, with bad values refused."""

from __future__ import annotations

import os
import pwd
import socket

import pytest
from runtime_helpers import make
from traitlets import TraitError

from jupyter_gpubroker.broker.budgets import Quota
from jupyter_gpubroker.wire.errors import ConfigError, InvalidRequest, StateFileError


def test_builds_the_configured_broker(tmp_path) -> None:
    rt = make(tmp_path, policy="slurm", policy_params={"half_life_s": 3600.0}, lease_ttl=30.0)
    broker = rt.start()
    try:
        assert broker.policy.name == "slurm" and broker.policy.half_life_s == 3600.0
        assert broker.config.lease_ttl_s == 30.0
        assert len(broker.inventory.devices) == 5  # 4 MIG slices + 1 whole A100
        assert (tmp_path / "state.sqlite").exists()
    finally:
        rt.stop()


def test_quotas_file_is_applied_at_start(tmp_path) -> None:
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(
        "users:\n  alice: {share: 2, max_gpus: 1}\n"
        "groups:\n  lab: {gpu_hours: 10, period_s: 86400}\n"
    )
    rt = make(tmp_path, quotas_file=str(quotas))
    try:
        assert rt.start().quotas() == {
            ("user", "alice"): Quota(share=2, max_gpus=1),
            ("group", "lab"): Quota(gpu_hours=10, period_s=86400),
        }
    finally:
        rt.stop()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("users: [alice]\n", "needs a mapping|'users'"),
        ("people: {}\n", "top-level keys are 'users' and 'groups'"),
        ("users:\n  alice: {max_gpu: 1}\n", r"no setting 'max_gpu' \(did you mean 'max_gpus'\?\)"),
        ('users:\n  "bad\\tname": {share: 1}\n', "user name .+ holds .+ but control characters"),
        ("groups:\n  lab: {gpu_hours: 5}\n", "needs both gpu_hours and period_s"),
        ("users: {alice: {share: -1}}\n", "share must be a number from 0.001 to 1000000"),
    ],
)
def test_bad_quotas_file_is_refused_with_its_reason(tmp_path, text, message) -> None:
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(text)
    rt = make(tmp_path, quotas_file=str(quotas))
    with pytest.raises(ConfigError, match=message) as refused:
        try:
            rt.start()
        finally:
            rt.stop()
    assert not isinstance(refused.value, InvalidRequest)  # no caller's bad request (a 400)
    assert refused.value.message.count(". ") == 0  # one sentence


def test_bad_traits_are_refused(tmp_path) -> None:
    with pytest.raises(TraitError, match="GPUBroker.lease_ttl must be seconds, at least 1 and"):
        make(tmp_path, lease_ttl=0.0)
    with pytest.raises(TraitError):
        make(tmp_path, policy="lottery")
    with pytest.raises(TraitError, match="GPUBroker.user_groups: group name 'a.nb' holds"):
        make(tmp_path, user_groups={"🦊 fox": ["ML Team", "/staff", "a\nb"]})
    with pytest.raises(TraitError, match="GPUBroker.admin_users: user name must be non-empty"):
        make(tmp_path, admin_users={""})
    make(tmp_path, user_groups={"🦊 fox": ["ML Team", "/staff", "org:team"]}, admin_users={"é"})
    with pytest.raises(TraitError, match="bad day range"):
        make(tmp_path, windows=[{"name": "x", "start": "8", "end": "9", "days": "funday"}])
    rt = make(tmp_path, policy_params={"half_lif_s": 1})
    with pytest.raises(ConfigError, match="policy 'broker' has no parameter half_lif_s"):
        rt.start()


def test_kernel_tokens_are_scoped_replaced_and_revoked(tmp_path) -> None:
    rt = make(tmp_path)
    rt.start()
    try:
        first = rt.issue_token("alice", "k1")
        second = rt.issue_token("alice", "k1")
        assert rt.token_holder(first) is None  # a kernel's new token replaces the old one
        assert rt.token_holder(second) == ("alice", "k1")
        rt.revoke_tokens("k1", user="bob")
        assert rt.token_holder(second) == ("alice", "k1")  # bob cannot revoke alice's
        rt.revoke_tokens("k1", user="alice")
        assert rt.token_holder(second) is None
        assert rt.token_holder("gpb_made-up") is None
    finally:
        rt.stop()


def test_kernel_tokens_outlive_a_restart_until_revoked_and_are_stored_hashed(tmp_path) -> None:
    rt = make(tmp_path)
    rt.start()
    kept, revoked = rt.issue_token("alice", "k1"), rt.issue_token("bob", "k2")
    rt.revoke_tokens("k2", user="bob")
    rt.stop()
    raw = (tmp_path / "state.sqlite").read_bytes() + (
        (tmp_path / "state.sqlite-wal").read_bytes()
        if (tmp_path / "state.sqlite-wal").exists()
        else b""
    )
    assert kept.encode() not in raw
    again = make(tmp_path)
    again.start()
    try:
        assert again.token_holder(kept) == ("alice", "k1")
        assert again.token_holder(revoked) is None
    finally:
        again.stop()


def test_a_second_broker_on_the_same_state_file_is_refused_naming_the_first(tmp_path) -> None:
    first = make(tmp_path)
    first.api_url = "http://127.0.0.1:8888/gpubroker/api/v1"
    first.start()
    second = make(tmp_path)
    try:
        with pytest.raises(StateFileError) as info:
            second.start()
        assert info.value.message.startswith(
            f"{tmp_path / 'state.sqlite'}: in use by another GPU broker (pid {os.getpid()} of user "
            f"{pwd.getpwuid(os.geteuid()).pw_name} on "
            f"{socket.gethostname()}, serving http://127.0.0.1:8888/gpubroker/api/v1)"
        )
        with pytest.raises(RuntimeError, match="not been started"):
            second.core  # noqa: B018
    finally:
        first.stop()
    second.start()  # the first one gave the file back
    second.stop()


def test_a_broker_that_fails_to_start_gives_the_state_file_back(tmp_path) -> None:
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text("people: {}\n")
    with pytest.raises(ConfigError):
        make(tmp_path, quotas_file=str(quotas)).start()
    rt = make(tmp_path)
    rt.start()
    rt.stop()
