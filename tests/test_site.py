"""The site builds strictly, its generated tables match the code, and the build is cached and deterministic."""

import os
import re
import subprocess
import sys

import pytest

from site_scripts import build
from site_scripts.markers import Marker

ROOT = build.ROOT
CONTEXT = {"repo_url": "https://example.invalid/repo"}


@pytest.fixture(scope="module")
def built_site(tmp_path_factory):
    if not (ROOT / "docs/assets/vendor/mathjax/tex-mml-chtml.js").exists():
        pytest.fail("docs/assets/vendor is missing: run scripts/setup")
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                            cwd=ROOT, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_site_builds_strictly_with_every_page(built_site):
    for page in ["index.html", "model/layernorm/index.html"]:
        assert (built_site / page).is_file()
    html = (built_site / "model/layernorm/index.html").read_text()
    assert 'id="eq-ln-grad"' in html and 'class="arithmatex"' in html
    assert "--8<--" not in html  # every snippet was included


def test_connection_table_lines_point_at_the_code_shown(built_site):
    table = (build.SNIPPETS / "layernorm" / "connection.md").read_text()
    rows = re.findall(r"\[`([\w/.]+):(\d+)`\]\([^)]*\) \| `(.*)` \|$", table, flags=re.M)
    assert len(rows) >= 6
    for path, line, code in rows:
        text = (ROOT / path).read_text().splitlines()[int(line) - 1]
        assert text.strip().startswith(code.replace("\\|", "|")), (path, line)


def test_an_unchanged_page_is_not_regenerated_and_output_is_deterministic():
    build.generate_all(CONTEXT, ["layernorm"], force=True)
    first = {p.name: p.read_bytes() for p in (build.SNIPPETS / "layernorm").iterdir()}
    assert build.generate_all(CONTEXT, ["layernorm"]) == []  # nothing changed, nothing reruns
    assert build.generate_all(CONTEXT, ["layernorm"], force=True) == ["layernorm"]
    second = {p.name: p.read_bytes() for p in (build.SNIPPETS / "layernorm").iterdir()}
    assert first == second  # byte-identical


def test_the_page_key_follows_the_transformer_modules_a_page_uses():
    source = (build.PAGES_DIR / "layernorm.py").read_text()
    deps = build.transformer_dependencies(source)
    assert {"layernorm", "embedding", "model", "gradcheck", "crosscheck"} <= deps
    assert build.page_key("layernorm", CONTEXT) != build.page_key("layernorm", {"repo_url": "elsewhere"})


def test_a_broken_marker_fails_the_build(monkeypatch):
    """Negative control: a marker that names no equation stops generation."""
    import site_scripts.markers as markers

    real = markers.collect_markers()
    monkeypatch.setattr(markers, "collect_markers",
                        lambda: real + [Marker("no-such-equation", "transformer/layernorm.py", 1, "x")])
    with pytest.raises(RuntimeError, match="eq:no-such-equation"):
        build.generate_all(CONTEXT, ["layernorm"])
