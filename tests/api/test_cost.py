"""The price table and what a job's drafts cost (SPEC §9)."""

import json
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ledger.models import GeneratedVersion, Item
from ledger.money.pricing import (
    BUILT_IN,
    check_price_file,
    job_cost,
    jobs_cost,
    price_for,
    total_draft_spend,
    version_cost,
)
from ledger.states import ItemState
from tests.api.conftest import ApiClient
from tests.factories import ItemFactory, JobFactory, add_version

pytestmark = pytest.mark.django_db


def listed(provider: str, model: str) -> tuple[Decimal, Decimal]:
    return BUILT_IN[provider].models[model]


@pytest.mark.parametrize(
    "provider, model, expected, discount",
    [
        ("openai", "gpt-4o-mini", listed("openai", "gpt-4o-mini"), "0.5"),
        ("openai", "gpt-4o-mini-2024-07-18", listed("openai", "gpt-4o-mini"), "0.5"),
        ("openai", "gpt-4o-2024-08-06", listed("openai", "gpt-4o"), "0.5"),
        ("emulator", "gpt-4o", listed("openai", "gpt-4o"), "0.5"),
        ("anthropic", "claude-sonnet-4-20250514", listed("anthropic", "claude-sonnet-4"), "0.5"),
        ("anthropic", "claude-sonnet-4-5-20250929", listed("anthropic", "claude-sonnet-4-5"), "0.5"),
        ("anthropic", "claude-3-5-haiku-latest", listed("anthropic", "claude-3-5-haiku"), "0.5"),
        ("gemini", "gemini-2.5-flash", listed("gemini", "gemini-2.5-flash"), "0.5"),
        ("gemini", "models/gemini-2.0-flash-001", listed("gemini", "gemini-2.0-flash"), "0.5"),
        (
            "cloudflare",
            "@cf/meta/llama-3.3-70b-instruct-fp8-fast",
            listed("cloudflare", "@cf/meta/llama-3.3-70b-instruct-fp8-fast"),
            "0",
        ),
        ("openai_compatible", "any-model-a-server-names", (Decimal(0), Decimal(0)), "0"),
    ],
)
def test_the_price_of_a_model_and_its_providers_discount(provider, model, expected, discount):
    price = price_for(provider, model)
    assert (price.input_per_million, price.output_per_million) == expected
    assert price.batch_discount == Decimal(discount)


def test_cloudflare_says_why_no_discount_is_assumed():
    assert "no batch discount" in price_for("cloudflare", "@cf/meta/llama-3.3-70b-instruct-fp8-fast").note


@pytest.mark.parametrize(
    "provider, model",
    [
        ("emulator", "emulated-model"),
        ("openai", "gpt-4o-mini-turbo"),  # not a snapshot of gpt-4o-mini: never priced like it
        ("anthropic", "claude-sonnet-4-7"),  # not claude-sonnet-4
        ("gemini", "gemini-2.5-flash-preview-05-20"),
        ("cloudflare", "@cf/meta/llama-3.3-70b-instruct-batch"),
        ("carrier-pigeon", "gpt-4o"),
    ],
)
def test_a_model_without_a_known_price_has_none(provider, model):
    assert price_for(provider, model) is None


def test_a_dearer_snapshot_never_borrows_a_cheaper_models_price(settings, tmp_path):
    # With gpt-4o-mini removed from the table, its snapshots are unknown, not priced as gpt-4o.
    settings.BATCHDESK_PRICE_FILE = write(tmp_path, {"openai": {"models": {"gpt-4o-mini": None}}})
    assert price_for("openai", "gpt-4o-mini-2024-07-18") is None
    assert price_for("openai", "gpt-4o") is not None


def test_a_version_costs_its_tokens_at_the_batch_discount():
    version = add_version(ItemFactory(job=JobFactory(model="gpt-4o"), awaiting_review=True))
    # 120 input and 60 output tokens at 2.50 and 10.00 per million, halved.
    assert version_cost(version) == Decimal("0.000450")


