"""Recording a live judge's traffic into a vcrpy cassette that ``eval --judge deepseek-… --offline
--judge-cassette PATH`` replays (:class:`~searchr1.search.replay.CassetteTransport`).

The recording is an httpx transport around the judge's own client only (nothing else's traffic
is captured). Request headers are kept except ``Authorization`` and the other key headers; the
file is written when the client closes, through a temporary file, and refused (nothing written)
if any key value would appear in it. A cassette already at the path keeps its interactions and
gets the new ones after them, so a resumed run (or a second eval) adds to what the first recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import httpx
import yaml
from vcr.request import Request as VcrRequest
from vcr.serialize import deserialize, serialize
from vcr.serializers import yamlserializer

from searchr1.basics.fileio import write_text_atomically
from searchr1.basics.secrets import Secret
from searchr1.search.replay import CassetteFormatError
from searchr1.search.recording import SECRET_REQUEST_HEADERS, SecretLeakError, find_leaks


class RecordingTransport(httpx.AsyncBaseTransport):
    def __init__(self, path: Path, *, secrets: Sequence[Secret], inner: httpx.AsyncBaseTransport | None = None) -> None:
        self.path = Path(path)
        self.secrets = list(secrets)
        self.inner = inner or httpx.AsyncHTTPTransport(retries=2)
        self.requests: list[VcrRequest] = []
        self.responses: list[dict[str, object]] = []
        self.kept = _recorded(self.path)  # what an earlier recording left at the path, written back first

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        response = await self.inner.handle_async_request(request)
        content = await response.aread()
        dropped = {h.lower() for h in SECRET_REQUEST_HEADERS}
        headers = {k: v for k, v in request.headers.items() if k.lower() not in dropped}
        self.requests.append(VcrRequest(request.method, str(request.url), body, headers))
        self.responses.append({
            "status": {"code": response.status_code, "message": response.reason_phrase},
            "headers": {k: [v] for k, v in response.headers.items()
                        if k.lower() not in ("set-cookie", "content-encoding", "transfer-encoding")},
            "body": {"string": content.decode("utf-8", "replace")},
        })
        return httpx.Response(response.status_code, headers=response.headers, content=content, request=request)

    async def aclose(self) -> None:
        await self.inner.aclose()
        if not self.requests:
            return
        text = serialize({"requests": [*self.kept[0], *self.requests], "responses": [*self.kept[1], *self.responses]},
                         yamlserializer)
        if find_leaks(text, self.secrets):
            raise SecretLeakError(f"a key would have been written to {self.path}; nothing was written")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(self.path, text)


def _recorded(path: Path) -> tuple[list[VcrRequest], list[dict[str, object]]]:
    """The interactions of the cassette at ``path`` (none when there is no file); one line naming
    the file when it is not a cassette (refused before the judge asks anything)."""
    if not path.is_file():
        return [], []
    try:
        requests, responses = deserialize(path.read_text("utf-8"), yamlserializer)
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError, yaml.YAMLError) as error:
        raise CassetteFormatError(f"--judge-cassette {path} is not a cassette to add to: {error}") from None
    return list(requests), list(responses)
