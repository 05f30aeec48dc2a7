"""The stock OpenAI Python client against dataref's `/v1/chat/completions` facade: the real
`dataref serve --http` (a bearer token made by `dataref token new`, the built-in sample's
data), its agent's model at a small scripted OpenAI-compatible server started here, and
`OpenAI(base_url=…, api_key=token)` calling `models.list` and `chat.completions.create`,
streamed and not.

Run by `scripts/test`, which builds the binary and sets DATAREF_BIN.
"""

import json
import os
import re
import subprocess
import threading

import openai
import pytest
from openai import OpenAI

from scripted_model import ScriptedModel

BIN = os.environ.get("DATAREF_BIN")

pytestmark = pytest.mark.timeout(120)


def new_token(name):
    out = subprocess.run([BIN, "token", "new", name], capture_output=True, text=True, check=True)
    token = re.search(r"^token: (\S+)$", out.stdout, re.M).group(1)
    digest = re.search(r'^token_sha256 = \["([0-9a-f]{64})"\]$', out.stdout, re.M).group(1)
    return token, digest


@pytest.fixture
def served(tmp_path):
    """(base URL, token, scripted model) of a running `dataref serve --http`."""
    assert BIN, "DATAREF_BIN must name the dataref binary (scripts/test sets it)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DATAREF_")}
    home = tmp_path / "home"
    # The built-in sample's database: one start of `dataref serve` (stdio) without a config.
    # (It exits at once on the closed stdin; the database is made before.)
    made = subprocess.run([BIN, "serve", "--home", str(home), "--rows", "2000"],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env,
                          timeout=60)
    db = home / "sample" / "sales-2000.sqlite"
    assert db.exists(), made.stderr
    token, digest = new_token("eu_analyst")
    config = tmp_path / "dataref.toml"
    config.write_text(f"""
[python]
enabled = false

[sources.sample]
kind = "sqlite"
path = "{db}"

[queries.sales]
source = "sample"
description = "Load sales on or after a date."
sql = "SELECT date, line, region, channel, units, revenue, discount FROM sales WHERE date >= :since ORDER BY date, id"
params.since = {{ type = "date", required = true }}

[agents.default]
tools = ["fetch_*", "describe_data"]

[principals.eu_analyst]
token_sha256 = ["{digest}"]
""")
    model = ScriptedModel()
    server = subprocess.Popen(
        [BIN, "serve", "--config", str(config), "--home", str(home), "--http", "127.0.0.1:0"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**env, "DATAREF_LLM_URL": model.url, "DATAREF_LLM_MODEL": "test-model"},
    )
    try:
        base = None
        lines = []
        for line in server.stderr:
            lines.append(line)
            m = re.match(r"serving MCP on (http://\S+)/mcp", line)
            if m:
                base = m.group(1)
                break
        assert base, "".join(lines)
        threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()
        yield base, token, model
    finally:
        server.terminate()
        server.wait(timeout=30)
        model.close()


def test_openai_client_lists_models_and_completes_streamed_and_not(served):
    base, token, model = served
    client = OpenAI(base_url=f"{base}/v1", api_key=token, max_retries=0)

    assert [m.id for m in client.models.list()] == ["default"]

    # Not streamed: the agent calls fetch_sales on the sample, then answers.
    model.push(calls=[("call_1", "fetch_sales", '{"since": "2025-01-01"}')], usage=(100, 10))
    model.push(text="Revenue grew in Q4.", usage=(200, 6))
    r = client.chat.completions.create(
        model="default",
        messages=[
            {"role": "system", "content": "You are a pirate."},
            {"role": "user", "content": "How did revenue do?"},
        ],
    )
    assert r.object == "chat.completion"
    assert r.choices[0].message.content == "Revenue grew in Q4."
    assert r.choices[0].finish_reason == "stop"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (300, 16, 316)
    first, second = model.requests[-2:]
    assert "pirate" not in json.dumps(first["messages"]), "the profile owns the prompt"
    observation = [m for m in second["messages"] if m["role"] == "tool"]
    assert observation and "data_" in observation[0]["content"], second["messages"]

    # Streamed, with usage.
    model.push(text="Streamed: EMEA led.", usage=(50, 5))
    chunks = list(client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Which region?"}],
        stream=True,
        stream_options={"include_usage": True},
    ))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Streamed: EMEA led."
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == 55

    # An unknown model is OpenAI's 404; a wrong token is refused.
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert e.value.code == "model_not_found"
    wrong = OpenAI(base_url=f"{base}/v1", api_key="not-a-token", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
