"""The explorer's API as MCP tools (``python app.py --mcp``): Gradio's MCP server, with what it says and does about
images and answers made to fit the app.

Gradio's server offers every ``gr.api`` endpoint as a tool and reaches it through its own ``gradio_client`` (the same
queue and admission as any call). Left as it is, its 11 tools that take an image described them as "a http or https
url to a file" and told agents to use an ``upload_file_to_gradio`` tool that this server does not have; a URL got a
bare 400 (the app fetches nothing), a path "Invalid file data format", and only an undocumented base64 data URI
worked, written to ``$TMPDIR/gradio`` (Gradio's MCP module read ``GRADIO_TEMP_DIR`` when imported),
outside the app's counted work dir and never swept; and each answer was ``str()`` of a Python value, not JSON.
:class:`ExplorerMCPServer` changes exactly that:

- an image argument is a data URI (``data:image/png;base64,…``), said in its schema and the tool's description,
  and is decoded into Gradio's upload cache, which the app's work dir counts and sweeps (``GRADIO_TEMP_DIR``);
- the schema names the shipped models (``checkpoint``: their names, the default first), the fits, the attribution
  methods and, for ``layer``, the default model's layers, so a call can be built from the schema alone;
- every answer is JSON text (a file: an image, when it is one, and ``{"file": url}``); ``gradio_client`` callers get
  the endpoints' dicts as before (this changes only the MCP server).

Gradio's private parts this relies on (``gradio.mcp``, checked by ``tests/app/test_mcp.py``): the class
``GradioMCPServer``, which ``gradio.routes`` instantiates at launch as ``gradio.mcp.GradioMCPServer(blocks)``; its
methods ``get_input_schema(tool_name, parameters)`` → ``(schema, filedata_positions)``,
``convert_strings_to_filedata(value, filedata_positions)``, ``postprocess_output_data(data, root_url)`` and the
property ``_file_data_tool_description``; its ``types`` (the ``mcp`` package's).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import gradio.mcp
from gradio import processing_utils
from gradio.utils import get_upload_folder
from gradio_client import handle_file
from gradio_client import utils as client_utils

IMAGE_FORMAT = "an image as a data URI: data:image/png;base64,... (PNG, JPEG, WebP, HEIC…; no URL or path)"
IMAGE_DESCRIPTION = (" Images are passed as data URIs (data:image/png;base64,...): the server fetches no URL and "
                     "opens no path.")


def _property(schema: dict, path: list[str | int]) -> dict:
    """The node of ``schema`` at ``path``, a FileData position of Gradio's (its first key is a property's name)."""
    node = schema["properties"]
    for key in path:
        node = node[key]
    return node


class ExplorerMCPServer(gradio.mcp.GradioMCPServer):
    """Gradio's MCP server for the explorer (module docstring).

    Args:
        blocks (gr.Blocks): the app.
        enums (dict[str, dict]): JSON-schema keywords added to a parameter of every tool, by parameter name (e.g.
            ``{"fit": {"enum": [...]}}``).
    """

    def __init__(self, blocks, enums: dict[str, dict]) -> None:
        super().__init__(blocks)
        self.enums = enums

    @property
    def _file_data_tool_description(self) -> str:
        return IMAGE_DESCRIPTION

    def get_input_schema(self, tool_name: str, parameters: dict[str, str] | None = None
                         ) -> tuple[dict[str, Any], list[list[str | int]]]:
        schema, positions = super().get_input_schema(tool_name, parameters)
        for path in positions:
            _property(schema, path)["format"] = IMAGE_FORMAT
        for name, keywords in self.enums.items():
            if name in schema["properties"]:
                schema["properties"][name].update(keywords)
        return schema, positions

    def convert_strings_to_filedata(self, value: Any, filedata_positions: list[list[str | int]]) -> Any:
        """``value`` with each image argument (a data URI) decoded into Gradio's upload cache, as a file for the
        endpoint.

        Raises:
            ValueError: an image argument that is not a data URI (its message says what to send).
        """
        converted = dict(value)
        for path in filedata_positions:
            name = path[0]
            text = converted.get(name)
            if text is None:
                continue
            if not isinstance(text, str) or not text.startswith("data:"):
                raise ValueError(f"{name} must be {IMAGE_FORMAT}")
            converted[name] = handle_file(processing_utils.save_base64_to_cache(text, get_upload_folder()))
        return converted

    def postprocess_output_data(self, data: Any, root_url: str) -> list:
        """Each output as JSON text, each file in it (at any depth) as ``{"file": url}``, and an image file also as
        Gradio shows it (the image itself), before that text."""
        images: list = []
        texts = [self.types.TextContent(type="text", text=json.dumps(self._files_as_urls(output, root_url, images),
                                                                      ensure_ascii=False)) for output in data]
        return images + texts

    def _files_as_urls(self, value: Any, root_url: str, images: list) -> Any:
        """``value`` with each file replaced by ``{"file": url}`` (Gradio's file route); an image file's picture is
        appended to ``images`` (Gradio's ``postprocess_output_data``)."""
        if client_utils.is_file_obj_with_meta(value):
            url = value.get("url") or f"{root_url}/gradio_api/file={client_utils.encode_file_path(value['path'])}"
            shown = super().postprocess_output_data([{**value, "url": url}], root_url)
            images += [item for item in shown if item.type == "image"]
            return {"file": url}
        if isinstance(value, dict):
            return {key: self._files_as_urls(item, root_url, images) for key, item in value.items()}
        if isinstance(value, list):
            return [self._files_as_urls(item, root_url, images) for item in value]
        return value


@contextlib.contextmanager
def serving(enums: dict[str, dict]) -> Iterator[None]:
    """While inside, a launch with ``mcp_server=True`` makes an :class:`ExplorerMCPServer` (with ``enums``)."""
    make: Callable = lambda blocks: ExplorerMCPServer(blocks, enums)  # noqa: E731
    with mock.patch.object(gradio.mcp, "GradioMCPServer", make):
        yield
