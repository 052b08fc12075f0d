"""The fast path of email normalization agrees with `email_validator` on every input."""

from __future__ import annotations

from email_validator import EmailNotValidError, validate_email
from hypothesis import example, given
from hypothesis import strategies as st

from suppression.normalize import _simple_email


def _slow(text: str) -> tuple[str, str] | None:
    try:
        info = validate_email(text, check_deliverability=False, allow_smtputf8=True)
    except EmailNotValidError:
        return None
    local, _, _ = info.normalized.rpartition("@")
    domain = info.ascii_domain.lower()
    return f"{local.lower()}@{domain}", f"{local}@{domain}"


_PIECE = st.sampled_from(
    ["a", "Z", "0", "9", ".", "-", "_", "+", "@", "ab", "xn--", "--", "com", "test", "local",
     "arpa", "1", "é", " ", "..", "x" * 63, "y" * 64, "onion", "invalid", "example", "a.b"]
)  # fmt: skip
_ADDRESSES = st.lists(_PIECE, min_size=1, max_size=12).map("".join)


@given(st.one_of(_ADDRESSES, st.emails().map(str)))
@example("User.Name+tag@Example.COM")
@example("a@b.test")
@example("a@localhost.local")
@example("a@ab--cd.com")
@example("a@example.c0m")
@example("x" * 65 + "@example.com")
def test_fast_path_matches_email_validator(text: str) -> None:
    fast = _simple_email(text)
    if fast is not None:
        assert (fast.key, fast.display) == _slow(text)


def test_fast_path_covers_plain_addresses() -> None:
    for text in ("user.1@example.com", "A_b+c@Mail.Example.co.uk", "x-y@a1.io"):
        fast = _simple_email(text)
        assert fast is not None and (fast.key, fast.display) == _slow(text)
