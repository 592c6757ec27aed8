"""The Standard Webhooks signature, checked against the standard's own test vector."""

from datetime import UTC, datetime, timedelta

import pytest

from ledger.notices.signed_webhooks import BadSignature, check_signature, signed_headers, signer

# From the Standard Webhooks specification's reference libraries' tests.
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
MESSAGE_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
TIMESTAMP = 1614265330
BODY = b'{"test": 2432232314}'
SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_signs_as_the_standard_s_test_vector():
    headers = signed_headers(
        SECRET, message_id=MESSAGE_ID, at=datetime.fromtimestamp(TIMESTAMP, UTC), body=BODY
    )
    assert headers == {
        "webhook-id": MESSAGE_ID,
        "webhook-timestamp": str(TIMESTAMP),
        "webhook-signature": SIGNATURE,
    }


def fresh(body=BODY, at=None, secret=SECRET):
    return signed_headers(secret, message_id="msg_1", at=at or datetime.now(UTC), body=body)


def test_a_fresh_signed_call_passes_and_names_its_id():
    assert check_signature(SECRET, BODY, fresh()) == "msg_1"


def test_headers_in_any_case_and_several_signatures_pass():
    headers = {name.upper(): value for name, value in fresh().items()}
    headers["WEBHOOK-SIGNATURE"] = "v1,AAAA " + headers["WEBHOOK-SIGNATURE"]
    assert check_signature(SECRET, BODY, headers) == "msg_1"


@pytest.mark.parametrize(
    "spoil",
    [
        lambda h, b: (h, b + b" "),  # one byte more in the body
        lambda h, b: ({**h, "webhook-id": "msg_2"}, b),  # another id
        lambda h, b: ({k: v for k, v in h.items() if k != "webhook-signature"}, b),
        lambda h, b: ({**h, "webhook-timestamp": "nan"}, b),
        lambda h, b: ({**h, "webhook-timestamp": "1e400"}, b),
        lambda h, b: ({**h, "webhook-signature": "v1,"}, b),
    ],
)
def test_a_spoiled_call_is_refused(spoil):
    headers, body = spoil(fresh(), BODY)
    with pytest.raises(BadSignature):
        check_signature(SECRET, body, headers)


@pytest.mark.parametrize("minutes", [-6, 6])
def test_a_call_outside_five_minutes_is_refused(minutes):
    at = datetime.now(UTC) + timedelta(minutes=minutes)
    with pytest.raises(BadSignature):
        check_signature(SECRET, BODY, fresh(at=at))


def test_another_secret_is_refused():
    other = "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo="
    with pytest.raises(BadSignature):
        check_signature(other, BODY, fresh())


@pytest.mark.parametrize("secret", ["", "whsec_", "whsec_!!not base64!!"])
def test_an_unusable_secret_is_a_setting_error(secret):
    with pytest.raises(ValueError):
        signer(secret)
