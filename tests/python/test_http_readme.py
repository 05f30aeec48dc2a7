"""The docs' "Serving over HTTP" (docs/src/http.md) as a new user runs it: its minimal config (with the
digest of a real token) started with `dataref serve --http`, and its Python client snippet
run as written against it (the URL pointed at the free port the test took).

Run by `scripts/test`, which builds the binary and sets DATAREF_BIN.
"""

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

BIN = os.environ.get("DATAREF_BIN")
ROOT = Path(__file__).resolve().parents[2]


def docs_text() -> str:
    """The README and the book's pages, one after another: what a person reads."""
    pages = [ROOT / "README.md"] + sorted((ROOT / "docs" / "src").glob("*.md"))
    return "\n".join(p.read_text() for p in pages)

pytestmark = pytest.mark.timeout(120)


def readme_block(name: str, lang: str) -> str:
    text = docs_text()
    marker = f"<!-- check: {name} -->"
    assert marker in text, f"neither README.md nor docs/src has {marker}"
    rest = text[text.index(marker) + len(marker):]
    m = re.search(rf"```{lang}\n(.*?)```", rest, re.S)
    assert m, f"no ```{lang} block after {marker}"
    return m.group(1)


def new_token(name: str) -> tuple[str, str]:
    out = subprocess.run([BIN, "token", "new", name], capture_output=True, text=True, check=True)
    token = re.search(r"^token: (\S+)$", out.stdout, re.M).group(1)
    digest = re.search(r'^token_sha256 = \["([0-9a-f]{64})"\]$', out.stdout, re.M).group(1)
    return token, digest


def test_readme_python_client_reaches_the_readme_server(tmp_path):
    assert BIN, "DATAREF_BIN must name the dataref binary (scripts/test sets it)"
    token, digest = new_token("eu_analyst")
    config = readme_block("http-minimal", "toml")
    placeholder = re.search(r'token_sha256 = \["([^"]+)"\]', config).group(1)
    (tmp_path / "dataref.toml").write_text(config.replace(placeholder, digest))
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DATAREF_")}
    server = subprocess.Popen(
        [BIN, "serve", "--config", str(tmp_path / "dataref.toml"), "--home", str(home),
         "--http", "127.0.0.1:0"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, env=env,
    )
    try:
        url = None
        lines = []
        for line in server.stderr:
            lines.append(line)
            m = re.match(r"serving MCP on (http://\S+/mcp)", line)
            if m:
                url = m.group(1)
                break
        assert url, "".join(lines)
        # Keep reading stderr so the server never blocks on a full pipe.
        threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()

        snippet = readme_block("http-python", "python")
        assert 'URL = "http://127.0.0.1:8750/mcp"' in snippet, snippet
        script = tmp_path / "client.py"
        script.write_text(snippet.replace("http://127.0.0.1:8750/mcp", url))
        run = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=90,
            env={**env, "DATAREF_TOKEN": token},
        )
        assert run.returncode == 0, run.stderr
        assert "describe_data" in run.stdout, run.stdout

        # The same snippet with a wrong token is refused: the header is what let it in.
        wrong = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=90,
            env={**env, "DATAREF_TOKEN": "not-a-token"},
        )
        assert wrong.returncode != 0, wrong.stdout
    finally:
        server.terminate()
        server.wait(timeout=30)
