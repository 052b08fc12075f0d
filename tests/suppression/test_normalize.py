"""The fast paths of normalization agree with the libraries they shortcut: email with
`email_validator`, NANP phone numbers in E.164 with `phonenumbers.parse`."""

from __future__ import annotations

import phonenumbers
from email_validator import EmailNotValidError, validate_email
from hypothesis import example, given
from hypothesis import strategies as st

from suppression.normalize import _NANP_E164, InvalidAddress, _simple_email, normalize_phone


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


# -- phone numbers: the NANP E.164 fast path --------------------------------------------------


def _parsed(text: str) -> phonenumbers.PhoneNumber | None:
    try:
        return phonenumbers.parse(text, None)
    except phonenumbers.NumberParseException:
        return None


@given(st.from_regex(r"\+1[0-9]{8,12}", fullmatch=True))
@example("+14155550100")  # valid
@example("+12015550123")  # valid
@example("+12345678901")  # possible, not valid
@example("+15005550006")  # Twilio's magic number
@example("+11234567890")  # area code 1: not the fast path
def test_nanp_fast_path_reads_numbers_as_phonenumbers_parse_does(text: str) -> None:
    fast = _NANP_E164.fullmatch(text) is not None
    if fast:
        assert phonenumbers.PhoneNumber(country_code=1, national_number=int(text[2:])) == (
            _parsed(text)
        )
    # The same answer as the full parse, for strict and lenient checks alike.
    for strict in (False, True):
        expected: tuple[str, str] | str
        try:
            number = _parsed(text)
            if number is None:
                raise InvalidAddress(text, "unparsable")
            if not phonenumbers.is_possible_number(number):
                raise InvalidAddress(text, "not a possible phone number")
            e164 = phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164)
            if strict and not phonenumbers.is_valid_number(number):
                raise InvalidAddress(text, "invalid")
            expected = (e164, e164)
        except InvalidAddress:
            expected = "refused"
        try:
            got = normalize_phone(text, strict=strict)
            actual: tuple[str, str] | str = (got.key, got.display)
        except InvalidAddress:
            actual = "refused"
        assert actual == expected


def test_nanp_fast_path_takes_only_plain_e164() -> None:
    for text in ("+14155550100", "+12015550123"):
        assert _NANP_E164.fullmatch(text)
    for text in ("4155550100", "+1 415 555 0100", "+141555501001", "+11155550100", "+4415550100"):
        assert not _NANP_E164.fullmatch(text)