def test_a_jobs_spend_is_split_into_approved_pending_and_wasted():
    job = JobFactory()
    approved = ItemFactory(job=job, approved=True)
    Item.objects.filter(pk=approved.pk).update(approved_version=add_version(approved))
    regenerated = ItemFactory(job=job, awaiting_review=True)
    add_version(regenerated)  # replaced by the next one: wasted
    add_version(regenerated)  # to be decided on: pending
    add_version(ItemFactory(job=job, state=ItemState.REJECTED))
    obsolete = ItemFactory(job=job, state=ItemState.OBSOLETE)
    Item.objects.filter(pk=obsolete.pk).update(approved_version=add_version(obsolete))
    ItemFactory(job=JobFactory())  # another job's
    # A million of each: (0.15 + 0.60) / 2 = 0.375 a version.
    GeneratedVersion.objects.update(input_tokens=1_000_000, output_tokens=1_000_000)
    cost = job_cost(job)
    assert {
        k: cost[k] for k in ("total", "approved", "pending", "wasted", "per_item", "per_approved_draft")
    } == {
        "total": Decimal("1.875"),
        "approved": Decimal("0.375"),
        "pending": Decimal("0.375"),
        "wasted": Decimal("1.125"),
        "per_item": Decimal("0.46875"),
        "per_approved_draft": Decimal("1.875"),
    }
    assert total_draft_spend() == Decimal("1.875")


def test_a_job_without_drafts_costs_nothing():
    job = JobFactory()
    cost = job_cost(job)
    assert cost["total"] == cost["wasted"] == Decimal(0)
    assert cost["per_item"] is None and cost["per_approved_draft"] is None


def test_costs_take_the_same_queries_however_many_jobs_and_versions():
    jobs = JobFactory.create_batch(3)
    for job in jobs:
        for _ in range(3):
            add_version(ItemFactory(job=job, awaiting_review=True))
    with CaptureQueriesContext(connection) as queries:
        costs = jobs_cost([job.pk for job in jobs])
    # Tallies, jobs, their units' kept rates and today's rate: four, whatever the number of jobs.
    assert len(queries) == 4 and set(costs) == {job.pk for job in jobs}


# --- the price file --------------------------------------------------------------------------


def write(tmp_path, data, name: str = "prices.json") -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return str(path)


def test_a_price_file_overrides_and_extends_the_table(settings, tmp_path):
    settings.BATCHDESK_PRICE_FILE = write(
        tmp_path,
        {
            "_source": "our contract, 2026-11",
            "openai": {
                "batch_discount_percent": 40,
                "models": {
                    "gpt-4o": {"input_per_million": "2.00", "output_per_million": 8},
                    "gpt-9": {"input_per_million": 0.5, "output_per_million": "1.5"},
                },
            },
            "cloudflare": {
                "models": {
                    "@cf/meta/llama-3.3-70b-instruct-batch": {
                        "input_per_million": "0.2",
                        "output_per_million": "1",
                    }
                }
            },
        },
    )
    gpt_4o = price_for("emulator", "gpt-4o")  # the emulator follows OpenAI's prices
    assert (gpt_4o.input_per_million, gpt_4o.output_per_million) == (Decimal("2.00"), Decimal(8))
    assert gpt_4o.batch_discount == Decimal("0.4") and gpt_4o.discount_percent == 40
    assert price_for("openai", "gpt-9").output_per_million == Decimal("1.5")
    # Untouched models and providers keep the built-in prices.
    mini = price_for("openai", "gpt-4o-mini")
    assert (mini.input_per_million, mini.output_per_million) == listed("openai", "gpt-4o-mini")
    batch = price_for("cloudflare", "@cf/meta/llama-3.3-70b-instruct-batch")
    assert batch.input_per_million == Decimal("0.2") and batch.batch_discount == 0
    assert check_price_file() == []


def test_a_self_hosted_server_may_be_given_a_price(settings, tmp_path):
    settings.BATCHDESK_PRICE_FILE = write(
        tmp_path,
        {"openai_compatible": {"models": {"*": {"input_per_million": 0.02, "output_per_million": 0.02}}}},
    )
    assert price_for("openai_compatible", "llama").cost(1_000_000, 1_000_000) == Decimal("0.04")


@pytest.mark.parametrize(
    "content, problem",
    [
        ("{not json", "not valid JSON"),
        ({"opneai": {}}, "opneai: not a provider; expected one of anthropic, cloudflare"),
        ({"emulator": {}}, "emulator: is priced like openai"),
        ({"openai": {"discount": 50}}, "openai: unknown key 'discount'"),
        ({"openai": {"batch_discount_percent": 150}}, "openai.batch_discount_percent: at most 100"),
        ({"openai": {"models": {"gpt-4o": {"input_per_million": 1}}}}, "output_per_million is missing"),
        (
            {"openai": {"models": {"gpt-4o": {"input_per_million": -1, "output_per_million": 1}}}},
            "openai.models.gpt-4o.input_per_million: must be a number of USD of 0 or more",
        ),
        (
            {"openai": {"models": {"gpt-4o": {"input_per_million": "cheap", "output_per_million": 1}}}},
            "must be a number of USD, not 'cheap'",
        ),
        ({"openai": {"models": {"gpt-4o": 3}}}, "openai.models.gpt-4o: must be a JSON object"),
        ([], "the file: must be a JSON object"),
    ],
)
def test_a_bad_price_file_is_a_clear_error_at_startup(settings, tmp_path, content, problem):
    settings.BATCHDESK_PRICE_FILE = write(tmp_path, content)
    [error] = check_price_file()
    assert error.id == "batchdesk.E001" and error.is_serious()
    assert settings.BATCHDESK_PRICE_FILE in error.msg and problem in error.msg, error.msg


