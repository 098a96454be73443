"""Device specs (``agent_devices``, ``critic_devices``, ``reference_devices``, ``comparator_devices``): resolution,
and a device the machine lacks refused at config construction, naming the option."""

from __future__ import annotations

import pytest
import torch

from comlrl_lightning.config import (
    IACConfig,
    MAACConfig,
    MADPOConfig,
    MADPOIterConfig,
    MAGRPOConfig,
    MARLHFConfig,
    MARLHFIterConfig,
)
from comlrl_lightning.config.devices import DEVICE_OPTIONS
from comlrl_lightning.devices import available_devices, device_of, missing_device, resolve_devices


def test_resolve_devices_broadcasts_and_keeps_order():
    assert resolve_devices(None, 3, "agent_devices") is None
    assert resolve_devices("auto", 3, "agent_devices") is None
    assert resolve_devices("cuda:1", 2, "agent_devices") == [torch.device("cuda:1")] * 2
    assert resolve_devices(["cpu"], 2, "agent_devices") == [torch.device("cpu")] * 2
    assert resolve_devices(["cuda:0", "cuda:1"], 2, "x") == [torch.device("cuda:0"), torch.device("cuda:1")]
    with pytest.raises(ValueError, match=r"critic_devices length \(3\) must be 1 or 2"):
        resolve_devices(["cpu"] * 3, 2, "critic_devices")
    with pytest.raises(ValueError, match="agent_devices holds something that is not a device"):
        resolve_devices(["gpu-one"], 2, "agent_devices")


def test_missing_device_names_the_first_absent_entry():
    assert "cpu" in available_devices()
    assert missing_device(None) is None and missing_device(["cpu", "cpu"]) is None
    absent = f"cuda:{torch.cuda.device_count()}"  # one past the last GPU (cuda:0 on a CPU machine)
    assert missing_device(["cpu", absent]) == absent
    assert missing_device("not-a-device") == "not-a-device"


def test_device_of_reads_the_first_parameter():
    assert device_of(torch.nn.Linear(2, 2)) == torch.device("cpu")
    assert device_of(torch.nn.ReLU(), "meta") == torch.device("meta")


@pytest.mark.parametrize("make, option", [
    (lambda d: MADPOConfig(parallel_training="mp", agent_devices=["cpu", d]), "agent_devices"),
    (lambda d: MAGRPOConfig(parallel_training="mp", agent_devices=d), "agent_devices"),
    (lambda d: IACConfig(parallel_training="mp", agent_devices="cpu", critic_devices=[d, "cpu"]), "critic_devices"),
    (lambda d: MAGRPOConfig(reference_kl_enabled=True, reference_devices=d), "reference_devices"),
    # every device option, in every mode: "none" or "mp", reference KL on or off, any comparator policy
    (lambda d: MADPOConfig(agent_devices=d), "agent_devices"),
    (lambda d: MAGRPOConfig(reference_devices=[d]), "reference_devices"),
    (lambda d: IACConfig(critic_devices=d), "critic_devices"),
    (lambda d: MAACConfig(critic_devices=d), "critic_devices"),
    (lambda d: MADPOIterConfig(comparator_devices=d), "comparator_devices"),
    (lambda d: MADPOIterConfig(comparator_policy="current_copy", comparator_devices=["cpu", d]), "comparator_devices"),
    (lambda d: MARLHFIterConfig(comparator_devices=d), "comparator_devices"),
    (lambda d: MARLHFConfig(reward_model_device=d), "reward_model_device"),
    (lambda d: MARLHFConfig(rl_algorithm="iac", critic_devices=[d, "cpu"]), "critic_devices"),
])
def test_a_device_the_machine_lacks_is_refused_at_construction(make, option):
    absent = f"cuda:{torch.cuda.device_count()}"
    with pytest.raises(ValueError, match=rf"{option} names '{absent}', a device this machine does not have") as exc:
        make(absent)
    assert "Allowed: devices of this machine: cpu" in str(exc.value)


def test_devices_on_the_machine_are_accepted():
    assert MADPOConfig(parallel_training="mp", agent_devices=["cpu", "cpu"]).agent_devices == ["cpu", "cpu"]
    assert IACConfig(parallel_training="mp", agent_devices="cpu", critic_devices="cpu").critic_devices == "cpu"



def test_every_device_option_is_checked():
    """A new ``*_device(s)`` option of any config must join DEVICE_OPTIONS and the refusal cases above."""
    import dataclasses
    import inspect
    import sys

    import comlrl_lightning.config as config

    names = {f.name for cls in vars(config).values() if dataclasses.is_dataclass(cls)
             for f in dataclasses.fields(cls) if f.name.endswith(("_device", "_devices"))}
    assert names == set(DEVICE_OPTIONS)
    source = inspect.getsource(sys.modules[__name__])
    assert all(f'"{name}"),' in source for name in DEVICE_OPTIONS)
