"""``mask_url``: no password of a lock URL is ever printed, whatever shape the URL has.

Every error message, log line and printed setting that quotes a URL goes through
``mask_url``; a URL with no scheme (``user:secret@host``) used to be echoed whole.
"""

from __future__ import annotations

from typing import Any

import pytest
from celery.exceptions import ImproperlyConfigured
from hypothesis import given, settings
from hypothesis import strategies as st

from celery_singleton_lock.client import mask_url
from celery_singleton_lock.config import read_settings

SECRET = "hunter2"


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        # the usual shapes
        ("redis://user:hunter2@host:6379/0", "redis://user:**@host:6379/0"),
        ("redis://:hunter2@host:6379/0", "redis://:**@host:6379/0"),
        ("rediss://default:hunter2@host:6380/0?ssl_cert_reqs=required",
         "rediss://default:**@host:6380/0?ssl_cert_reqs=required"),
        ("unix://:hunter2@/run/redis.sock?db=1", "unix://:**@/run/redis.sock?db=1"),
        ("redis+cluster://u:hunter2@node1:7000/0", "redis+cluster://u:**@node1:7000/0"),
        # no scheme at all
        ("user:hunter2@host:6379/0", "user:**@host:6379/0"),
        (":hunter2@host:6379", ":**@host:6379"),
        ("user:hunter2@host", "user:**@host"),
        # a scheme-less password that starts with // reads like a scheme: still masked
        ("user://0000@host:6379/0", "user:**@host:6379/0"),
        ("redis://0000@host:6379/0", "redis://0000@host:6379/0"),
        # no password: nothing to hide
        ("redis://user@host:6379/0", "redis://user@host:6379/0"),
        ("user@host:6379", "user@host:6379"),
        ("redis://host:6379/0", "redis://host:6379/0"),
        ("host:6379", "host:6379"),
        ("", ""),
        # malformed passwords: @, /, :, ; and ? inside, percent-encoded
        ("redis://user:hun@ter2@host/0", "redis://user:**@host/0"),
        ("redis://user:hun/ter2@host/0", "redis://user:**@host/0"),
        ("redis://:hun:ter2@host/0", "redis://:**@host/0"),
        ("redis://user:hun;ter2@host/0", "redis://user:**@host/0"),
        ("redis://user:hun?ter2@host/0", "redis://user:**@host/0"),
        ("redis://user:hunter2%40x%3A@host/0", "redis://user:**@host/0"),
        ("redis://us%3Aer:hunter2@host/0", "redis://us%3Aer:**@host/0"),
        ("redis://user:a://hunter2@host/0", "redis://user:**@host/0"),
        # secrets in the query string
        ("redis://host/0?db=1&password=hunter2", "redis://host/0?db=1&password=**"),
        ("redis://host/0?PASSWORD=hunter2&db=1", "redis://host/0?PASSWORD=**&db=1"),
        ("sentinel://s1:26379/0?master_name=m&sentinel_password=hunter2",
         "sentinel://s1:26379/0?master_name=m&sentinel_password=**"),
        ("redis://host/0?token=hunter2", "redis://host/0?token=**"),
        # multi-host and Sentinel lists: each URL keeps its host
        ("sentinel://:a1@s1:26379;sentinel://:b2@s2:26379/0",
         "sentinel://:**@s1:26379;sentinel://:**@s2:26379/0"),
        ("sentinel://s1:26379;sentinel://u:hunter2@s2:26379",
         "sentinel://s1:26379;sentinel://u:**@s2:26379"),
        ("redis://u:hunter2@a:1/0; redis://u:hunter2@b:1/0", "redis://u:**@a:1/0; redis://u:**@b:1/0"),
    ],
)  # fmt: skip
def test_masks_every_shape(url: str, masked: str) -> None:
    assert mask_url(url) == masked


@pytest.mark.parametrize(
    "value",
    [
        b"redis://user:hunter2@host/0",
        ["redis://user:hunter2@a/0", "redis://user:hunter2@b/0"],
        {"url": "redis://user:hunter2@host/0"},
        ("user:hunter2@host",),
    ],
    ids=["bytes", "list", "dict", "tuple"],
)
def test_values_that_are_not_strings_are_masked_as_their_str(value: Any) -> None:
    """A bad setting may be any object; what its ``str()`` shows of a password is hidden."""
    assert SECRET not in mask_url(value)


@pytest.mark.parametrize(
    "url",
    [
        "user:hunter2@host:6379/0",
        ":hunter2@host:6379",
        "redis//user:hunter2@host",
        "http://user:hunter2@host",
        "redis://user:hunter2@host:99999/0",
        "redis://user:hunter2@[::1/0",
        "sentinel://:hunter2@s1:26379;http://:hunter2@s2",
    ],
)
def test_a_rejected_lock_url_is_quoted_without_its_password(url: str) -> None:
    """The ImproperlyConfigured of a bad ``singleton_lock_url`` names the setting and never
    the password, whatever is wrong with the URL."""
    with pytest.raises(ImproperlyConfigured, match=r"^singleton_lock_url") as info:
        read_settings({"singleton_lock_url": url})
    assert SECRET not in str(info.value)
    assert "**" in str(info.value)


_PASSWORD = st.text(
    alphabet=st.sampled_from("abcXYZ019-_.~!$&'()*+,;=:@/?#%[] "), min_size=6, max_size=24
).filter(lambda text: text.strip() == text and "@" not in text[-1:])
_SHAPE = st.sampled_from(
    [
        "redis://user:{pw}@host:6379/0",
        "redis://:{pw}@host/0",
        "user:{pw}@host:6379/0",
        ":{pw}@host",
        "rediss://u:{pw}@h:6380/0?ssl_cert_reqs=none",
        "sentinel://:{pw}@s1:26379;sentinel://:{pw}@s2:26379/0",
    ]
)


@settings(max_examples=300, deadline=None)
@given(shape=_SHAPE, password=_PASSWORD)
def test_no_password_survives(shape: str, password: str) -> None:
    """Whatever characters a password holds (unencoded ``@ / : ; ? #`` included), the masked
    URL does not contain it."""
    url = shape.format(pw=password)
    masked = mask_url(url)
    assert password not in masked.replace("**", "\0"), (url, masked)