def test_a_missing_price_file_is_a_clear_error_at_startup(settings, tmp_path):
    settings.BATCHDESK_PRICE_FILE = str(tmp_path / "nowhere.json")
    [error] = check_price_file()
    assert "cannot be read" in error.msg


def test_the_system_check_runs_with_every_command(settings, tmp_path):
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    settings.BATCHDESK_PRICE_FILE = write(tmp_path, {"openai": {"models": {"gpt-4o": "free"}}})
    with pytest.raises(SystemCheckError, match="openai.models.gpt-4o: must be a JSON object"):
        call_command("check")


def test_a_price_file_changed_while_running_is_read_again_and_a_bad_one_never_fails_a_request(
    settings, tmp_path
):
    path = settings.BATCHDESK_PRICE_FILE = write(
        tmp_path, {"openai": {"models": {"gpt-4o": {"input_per_million": 1, "output_per_million": 2}}}}
    )
    assert price_for("openai", "gpt-4o").input_per_million == 1
    write(tmp_path, {"openai": {"models": {"gpt-4o": {"input_per_million": 3, "output_per_million": 4}}}})
    assert price_for("openai", "gpt-4o").input_per_million == 3
    write(tmp_path, "{broken")
    assert price_for("openai", "gpt-4o").input_per_million == 3  # the last good reading stays
    assert check_price_file()  # and the next start refuses it
    settings.BATCHDESK_PRICE_FILE = write(tmp_path, "{broken", name="never-good.json")
    assert price_for("openai", "gpt-4o") is None  # never read well: nothing is priced by guesswork
    assert path


# --- a model without a known price -----------------------------------------------------------


def test_a_job_whose_model_has_no_price_says_so_with_null_amounts():
    job = JobFactory(model="emulated-model")
    add_version(ItemFactory(job=job, awaiting_review=True))
    cost = job_cost(job)
    assert cost["price_known"] is False and cost["price"] is None
    assert cost["price_note"] == "price unknown for emulator/emulated-model"
    assert all(cost[key] is None for key in ("total", "approved", "pending", "wasted", "per_item"))
    assert (cost["input_tokens"], cost["output_tokens"]) == (120, 60)
    assert total_draft_spend() == 0


def test_the_api_says_a_price_is_unknown_and_keeps_its_keys(api_as, owner):
    known, unknown = JobFactory(), JobFactory(model="emulated-model")
    for job in (known, unknown):
        add_version(ItemFactory(job=job, awaiting_review=True))
    client: ApiClient = api_as(owner)
    known_cost = client.get(f"/api/jobs/{known.pk}").json()["cost"]
    unknown_cost = client.get(f"/api/jobs/{unknown.pk}").json()["cost"]
    assert set(unknown_cost) == set(known_cost)
    assert known_cost["price_known"] is True and known_cost["total"] == "0.000027"
    assert known_cost["price"]["batch_discount_percent"] == "50"
    assert unknown_cost["price_known"] is False
    assert unknown_cost["price_note"] == "price unknown for emulator/emulated-model"
    assert unknown_cost["total"] is None and unknown_cost["per_approved_draft"] is None
    item = unknown.items.get()
    [version] = client.get(f"/api/items/{item.pk}").json()["versions"]
    assert version["cost"] is None and version["price_known"] is False
    assert version["price_note"] == "price unknown for emulator/emulated-model"


def test_apportioned_usage_is_marked_in_the_api(api_as, owner):
    item = ItemFactory(job=JobFactory(), awaiting_review=True)
    shared = add_version(item)
    GeneratedVersion.objects.filter(pk=shared.pk).update(usage={"apportioned": True, "input_tokens": 120})
    own = add_version(item)
    versions = api_as(owner).get(f"/api/items/{item.pk}").json()["versions"]
    assert [v["usage"]["apportioned"] for v in versions] == [True, False]
    assert versions[0]["usage"]["input_tokens"] == 120 and versions[0]["cost"] is not None
    assert job_cost(item.job)["apportioned_drafts"] == 1
    assert own.pk == versions[1]["id"]
