"""The README's supported-architecture table is the registry's (regenerate it with
``python -m llamapy.model.arch.table --update README.md``)."""

from __future__ import annotations

from pathlib import Path

from llamapy.model.arch import _FAMILY_MODULES
from llamapy.model.arch.table import supported_table, updated

README = Path(__file__).resolve().parents[2] / "README.md"


def test_every_registered_architecture_has_a_row():
    table = supported_table()
    for name in _FAMILY_MODULES:
        assert f"| `{name}` |" in table


def test_readme_table_is_current():
    text = README.read_text(encoding="utf-8")
    assert updated(text) == text, "README.md: run python -m llamapy.model.arch.table --update README.md"
