"""The API as MCP tools (``--mcp``, app_mcp.py), through the ``mcp`` package's own client: every tool called with
arguments built from its schema alone answers JSON, and an image argument is kept in the app's counted work dir."""

from __future__ import annotations

import base64
import json
import socket
import tempfile
from pathlib import Path

import numpy as np
import pytest
from gradio import processing_utils
from gradio.utils import get_upload_folder
from PIL import Image

import app
import app_mcp
import app_server
from tests.loops import run_coroutine

mcp = pytest.importorskip("mcp")
from mcp.client.streamable_http import streamablehttp_client  # noqa: E402

TOOLS = {f"api_{name}" for name in ("layers", "predict", "neighbors", "table", "export", "spectrum", "multihop",
                                     "attribution", "equivalence", "weights", "mix", "pixels", "compare")}
IMAGE_TOOLS = TOOLS - {"api_layers", "api_weights"}


def argument(schema: dict, image: str) -> object:
    """A value for one parameter from its schema alone: the image format's data URI, else its default, its first
    example or enum entry, its minimum, or an empty value of its type."""
    if schema.get("format") == app_mcp.IMAGE_FORMAT:
        return image
    for key in ("default", "examples", "enum"):
        if schema.get(key) not in (None, [], ""):
            return schema[key][0] if key != "default" else schema[key]
    if schema.get("type") == "array":
        return schema["items"]["enum"][:schema.get("minItems", 1)]
    return {"integer": schema.get("minimum", 0), "number": schema.get("minimum", 0), "string": ""}[schema["type"]]


async def call_every_tool(url: str, image: str) -> tuple[dict, dict]:
    """Each tool's schema and the result of calling it with :func:`argument`'s values for its required
    parameters, over MCP's streamable HTTP transport."""
    async with streamablehttp_client(f"{url}gradio_api/mcp/") as (read, write, _), \
            mcp.ClientSession(read, write) as session:
        await session.initialize()
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        results = {}
        for name, tool in tools.items():
            schema = tool.inputSchema
            arguments = {key: argument(schema["properties"][key], image) for key in schema.get("required", [])}
            results[name] = await session.call_tool(name, arguments)
        return tools, results


def test_every_tool_answers_json_to_a_call_built_from_its_schema(explorer, tmp_path):
    """The 11 image tools said "a http or https url to a file" (a URL got a bare 400, a path "Invalid file data
    format"; only an undocumented data URI worked, written to $TMPDIR/gradio, outside the counted work dir and never
    swept), and every answer was str() of a Python value. Now the schema says what works, the image lands in
    Gradio's upload cache (in the work dir), and every answer is JSON."""
    photo = tmp_path / "photo.png"  # a new picture each run: its file is written anew wherever it goes
    Image.fromarray(np.random.default_rng().integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(photo)
    image = "data:image/png;base64," + base64.b64encode(photo.read_bytes()).decode()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    demo = app.build_demo(explorer)
    _, url, _ = app_server.launch(demo, port, prevent_thread_lock=True, workspace=explorer.workspace,
                           mcp_schema=explorer.tool_schema())
    try:
        tools, results = run_coroutine(call_every_tool(url, image))
    finally:
        demo.close()
    assert set(tools) == TOOLS
    assert tools["api_layers"].description.startswith("The layers a model's views open")
    for name in IMAGE_TOOLS:
        schema = tools[name].inputSchema["properties"]["image"]
        assert schema["type"] == "string" and schema["format"] == app_mcp.IMAGE_FORMAT, name
        assert "http" not in tools[name].description and "upload_file_to_gradio" not in tools[name].description
    for name, result in results.items():
        texts = [item.text for item in result.content if item.type == "text"]
        assert not result.isError and texts, (name, texts)
        answers = [json.loads(text) for text in texts]  # JSON, not a Python repr
        assert all(answer is not None for answer in answers), name
    assert json.loads(results["api_predict"].content[0].text).keys() <= set(explorer.model("cnn-l0.5").card.classes)
    exported = results["api_export"].content  # the overlay's picture, then the two files by address
    assert [item.type for item in exported] == ["image", "text"]
    assert [Path(file["file"]).suffix for file in json.loads(exported[1].text)] == [".png", ".json"]
    stored = processing_utils.hash_base64(image)
    assert not (Path(tempfile.gettempdir()) / "gradio" / stored).exists()  # where Gradio's MCP module wrote it
    assert (Path(get_upload_folder()) / stored / "file.png").is_file()  # in the work dir's counted cache
