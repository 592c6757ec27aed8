"""The parts every emulator shares: the one knob parser, the spoiling of answers, the unit
bookkeeping and the route tables. The wire bytes they make are proved by the emulator and SDK
tests; these pin down what each part promises on its own."""

import random
import threading
from dataclasses import dataclass

import pytest

from ledger.emulators import PROTOCOLS, emulator_class, knobs, spoiling, textgen
from ledger.emulators.knobs import CompatibleKnobs, FaultKnobs, KnobError
from ledger.emulators.units import Attempts, forget_expired, jsonl, jsonl_lines
from ledger.emulators.webhooks import Announcer


def test_the_parser_checks_every_value_and_returns_them_as_checked():
    assert knobs.parse(FaultKnobs, {"fail_rate": 0.5, "lose_create_responses": [3, 1, 3]}) == {
        "fail_rate": 0.5,
        "lose_create_responses": [1, 3],
    }


def test_the_parser_names_the_first_unknown_knob_and_lists_the_known_ones():
    with pytest.raises(KnobError) as refused:
        knobs.parse(FaultKnobs, {"zeta": 1, "alpha": 2, "fail_rate": 0.1})
    assert refused.value.name == "alpha"
    assert str(refused.value).startswith("Unknown knob(s) alpha, zeta; known: per_request_ms, fail_rate,")


def test_the_parser_refuses_a_value_a_knob_cannot_take_by_the_knobs_name():
    with pytest.raises(KnobError) as refused:
        knobs.parse(CompatibleKnobs, {"window_hint": "soon"})
    assert refused.value.name == "window_hint"
    assert str(refused.value) == (
        "window_hint must be one of none, retry-after, retry-after-ms, http-date, llm_provider-retry-after, "
        "x-ratelimit-reset-requests"
    )


def test_a_protocols_own_knob_is_unknown_to_another():
    with pytest.raises(KnobError):
        knobs.parse(FaultKnobs, {"api_key": "k"})


def test_a_path_prefix_matches_by_method_and_path():
    assert knobs.matches(None, "GET", "/v1/files")
    assert knobs.matches("/v1/batches", "GET", "/v1/batches/b1")
    assert knobs.matches("POST /v1/batches", "POST", "/v1/batches")
    assert not knobs.matches("POST /v1/batches", "GET", "/v1/batches")
    assert not knobs.matches("/v1/batches", "GET", "/v1/files")


def test_the_dice_depend_on_the_seed_and_the_parts_only():
    assert spoiling.dice(7, "fail", "c1", 0) == spoiling.dice(7, "fail", "c1", 0)
    assert spoiling.dice(7, "fail", "c1", 0) != spoiling.dice(7, "fail", "c1", 1)
    assert spoiling.dice(7, "fail", "c1", 0) != spoiling.dice(8, "fail", "c1", 0)
    assert 0 <= spoiling.dice(7, "x") < 1


def test_a_fault_that_is_off_never_happens_and_one_always_on_always_does():
    assert not any(spoiling.chance(1, 0.0, "fail", f"c{n}", 0) for n in range(200))
    assert all(spoiling.chance(1, 1.0, "fail", f"c{n}", 0) for n in range(200))


def test_answer_shapes_follow_their_rates_refusal_first():
    everything = FaultKnobs(refuse_rate=1.0, truncate_rate=1.0, fence_rate=1.0, prose_rate=1.0)
    assert spoiling.answer_shape(everything, 3, "c1", 0) == textgen.REFUSED
    assert spoiling.answer_shape(FaultKnobs(prose_rate=1.0), 3, "c1", 0) == textgen.PROSE
    assert spoiling.answer_shape(FaultKnobs(), 3, "c1", 0) == ""


def test_repeated_answers_are_drawn_per_request_at_the_rate():
    answers = [(f"line {n}", f"c{n}", 0) for n in range(400)]
    repeated = spoiling.repeated(5, 0.25, answers)
    assert 60 < len(repeated) < 140
    assert repeated == spoiling.repeated(5, 0.25, answers)
    assert spoiling.repeated(5, 0.0, answers) == []


def test_made_up_results_come_unknown_first_then_malformed_each_numbered_from_one():
    made = spoiling.made_up(FaultKnobs(unknown_lines=2, malformed_lines=3), "u{}".format, "m{}".format)
    assert made == ["u1", "u2", "m1", "m2", "m3"]


def test_made_up_lines_are_whole_for_unknown_ids_and_half_for_malformed_ones():
    lines = spoiling.made_up_lines(
        FaultKnobs(unknown_lines=1, malformed_lines=1), '{{"custom_id": "{}"}}'.format
    )
    assert lines == ['{"custom_id": "unknown-1"}', '{"custom_id": ']


def test_scattered_keeps_the_order_of_the_answers_and_places_every_extra_one():
    answers = list(range(20))
    spoiled = spoiling.scattered(answers, ["a", "b", "c"], random.Random(1))
    assert [value for value in spoiled if isinstance(value, int)] == answers
    assert sorted(value for value in spoiled if isinstance(value, str)) == ["a", "b", "c"]
    assert spoiled == spoiling.scattered(answers, ["a", "b", "c"], random.Random(1))


def test_the_order_of_a_results_file_follows_its_requests_not_its_id():
    requests = [("c1", 0), ("c2", 1)]
    assert spoiling.hashed_order(4, requests).random() == spoiling.hashed_order(4, iter(requests)).random()
    assert spoiling.hashed_order(4, requests).random() != spoiling.hashed_order(4, [("c1", 1)]).random()
    assert spoiling.requests_key(requests) == "c1#0,c2#1"


@pytest.mark.parametrize(
    ("content", "cut"), [(b"ab\ncd\n", 2), (b"abc\ndef\n", 3), (b"a", 0), (b"ab\n\n", 2)]
)
def test_a_download_is_cut_inside_a_line(content, cut):
    assert spoiling.mid_line(content) == cut


def test_attempts_count_each_key_from_zero():
    attempts = Attempts()
    assert [attempts.next("a"), attempts.next("b"), attempts.next("a"), attempts.next(None)] == [0, 0, 1, 0]


def test_jsonl_lines_end_at_newlines_only_and_skip_blank_ones():
    content = b'{"a": "x\xe2\x80\xa8y"}\r\n \t\n\n{"b": 1}'
    assert list(jsonl_lines(content)) == [(1, '{"a": "x\u2028y"}\r'), (4, '{"b": 1}')]
    assert jsonl(["{}", "[]"]) == b"{}\n[]\n"


def test_files_past_their_expiry_are_forgotten_and_the_rest_kept():
    @dataclass
    class File:
        expires_at: float | None

    files = {"old": File(100), "due": File(200), "new": File(300), "forever": File(None)}
    forget_expired(files, 200)
    assert sorted(files) == ["forever", "new"]


def test_nothing_is_announced_without_a_webhook_url():
    announcer = Announcer(name="test", lock=threading.RLock(), advance=lambda: None)
    announcer.announce(FaultKnobs(), "batch.completed", "b1", {"id": "evt"})
    announcer.announce(FaultKnobs(webhook_url="http://127.0.0.1:9/h"), "batch.completed", "b2", {"id": "e"})
    assert [webhook.unit for webhook in announcer._outbox] == ["b2"]


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_every_route_names_a_method_of_its_emulator(protocol):
    emulator = emulator_class(protocol)()
    for route in emulator.routes:
        method, path, endpoint = route.split(" ")
        assert method in {"GET", "POST", "DELETE"} and path.startswith("/"), route
        assert callable(getattr(emulator, endpoint)), route
