"""A password in ``PYTRIO_BASE_URL`` (``http://user:pass@host``) is never printed: not in the
line that says where a command connects, not in a connection error, not in a service error
that names the server it called."""

from __future__ import annotations

import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

import searchr1.runtime.connect as connect
from searchr1.runtime.failures import describe_failure
from searchr1.wiring.services import ServiceSetupError, live_service
from searchr1.basics.secrets import strip_userinfo

PASSWORD = "s3cret-pass-99"


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed again when this returns: nothing listens there


def test_connecting_and_failing_to_connect_never_print_the_base_urls_password(monkeypatch, capsys):
    url = f"http://alice:{PASSWORD}@127.0.0.1:{closed_port()}"
    monkeypatch.setenv("PYTRIO_API_KEY", "a-key-for-the-test")
    monkeypatch.setattr(connect, "pytrio_base_url", lambda: url)
    with pytest.raises(ServiceSetupError) as raised:
        live_service(connect_timeout=5)
    printed = capsys.readouterr()
    shown = printed.out + printed.err + str(raised.value)
    assert "connecting to PyTRIO at http://127.0.0.1:" in printed.err
    assert "cannot connect to PyTRIO at http://127.0.0.1:" in str(raised.value)
    assert PASSWORD not in shown and "alice" not in shown, shown


def test_a_service_error_naming_a_server_with_userinfo_is_described_without_it():
    from pytrio.errors.base import PyTrioError

    error = PyTrioError("the service failed", code="internal_error", source="control",
                        server=f"http://alice:{PASSWORD}@gpu-box:9000", status_code=500)
    assert PASSWORD in str(error)  # what the client library itself prints
    described = describe_failure(error)
    assert PASSWORD not in described and "gpu-box:9000" in described


# what a URL's userinfo can hold as it is written in text: no separator, no white space
userinfo_text = st.text(st.characters(blacklist_characters="/?#@", blacklist_categories=("Zs", "Zl", "Zp", "Cc", "Cs")),
                        min_size=1, max_size=30)


@given(user=userinfo_text, password=userinfo_text, before=st.text(max_size=20), after=st.text(max_size=20))
def test_stripping_userinfo_leaves_no_part_of_it_and_keeps_the_host(user, password, before, after):
    """Invariant: whatever the user name and password (any characters a URL's userinfo can
    hold), the text quoting the URL keeps its host and loses the whole ``user:password@``."""
    secret = f"{user}:{password}@"
    text = f"{before} http://{secret}host.example:81/path {after}"
    stripped = strip_userinfo(text)
    assert "http://host.example:81/path" in stripped
    assert secret not in stripped
