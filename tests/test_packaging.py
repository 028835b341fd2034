"""The conda environment and pyproject.toml must declare the same requirements."""
from __future__ import annotations

import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def normalised(requirements) -> dict[str, str]:
    parsed = [Requirement(r) for r in requirements]
    return {r.name.lower().replace("_", "-"): str(r.specifier) for r in parsed}


def test_environment_yml_mirrors_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    environment = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert "python=3.11" in environment["dependencies"]
    pip_section = next(d["pip"] for d in environment["dependencies"] if isinstance(d, dict))
    assert "-e ." in pip_section
    assert normalised(r for r in pip_section if r != "-e .") == normalised(declared)


def test_torch_is_pinned_to_the_cpu_build_on_disk():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "torch==2.13.0" in project["dependencies"]
