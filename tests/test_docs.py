"""The documentation's links and the result files it names are in the repository: a figure or table a page points
at that was written on one machine and never committed (results are ignored unless .gitignore lets them in) is a
dead link on every clone."""

import re
import subprocess
from pathlib import Path

import pytest

from .conftest import REPO

PAGES = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "benchmarks" / "results").rglob("*.md")])
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")  # [text](target) and ![alt](target), anchors dropped
RESULT = re.compile(r"benchmarks/results/[\w./-]+\.(?:md|png|csv|json)")  # a result file named in the text


def targets(page: Path) -> list[tuple[str, Path]]:
    text = page.read_text()
    found = [(m, page.parent / m) for m in LINK.findall(text) if not re.match(r"[a-z]+:", m)]  # not http:, mailto:
    found += [(m, REPO / m) for m in RESULT.findall(text) if not m.startswith("benchmarks/results/*")]
    return found


def ignored(paths: list[Path]) -> set[Path]:
    """Those of `paths` that git ignores: here they may exist, on a clone they will not (none outside a checkout)."""
    if not (REPO / ".git").exists() or not paths:
        return set()
    names = "\n".join(str(p.resolve()) for p in paths)
    out = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=REPO, input=names, capture_output=True,
                         text=True).stdout
    return {Path(line) for line in out.splitlines()}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_and_named_result_file_exists(page):
    found = targets(page)
    left_out = ignored([path for _, path in found])
    missing = [name for name, path in found if not path.exists() or path.resolve() in left_out]
    assert not missing, (f"{page.relative_to(REPO)} names files the repository does not hold (missing, or ignored by "
                         f".gitignore so that no clone has them): {missing}")


def test_the_link_pattern_reads_links_images_and_anchors():
    text = "see [a](docs/x.md#part), ![fig](fig.png) and [web](https://example.org) or benchmarks/results/a/b.csv."
    assert LINK.findall(text) == ["docs/x.md", "fig.png", "https://example.org"]
    assert RESULT.findall(text) == ["benchmarks/results/a/b.csv"]


def test_the_table_of_the_metrics_fields_is_the_declarations():
    """docs/outputs.md's table of metrics.jsonl's keys (what each is, its TensorBoard tags, where fedur-report shows it)
    is generated from fedur/train/round_fields.py, so every declared field and tag is named there as declared."""
    from fedur.train.round_fields import FIELDS, OTHER_TAGS, markdown

    text = (REPO / "docs" / "outputs.md").read_text()
    assert markdown() in text, ("docs/outputs.md's table of the metrics.jsonl fields is not the declarations' "
                                "(fedur/train/round_fields.py): replace it with `python -m fedur.train.round_fields`'s output")
    assert all(f"`{f.key}`" in text for f in FIELDS)
    assert [tag for tag in OTHER_TAGS if f"`{tag}`" not in text] == []
