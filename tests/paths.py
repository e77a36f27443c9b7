"""Where the project and the real test data are. Tests that need ../shared skip with a message when absent."""
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
TOKENIZER = SHARED / "tokenizers" / "gpt-neox-20b"
C4 = SHARED / "c4" / "en"
PYTHON = ROOT / ".venv" / "bin" / "python"


def need_shared():
    if not (TOKENIZER / "tokenizer.json").is_file():
        pytest.skip(f"real test data not found at {SHARED} (a checkout beside ../shared is needed)")
