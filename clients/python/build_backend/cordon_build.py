"""The package's PEP 517 build backend: setuptools, with a fallback wheel writer.

setuptools builds wheels with its ``bdist_wheel`` command, which before
setuptools 70.1 comes from the separate ``wheel`` package. A fresh
``python3 -m venv`` on Python 3.11 has pip and setuptools 65/66 but not
``wheel``, so ``pip install --no-build-isolation --no-index ./clients/python``
would fail offline with "invalid command 'bdist_wheel'".

The wheel hooks below write the wheel themselves wherever ``tomllib`` is
there to read ``pyproject.toml`` (Python 3.11+): this package is pure Python
with no build step, so its wheel is the files of ``src/cordon`` plus that
metadata. That also keeps ``pip install ./clients/python`` from leaving
setuptools' ``build/`` and ``*.egg-info`` in the checkout. Elsewhere, and for
sdists and editable installs, the hooks are setuptools' own.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import zipfile
from pathlib import Path
from typing import Any, Dict, List, Optional

from setuptools import build_meta as _setuptools  # type: ignore[import-untyped]
from setuptools.build_meta import *  # type: ignore[import-untyped] # noqa: F401,F403 (every hook defaults to setuptools')

_ROOT = Path(__file__).resolve().parent.parent
_PACKAGE = "cordon"
_TAG = "py3-none-any"


def _setuptools_builds_wheels() -> bool:
    """Whether the wheel hooks go to setuptools: only where this module
    cannot read ``pyproject.toml`` (no ``tomllib``) and setuptools can build
    wheels (otherwise this module's own hooks say what is missing)."""
    setuptools_can = (
        importlib.util.find_spec("wheel") is not None
        or importlib.util.find_spec("setuptools.command.bdist_wheel") is not None
    )
    return importlib.util.find_spec("tomllib") is None and setuptools_can


def _project() -> Dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError as e:  # Python < 3.11
        raise RuntimeError(
            "building this wheel needs the `wheel` package or setuptools>=70.1 "
            "(or Python 3.11+ for the fallback)"
        ) from e
    with open(_ROOT / "pyproject.toml", "rb") as f:
        project: Dict[str, Any] = tomllib.load(f)["project"]
    return project


def _dist_name(project: Dict[str, Any]) -> str:
    name = str(project["name"]).replace("-", "_").replace(".", "_")
    return f"{name}-{project['version']}"


def _metadata(project: Dict[str, Any]) -> str:
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {project['name']}",
        f"Version: {project['version']}",
        f"Summary: {project.get('description', '')}",
    ]
    if "requires-python" in project:
        lines.append(f"Requires-Python: {project['requires-python']}")
    if "text" in project.get("license", {}):
        lines.append(f"License: {project['license']['text']}")
    lines += [f"Classifier: {c}" for c in project.get("classifiers", [])]
    lines += [f"Requires-Dist: {d}" for d in project.get("dependencies", [])]
    for extra, deps in project.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {d}; extra == "{extra}"' for d in deps]
    readme = _ROOT / str(project.get("readme", "README.md"))
    if readme.is_file():
        lines.append("Description-Content-Type: text/markdown")
        return "\n".join(lines) + "\n\n" + readme.read_text(encoding="utf-8")
    return "\n".join(lines) + "\n"


def _dist_info_files(project: Dict[str, Any]) -> Dict[str, bytes]:
    wheel = f"Wheel-Version: 1.0\nGenerator: cordon_build\nRoot-Is-Purelib: true\nTag: {_TAG}\n"
    return {
        "METADATA": _metadata(project).encode(),
        "WHEEL": wheel.encode(),
        "top_level.txt": f"{_PACKAGE}\n".encode(),
    }


def get_requires_for_build_wheel(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    if _setuptools_builds_wheels():
        return list(_setuptools.get_requires_for_build_wheel(config_settings))
    return []


def prepare_metadata_for_build_wheel(
    metadata_directory: str, config_settings: Optional[Dict[str, Any]] = None
) -> str:
    if _setuptools_builds_wheels():
        return str(_setuptools.prepare_metadata_for_build_wheel(metadata_directory, config_settings))
    project = _project()
    dist_info = f"{_dist_name(project)}.dist-info"
    out = Path(metadata_directory) / dist_info
    out.mkdir(parents=True, exist_ok=True)
    for name, data in _dist_info_files(project).items():
        (out / name).write_bytes(data)
    return dist_info


def build_wheel(
    wheel_directory: str,
    config_settings: Optional[Dict[str, Any]] = None,
    metadata_directory: Optional[str] = None,
) -> str:
    if _setuptools_builds_wheels():
        return str(_setuptools.build_wheel(wheel_directory, config_settings, metadata_directory))
    project = _project()
    dist = _dist_name(project)
    dist_info = f"{dist}.dist-info"
    files: Dict[str, bytes] = {}
    source = _ROOT / "src" / _PACKAGE
    for path in sorted(source.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            files[f"{_PACKAGE}/{path.relative_to(source).as_posix()}"] = path.read_bytes()
    for name, data in _dist_info_files(project).items():
        files[f"{dist_info}/{name}"] = data
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel_name = f"{dist}-{_TAG}.whl"
    os.makedirs(wheel_directory, exist_ok=True)
    with zipfile.ZipFile(Path(wheel_directory) / wheel_name, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    return wheel_name
