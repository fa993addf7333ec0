"""The README's quick start runs as written (its own assertions against the float32 oracle),
and the documents it links exist."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_quick_start_runs_as_written():
    (block,) = _python_blocks((ROOT / "README.md").read_text())
    namespace: dict = {}
    exec(compile(block, "README.md quick start", "exec"), namespace)  # noqa: S102
    out, lse = namespace["out"], namespace["lse"]
    assert out.shape == (2, 1, 8, 512) and lse.shape == (2, 1, 8)
    assert lse.isfinite().all()


def test_linked_documents_exist():
    for doc in ("README.md", "docs/engines.md", "docs/kernels.md", "docs/DESIGN.md"):
        text = (ROOT / doc).read_text()
        for target in re.findall(r"\]\(([^)#:]+)\)", text):
            assert (ROOT / doc).parent.joinpath(target).resolve().exists(), (doc, target)
