"""Check real API responses against ``jupyter_gpubroker/api/openapi.yaml``.

The document's schemas are JSON Schema 2020-12 (OpenAPI 3.1): a response body is
validated with ``jsonschema`` against the schema of the operation (path template +
method) and status it came with, ``#/components/...`` references resolved in the
document itself through a ``referencing`` registry.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Iterator
from importlib import resources
from typing import Any

import yaml
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from tornado.iostream import IOStream
from tornado.tcpclient import TCPClient

DOC_URI = "urn:jupyter-gpubroker:openapi"
METHODS = ("get", "put", "post", "delete", "patch")


def load_document() -> dict[str, Any]:
    text = resources.files("jupyter_gpubroker.api").joinpath("openapi.yaml").read_text()
    return yaml.safe_load(text)  # type: ignore[no-any-return]


DOC = load_document()
REGISTRY: Registry = Registry().with_resource(
    DOC_URI, Resource.from_contents(DOC, default_specification=DRAFT202012)
)


def _pointer(*parts: str) -> str:
    return "#/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)


def validator(pointer: str) -> Draft202012Validator:
    """A validator for the schema at ``pointer`` (``#/components/schemas/Lease``)."""
    return Draft202012Validator(
        {"$ref": DOC_URI + pointer},
        registry=REGISTRY,
        format_checker=Draft202012Validator.FORMAT_CHECKER,
    )


def validate(instance: Any, pointer: str, what: str) -> None:
    errors = sorted(validator(pointer).iter_errors(instance), key=lambda e: list(e.path))
    if errors:
        detail = "\n".join(
            f"  at /{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors[:5]
        )
        raise AssertionError(
            f"{what} does not match {pointer}:\n{detail}\n{json.dumps(instance)[:2000]}"
        )


def operations() -> Iterator[tuple[str, str]]:
    """Every (path template, method) the document describes."""
    for template, item in DOC["paths"].items():
        for method in METHODS:
            if method in item:
                yield template, method


def _template_re(template: str) -> re.Pattern[str]:
    return re.compile("^" + re.sub(r"\{[^/}]+\}", "[^/]+", template) + "$")


def find_operation(method: str, path: str) -> str:
    """The template of the documented operation ``method`` ``path`` (relative to the API
    root, query string excluded) belongs to."""
    path = "/" + path.lstrip("/")
    matches = [
        t for t, m in operations() if m == method.lower() and _template_re(t).fullmatch(path)
    ]
    assert matches, f"{method} {path} is not in the API document"
    assert len(matches) == 1, f"{method} {path} matches several templates: {matches}"
    return matches[0]


def response_pointer(template: str, method: str, status: int) -> tuple[str, str | None]:
    """(pointer of the response object, pointer of its JSON schema or None if no body)."""
    responses = DOC["paths"][template][method.lower()]["responses"]
    assert str(status) in responses, (
        f"{method.upper()} {template} answered {status}, which the document does not list "
        f"(it lists {sorted(responses)})"
    )
    pointer = _pointer("paths", template, method.lower(), "responses", str(status))
    response = responses[str(status)]
    if "$ref" in response:
        pointer = response["$ref"]
        response = DOC["components"]["responses"][pointer.rsplit("/", 1)[1]]
    content = response.get("content")
    if not content:
        return pointer, None
    assert "application/json" in content, f"{pointer} has no application/json body"
    return pointer, pointer + "/content/application~1json/schema"


def check_response(method: str, path: str, status: int, body: Any, sent: Any = None) -> str:
    """Validate a real response (and, for a success, the request body that was sent)
    against the document; returns the operation's path template."""
    template = find_operation(method, path)
    _, schema = response_pointer(template, method, status)
    what = f"{method.upper()} {path} -> {status}"
    if schema is None:
        assert body is None, f"{what}: the document says no body, got {body!r}"
    else:
        validate(body, schema, what)
    op = DOC["paths"][template][method.lower()]
    if sent is not None and status < 300:
        assert "requestBody" in op, f"{what}: sent a body the document does not describe"
        validate(
            sent,
            _pointer("paths", template, method.lower(), "requestBody")
            + "/content/application~1json/schema",
            f"the body sent to {method.upper()} {path}",
        )
    return template


Api = Callable[..., Awaitable[Any]]


class CheckedApi:
    """Calls the API through the ``api`` fixture, asserts the status, validates the
    reply against the document and records which (template, method, status) ran. A
    body that is to succeed is first sent with one field more, which its schema does not
    take (``additionalProperties: false``): the server must refuse that with a 400."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.seen: set[tuple[str, str, int]] = set()

    async def __call__(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        expect: int,
        headers: dict[str, str] | None = None,
        raw: str | None = None,
        **params: Any,
    ) -> Any:
        if raw is not None:
            status, data = await self.api(method, path, raw=raw, headers=headers, **params)
        else:
            if isinstance(body, dict) and expect < 300:
                more = {**body, "undocumented": 1}
                status, data = await self.api(method, path, more, headers=headers, **params)
                assert status == 400, f"{method} {path} took a field its body lacks: {data}"
            status, data = await self.api(method, path, body, headers=headers, **params)
        assert status == expect, f"{method} {path}: expected {expect}, got {status} {data}"
        template = check_response(method, path, status, data, body)
        self.seen.add((template, method.lower(), status))
        return data

    def record(self, template: str, method: str, status: int) -> None:
        self.seen.add((template, method.lower(), status))


def documented_responses() -> set[tuple[str, str, int]]:
    """Every (template, method, status) the document lists."""
    return {(t, m, int(s)) for t, m in operations() for s in DOC["paths"][t][m]["responses"]}


class EventStream:
    """A bare HTTP/1.0 client of the event stream (no chunking, closed on demand)."""

    def __init__(self, stream: IOStream) -> None:
        self.stream = stream
        self.status = 0
        self.content_type = ""

    @classmethod
    async def open(cls, port: int, path: str, headers: dict[str, str]) -> EventStream:
        stream = await TCPClient().connect("127.0.0.1", port)
        lines = [f"GET {path} HTTP/1.0", f"Host: 127.0.0.1:{port}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        await stream.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        head = (await stream.read_until(b"\r\n\r\n", max_bytes=65536)).decode()
        self = cls(stream)
        self.status = int(head.split()[1])
        for line in head.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.lower() == "content-type":
                self.content_type = value.strip()
        return self

    async def next(self, timeout: float = 10.0) -> dict[str, Any]:
        """The next ``data:`` message (keepalive comments skipped)."""
        while True:
            frame = await asyncio.wait_for(self.stream.read_until(b"\n\n"), timeout)
            data = [line[6:] for line in frame.decode().splitlines() if line.startswith("data: ")]
            if data:
                return json.loads("\n".join(data))  # type: ignore[no-any-return]

    def close(self) -> None:
        self.stream.close()


async def until_full(
    api: Api, method: str, call: Callable[[int], tuple[str, Any]], limit: int = 2000
) -> tuple[int, Any, list[Any]]:
    """Make the ``i``-th call ``call(i)`` -> (path, body) until one is refused (the state
    file is full); returns its status and reply, and the replies of those accepted."""
    accepted: list[Any] = []
    for i in range(limit):
        path, body = call(i)
        status, reply = await api(method, path, body)
        if status >= 300:
            check_response(method, path, status, reply, body)
            return status, reply, accepted
        accepted.append(reply)
    raise AssertionError(f"{limit} calls of {method} were all accepted")


def fill_state_file(store: Any) -> int:
    """Let the broker's SQLite file grow no more (SQLite then raises SQLITE_FULL, as on a
    full disk); returns its size in pages, to lift the limit with ``free_state_file``."""
    pages = int(store.conn.execute("PRAGMA page_count").fetchone()[0])
    store.conn.execute(f"PRAGMA max_page_count={pages}")
    return pages


def free_state_file(store: Any, pages: int) -> None:
    store.conn.execute(f"PRAGMA max_page_count={pages * 1000}")
