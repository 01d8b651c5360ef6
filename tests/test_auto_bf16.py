"""MemAgent SFT's ``bf16`` default is auto: bf16 autocast only where the hardware runs it natively.

TRL's SFTConfig turns bf16 on by default. On a CPU that fails to parse without ``use_cpu``, and on a CPU
without AVX512-BF16 / AMX it emulates bf16 (a Linear layer ran 6.6x slower than fp32 on such a machine; the
shared SFT fixture of test_memagent_router took 219 s instead of ~20 s)."""

from __future__ import annotations

import pytest

import routers.models
import train.distributed
from routers.config import parse_config
from train.memagent import MemAgentSFTConfig, make_parser


def parse(*argv):
    (cfg,) = parse_config(make_parser(), [MemAgentSFTConfig], ["--output_dir", "unused", *argv])
    return cfg


@pytest.fixture
def hardware(monkeypatch):
    """Pretend hardware: ``set(gpu=..., native=...)``; records which device bf16 support was asked about."""
    asked = []

    def set_(gpu: bool, native: bool):
        monkeypatch.setattr(train.distributed, "has_gpu", lambda: gpu)

        def supported(device=None):
            asked.append(device)
            return native
        monkeypatch.setattr(routers.models, "bf16_supported", supported)
    set_.asked = asked
    return set_


def test_cpu_without_native_bf16_trains_in_fp32_by_default(hardware):
    hardware(gpu=False, native=False)
    cfg = parse()  # TRL's default (bf16 on) raised "Your setup doesn't support bf16/gpu" here
    assert (cfg.bf16, cfg.fp16) == (False, False)
    assert hardware.asked == ["cpu"]


def test_cpu_with_native_bf16_gets_bf16_and_use_cpu(hardware):
    hardware(gpu=False, native=True)
    cfg = parse()
    assert (cfg.bf16, cfg.use_cpu) == (True, True)


def test_use_cpu_asks_about_the_cpu_even_with_a_gpu(hardware):
    hardware(gpu=True, native=False)
    cfg = parse("--use_cpu", "true")
    assert cfg.bf16 is False and hardware.asked == ["cpu"]


def test_an_explicit_choice_is_kept(hardware):
    hardware(gpu=False, native=True)
    assert parse("--bf16", "false").bf16 is False
    assert parse("--bf16", "true", "--use_cpu", "true").bf16 is True
    assert hardware.asked == []  # an explicit value is never second-guessed


def test_bf16_on_a_cpu_that_emulates_it_warns(hardware, memroute_log):
    from train.distributed import warn_if_bf16_emulated

    hardware(gpu=False, native=False)
    cfg = parse("--bf16", "true", "--use_cpu", "true")
    assert warn_if_bf16_emulated(cfg) is True
    assert "bf16 autocast on this CPU is emulated" in memroute_log.text and "--bf16 false" in memroute_log.text
    hardware(gpu=False, native=True)
    assert warn_if_bf16_emulated(cfg) is False  # native bf16: nothing to say
    assert warn_if_bf16_emulated(parse("--bf16", "false")) is False
