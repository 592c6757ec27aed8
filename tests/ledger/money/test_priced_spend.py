"""`priced_spend`: the one rule by which `/metrics` prices every draft and the dashboard the day's."""

from decimal import Decimal

from ledger.money.pricing import DraftSpend, priced_spend


def test_tokens_are_priced_at_their_models_batch_price_and_summed():
    spend = priced_spend(
        [
            # 1M input and 1M output tokens at 0.15 and 0.60 per million, halved.
            ("openai", "gpt-4o-mini", 1_000_000, 1_000_000),
            # 120 input and 60 output tokens at 2.50 and 10.00 per million, halved.
            ("openai", "gpt-4o", 120, 60),
        ]
    )
    assert spend == DraftSpend(Decimal("0.375450"), {})


def test_a_model_without_a_price_is_counted_in_tokens_not_in_the_total():
    spend = priced_spend([("openai", "no-such-model", 100, 20), ("openai", "gpt-4o", 120, 60)])
    assert spend.total == Decimal("0.000450")
    assert spend.unpriced_tokens == {("openai", "no-such-model"): 120}


def test_no_drafts_cost_nothing():
    assert priced_spend([]) == DraftSpend(Decimal("0.000000"), {})
