"""Keeping API keys out of everything that is printed, logged, recorded or shown to the model.

A key lives in a :class:`Secret`, whose ``repr``/``str`` never show the value; only
``reveal()`` does, at the single place where a request header is built. Error texts that may
carry server-provided words pass through :func:`sanitise_error`, which bounds them, strips
control characters and masks known secrets and anything that looks like a credential.
URLs that are stored or shown pass through :func:`redact_url` (no userinfo, no credential
parameters).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Iterable
from urllib.parse import parse_qsl, quote, quote_plus, unquote, urlencode, urlsplit, urlunsplit

MASK = "[redacted]"

# Things that look like credentials even when we do not know the value.
_CREDENTIAL_PATTERNS = (
    re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]+"),
    re.compile(r"\bBasic\s+[A-Za-z0-9+/]{8,}={0,2}"),  # HTTP Basic: base64 of user:password
    re.compile(r"\bsk-[A-Za-z0-9_-]{6,}"),
    re.compile(r"(?<=://)[^/\s@:]+:[^/\s@]+(?=@)"),  # user:password@ in a URL
    # name=value, name: value, "name": "value" (JSON), for any name ending like a credential:
    # api_key, x-api-key, access_token, refresh_token, client_secret, password, ...
    re.compile(
        r"(?i)[\"']?[A-Za-z0-9_-]*(?:api[_-]?key|apikey|token|secret|passw(?:or)?d|pwd|credential)[\"']?"
        r"\s*[=:]\s*(?:\"[^\"]*\"|'[^']*'|[^\s,;&\"'}\]]+)"
    ),
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
# Query parameters whose value is a credential (matched on the lower-cased name).
_SECRET_PARAMETER = re.compile(
    r"(?:^|[_-])(?:key|apikey|token|secret|password|passwd|pwd|auth|signature|sig|credential|session)s?$"
    r"|^(?:key|apikey|api_key|token|access_token|auth|password|secret|sig|signature|code)$"
)


class Secret:
    """A string that does not print itself. Compare and hash like the value."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        if not isinstance(value, str):
            raise TypeError(f"Secret value must be str, got {type(value).__name__}")
        self._value = value

    def reveal(self) -> str:
        return self._value

    def fingerprint(self) -> str:
        """A short, non-reversible tag to tell keys apart in messages."""
        return hashlib.sha256(self._value.encode()).hexdigest()[:8]

    def __repr__(self) -> str:
        return "Secret('****')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("Secret", self._value))

    def __bool__(self) -> bool:
        return bool(self._value)

    def __reduce__(self):  # never pickle a key into a file by accident
        raise TypeError("Secret objects cannot be pickled")


def secret_forms(secret: Secret | str) -> set[str]:
    """The ways a key can be written down: as is, URL-quoted (with and without ``/`` kept),
    form-encoded, JSON-escaped and base64 (standard and URL-safe, padded or not). A URL's
    ``user:password`` is a secret of its own (:func:`url_secrets`), so the base64 of the pair,
    which is what an HTTP Basic header carries, is one of these forms."""
    value = secret.reveal() if isinstance(secret, Secret) else secret
    if not value:
        return set()
    encoded = value.encode("utf-8", "surrogatepass")
    forms = {value, quote(value, safe=""), quote(value), quote_plus(value), json.dumps(value)[1:-1],
             json.dumps(value, ensure_ascii=False)[1:-1]}
    for coded in (base64.b64encode(encoded).decode(), base64.urlsafe_b64encode(encoded).decode()):
        forms |= {coded, coded.rstrip("=")}
    return {form for form in forms if len(form) >= 4}


def redact(text: str, secrets: Iterable[Secret | str] = ()) -> str:
    """Replace every known secret value (in any of its :func:`secret_forms`), and
    credential-looking spans, by ``[redacted]``."""
    text = redact_known(text, secrets)
    for pattern in _CREDENTIAL_PATTERNS:
        text = pattern.sub(MASK, text)
    return text


def redact_known(text: str, secrets: Iterable[Secret | str] = ()) -> str:
    """Replace only the known secret values (in any of their forms): for text such as search
    results, where credential-looking words are ordinary content."""
    forms = sorted({form for s in secrets for form in secret_forms(s)}, key=len, reverse=True)
    for form in forms:
        text = text.replace(form, MASK)
    return text


def is_secret_parameter(name: str) -> bool:
    """Whether a URL query parameter of this name usually carries a credential."""
    return bool(_SECRET_PARAMETER.search(name.strip().lower()))


def redact_url(url: str) -> str:
    """``url`` without its userinfo (``user:password@``) and without the query parameters that
    carry credentials (:func:`is_secret_parameter`): what may be stored, logged or shown. The
    result still reaches the same host and path, so a cassette recorded from it replays."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return MASK
    netloc = parts.netloc.rpartition("@")[2]
    query = parse_qsl(parts.query, keep_blank_values=True)
    kept = [(name, value) for name, value in query if not is_secret_parameter(name)]
    if netloc == parts.netloc and len(kept) == len(query):
        return url  # nothing to remove: exactly as given
    new_query = urlencode(kept) if len(kept) != len(query) else parts.query
    return urlunsplit((parts.scheme, netloc, parts.path, new_query, parts.fragment))


_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s?#]*@")


def strip_userinfo(text: str) -> str:
    """``text`` with the userinfo (``user:password@``) of every URL in it removed, as
    :func:`redact_url` removes it from one URL: for messages that quote a URL among other words
    (a connection error, a client library's error text)."""
    return _USERINFO.sub(r"\1", text)


def url_secrets(url: str | None) -> tuple[Secret, ...]:
    """The credentials a URL carries (its password, a bare token in the user name, the values of
    its credential parameters), to be masked wherever the URL's answers are shown."""
    if not url:
        return ()
    try:
        parts = urlsplit(url)
    except ValueError:
        return ()
    found = [unquote(parts.password or "")]
    if parts.username and parts.password is None and len(parts.username) >= 16:
        found.append(unquote(parts.username))  # a bare user name that long is a token (https://<token>@host)
    if parts.password is not None or len(parts.username or "") >= 16:
        # httpx sends the userinfo as ``Authorization: Basic base64(user:password)``; the pair
        # (decoded, and as written in the URL) is what an echo of that header or of the URL shows
        found.append(f"{unquote(parts.username or '')}:{unquote(parts.password or '')}")
        found.append(parts.netloc.rpartition("@")[0])
    found += [value for name, value in parse_qsl(parts.query) if is_secret_parameter(name)]
    return tuple(dict.fromkeys(Secret(value) for value in found if len(value) >= 4))


def sanitise_error(text: object, secrets: Iterable[Secret | str] = (), *, limit: int = 160) -> str:
    """A short single-line error text safe for logs and for the model's context."""
    cleaned = _CONTROL.sub(" ", str(text))
    cleaned = " ".join(cleaned.split())
    cleaned = redact(cleaned, secrets)
    if len(cleaned) > limit:
        cleaned = cleaned[: max(0, limit - 1)].rstrip() + "…"
    return cleaned
