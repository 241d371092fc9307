"""The README's safetensors section: its three Python snippets run as written, in order, in an empty folder."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_three_safetensors_snippets_run_as_written(tmp_path: Path) -> None:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Safetensors, the hub's shard names") :]
    section = section[: section.index("\n## ", 1)]
    snippets = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(snippets) == 3
    env = {**os.environ, "PYTHONPATH": str(README.parent)}
    outputs = []
    for snippet in snippets:
        run = subprocess.run(
            [sys.executable, "-c", snippet], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
        )
        assert run.returncode == 0, run.stderr
        outputs.append(run.stdout)
    assert "layers_st-00002-of-00002.safetensors" in outputs[0] and "layers_st.safetensors.index.json" in outputs[0]
    assert "layers_js.onnx_data_1" in outputs[1]
    assert outputs[2].split() == ["4", "4194304", "0"]
