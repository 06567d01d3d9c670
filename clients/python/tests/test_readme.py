"""The README's Python blocks type-check (``mypy --strict``) against this package."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
SRC = Path(__file__).resolve().parents[1] / "src"


def test_every_python_block_of_the_readme_type_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    api = pytest.importorskip("mypy.api")
    monkeypatch.setenv("MYPYPATH", str(SRC))
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 3
    with tempfile.TemporaryDirectory() as folder:
        files = []
        for i, block in enumerate(blocks, start=1):
            path = Path(folder) / f"readme_block_{i}.py"
            path.write_text(block)
            files.append(str(path))
        out, err, status = api.run(
            ["--strict", "--no-incremental", "--python-version", "3.10", *files]
        )
    assert status == 0, f"README.md's python blocks (readme_block_N is the Nth):\n{out}{err}"
