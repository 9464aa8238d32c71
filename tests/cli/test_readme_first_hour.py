"""README's first hour for a torchrun user: the torchrun-style command beside the recipe one, and why the set-up
command pins torch with what to write on a CUDA machine."""
from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def _sections() -> list[str]:
    return README.read_text(encoding="utf-8").split("\n## ")


def test_first_section_shows_the_torchrun_style_command_beside_the_recipe_command():
    first = _sections()[0]
    block = first[first.index("```"):first.rindex("```")]
    assert "podrun launch recipes/resnet18_cifar10" in block
    assert "podrun launch --nproc-per-node 2 train.py" in block and "torchrun --nproc-per-node 2 train.py" in block


def test_setup_says_why_torch_is_pinned_and_what_to_write_with_cuda():
    (setup,) = [s for s in _sections() if s.startswith("Set-up")]
    assert "pip install torch==2.13.0 -e '.[train]'" in setup        # the command, as it works here
    assert "pins `torch==2.13.0` because" in setup
    assert "with CUDA write `pip install -e '.[train]'` without the pin" in setup


def test_setup_gives_measured_times_with_their_command_and_the_cpu_build_on_a_gpu_machine():
    (setup,) = [s for s in _sections() if s.startswith("Set-up")]
    assert "python -m bench first-hour" in setup and "about 40 s" not in README.read_text(encoding="utf-8")
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in setup
