"""The `admin` group manages people, not the machine (issue 17, point 5): each attack of the issue as
the POST a browser would send, or one forged by hand, by a member of the group who is no superuser."""

import json
from datetime import date, timedelta
from decimal import Decimal

import pytest
from django.contrib import admin
from django.contrib.auth.models import Group, Permission, User
from django.http import HttpResponse
from django.test import RequestFactory
from django.urls import reverse
from django.utils import timezone
from django_q.models import Failure, OrmQ, Schedule, Success

from ledger.models import ExchangeRate, UnitCharge
from ledger.money.currency import check_rate_file, in_business_currency, rate_on
from tests.api.test_charges import settle_unit
from tests.factories import ItemFactory, JobFactory, UserFactory, add_version

pytestmark = pytest.mark.django_db

SECRET_RESULT = "sk-test-result-that-must-stay-hidden"


@pytest.fixture
def chief(client) -> User:
    """A member of the `admin` group, signed in; no staff flag (the group lets them into /admin/)."""
    person = UserFactory(username="chief", roles=["admin"], is_staff=False)
    client.force_login(person)
    return person


def role_ids(*names: str) -> list[int]:
    return [Group.objects.get(name=name).pk for name in names]


def change_form(person: User, **changes) -> dict:
    """What the user change page posts for `person`, with `changes` on top."""
    form = {
        "username": person.username,
        "first_name": person.first_name,
        "last_name": person.last_name,
        "email": person.email,
        "is_active": "on",
        "groups": [group.pk for group in person.groups.all()],
        "last_login_0": "",
        "last_login_1": "",
        "date_joined_0": "2026-12-01",
        "date_joined_1": "12:00:00",
    }
    form.update(changes)
    return {name: value for name, value in form.items() if value is not None}


def powers(person: User) -> tuple:
    person = User.objects.get(pk=person.pk)
    return (
        person.is_superuser,
        person.is_staff,
        sorted(person.user_permissions.values_list("codename", flat=True)),
        sorted(person.groups.values_list("name", flat=True)),
        person.password,
    )


def user_url(person: User, view: str = "change") -> str:
    return reverse(f"admin:auth_user_{view}", args=[person.pk])


# --- people ---------------------------------------------------------------------------------


def test_an_admin_adds_people_deactivates_them_and_gives_them_roles(client, chief):
    added = client.post(
        reverse("admin:auth_user_add"),
        {
            "username": "newcomer",
            "usable_password": "true",
            "password1": "lantern-orchard-47",
            "password2": "lantern-orchard-47",
            "is_superuser": "on",  # forged: the add form has no such field
            "is_staff": "on",
        },
    )
    assert added.status_code == 302
    newcomer = User.objects.get(username="newcomer")
    assert not newcomer.is_superuser and not newcomer.is_staff

    page = client.get(user_url(newcomer)).content.decode()
    assert 'name="groups"' in page and 'name="is_active"' in page
    for hidden in ("is_superuser", "is_staff", "user_permissions"):
        assert f'name="{hidden}"' not in page
    response = client.post(
        user_url(newcomer),
        change_form(newcomer, is_active=None, groups=role_ids("catalogue_owner", "operator", "admin")),
    )
    assert response.status_code == 302
    newcomer.refresh_from_db()
    assert not newcomer.is_active
    assert sorted(newcomer.groups.values_list("name", flat=True)) == ["admin", "catalogue_owner", "operator"]


def test_an_admin_cannot_make_themselves_a_superuser_by_a_forged_post(client, chief):
    everything = list(Permission.objects.values_list("pk", flat=True))
    before = powers(chief)
    response = client.post(
        user_url(chief),
        change_form(
            chief,
            first_name="Chief",
            is_superuser="on",
            is_staff="on",
            user_permissions=everything,
        ),
    )
    # The form saved what it has (the name) and ignored what it does not have.
    assert response.status_code == 302
    chief.refresh_from_db()
    assert chief.first_name == "Chief"
    assert powers(chief) == before


def test_an_admin_gives_only_the_three_roles(client, chief):
    machine = Group.objects.create(name="machine")
    machine.permissions.set(Permission.objects.filter(content_type__app_label="django_q"))
    person = UserFactory(roles=["operator"])
    page = client.get(user_url(person)).content.decode()
    assert "machine" not in page
    before = powers(person)
    response = client.post(user_url(person), change_form(person, groups=[machine.pk]))
    assert response.status_code == 200  # the form again, with the refusal
    assert "Select a valid choice" in response.content.decode()
    assert powers(person) == before


@pytest.mark.parametrize(
    "powerful",
    [
        {"is_superuser": True, "is_staff": True},
        {"is_staff": True},
        {"permissions": ["add_schedule"]},
        {"group": "machine"},
    ],
    ids=["superuser", "staff", "own permission", "other group"],
)
def test_an_admin_cannot_change_or_take_over_someone_holding_more_than_a_role(client, chief, powerful):
    person = UserFactory(
        roles=["admin"],
        is_superuser=powerful.get("is_superuser", False),
        is_staff=powerful.get("is_staff", False),
    )
    person.user_permissions.set(Permission.objects.filter(codename__in=powerful.get("permissions", [])))
    if "group" in powerful:
        person.groups.add(Group.objects.create(name=powerful["group"]))
    before = powers(person)
    # They may look (the change page shows without a save button), never change.
    page = client.get(user_url(person))
    assert page.status_code == 200 and 'name="_save"' not in page.content.decode()
    changed = client.post(user_url(person), change_form(person, is_active=None, groups=role_ids("operator")))
    assert changed.status_code == 403
    new_password = {"password1": "lantern-orchard-47", "password2": "lantern-orchard-47"}
    assert client.get(user_url(person, "password_change")).status_code == 403
    assert client.post(user_url(person, "password_change"), new_password).status_code == 403
    assert client.post(user_url(person, "delete"), {"post": "yes"}).status_code == 403
    bulk_delete = {"action": "delete_selected", "_selected_action": [person.pk], "post": "yes"}
    client.post(reverse("admin:auth_user_changelist"), bulk_delete)
    assert powers(person) == before
    assert User.objects.get(pk=person.pk).is_active


def test_an_admin_cannot_change_what_a_role_may_do(client, chief):
    admin_role = Group.objects.get(name="admin")
    everything = list(Permission.objects.values_list("pk", flat=True))
    assert client.get(reverse("admin:auth_group_change", args=[admin_role.pk])).status_code == 200
    response = client.post(
        reverse("admin:auth_group_change", args=[admin_role.pk]),
        {"name": "admin", "permissions": everything},
    )
    assert response.status_code == 403
    assert not admin_role.permissions.exists()
    added = client.post(reverse("admin:auth_group_add"), {"name": "root", "permissions": everything})
    assert added.status_code == 403
    assert not Group.objects.filter(name="root").exists()
    deleted = client.post(reverse("admin:auth_group_delete", args=[admin_role.pk]), {"post": "yes"})
    assert deleted.status_code == 403
    assert Group.objects.filter(name="admin").exists()


# --- the machine ----------------------------------------------------------------------------


@pytest.fixture
def task_results():
    """A finished task and a failed one, whose results hold what an `os.getenv` would have shown."""
    now = timezone.now()
    common = {"func": "os.getenv", "args": ("OPENAI_API_KEY",), "started": now, "stopped": now}
    return (
        Success.objects.create(id="a" * 32, name="leak-one", result=SECRET_RESULT, success=True, **common),
        Failure.objects.create(id="b" * 32, name="leak-two", result=SECRET_RESULT, success=False, **common),
    )


def test_an_admin_cannot_add_a_schedule_that_runs_a_command(client, chief):
    assert client.get(reverse("admin:django_q_schedule_add")).status_code == 403
    response = client.post(
        reverse("admin:django_q_schedule_add"),
        {
            "name": "pwn",
            "func": "os.system",
            "args": "'id > /tmp/pwned'",
            "schedule_type": Schedule.ONCE,
            "repeats": "-1",
            "next_run_0": "2026-12-01",
            "next_run_1": "12:00:00",
        },
    )
    assert response.status_code == 403
    assert not Schedule.objects.filter(func="os.system").exists()


def test_an_admin_cannot_change_or_delete_the_schedules_there_are(client, chief):
    schedule = Schedule.objects.create(name="retention", func="ledger.tasks.apply_retention")
    url = reverse("admin:django_q_schedule_change", args=[schedule.pk])
    assert client.get(url).status_code == 403
    assert client.post(url, {"name": "retention", "func": "os.system"}).status_code == 403
    assert (
        client.post(
            reverse("admin:django_q_schedule_delete", args=[schedule.pk]), {"post": "yes"}
        ).status_code
        == 403
    )
    schedule.refresh_from_db()
    assert schedule.func == "ledger.tasks.apply_retention"


def test_an_admin_sees_no_task_result_and_resubmits_nothing(client, chief, task_results):
    index = client.get(reverse("admin:index")).content.decode()
    assert "django_q" not in index and "Schedule" not in index
    queued = OrmQ.objects.count()
    for task in task_results:
        kind = task._meta.model_name
        assert client.get(reverse(f"admin:django_q_{kind}_changelist")).status_code == 403
        page = client.get(reverse(f"admin:django_q_{kind}_change", args=[task.pk]))
        assert page.status_code == 403 and SECRET_RESULT not in page.content.decode()
        resubmit = {"action": "resubmit_task", "_selected_action": [task.pk]}
        assert client.post(reverse(f"admin:django_q_{kind}_changelist"), resubmit).status_code == 403
    assert client.get(reverse("admin:django_q_ormq_changelist")).status_code == 403
    assert OrmQ.objects.count() == queued
    assert Success.objects.count() == 1 and Failure.objects.count() == 1


def test_staff_given_django_q_permissions_by_hand_still_do_not_reach_it(client, task_results):
    staff = UserFactory(is_staff=True)
    staff.user_permissions.set(Permission.objects.filter(content_type__app_label="django_q"))
    client.force_login(staff)
    assert client.get(reverse("admin:django_q_schedule_changelist")).status_code == 403
    assert client.get(reverse("admin:django_q_success_changelist")).status_code == 403
    assert client.post(reverse("admin:django_q_schedule_add"), {"func": "os.system"}).status_code == 403
    assert not Schedule.objects.filter(func="os.system").exists()


def test_a_superuser_still_keeps_the_machine(client, task_results):
    client.force_login(UserFactory(is_superuser=True, is_staff=True))
    assert client.get(reverse("admin:django_q_schedule_add")).status_code == 200
    success = client.get(reverse("admin:django_q_success_change", args=[task_results[0].pk]))
    assert success.status_code == 200 and SECRET_RESULT in success.content.decode()
    page = client.get(user_url(UserFactory())).content.decode()
    assert 'name="is_superuser"' in page and 'name="user_permissions"' in page


def test_the_only_things_an_admin_may_add_or_change_are_people(client, chief):
    """Every page of the admin, walked: a model admin registered tomorrow (one with a `func` field,
    say) is caught here unless it is read-only for the `admin` group."""
    request = RequestFactory().get("/admin/")
    request.user = chief
    writable = {
        model._meta.label
        for model, model_admin in admin.site._registry.items()
        if model_admin.has_add_permission(request) or model_admin.has_change_permission(request)
    }
    # People, and exchange rates (SPEC §9: an admin may enter a rate), which may be added, never changed.
    assert writable == {"auth.User", "ledger.ExchangeRate"}
    for model in admin.site._registry:
        add_url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_add")
        expected = 200 if model in (User, ExchangeRate) else 403
        assert client.get(add_url).status_code == expected, model


def test_an_admin_enters_an_exchange_rate_that_converts_costs_from_its_date(client, chief, settings):
    settings.BATCHDESK_CURRENCY, settings.BATCHDESK_FX_FILE = "GBP", ""
    add = reverse("admin:ledger_exchangerate_add")
    refused = client.post(
        add, {"currency": "gbp", "valid_from": "2026-11-28", "per_usd": "-1", "source": "x"}
    )
    assert refused.status_code == 200 and not ExchangeRate.objects.exists()  # the form shows the errors
    answer = client.post(
        add, {"currency": "GBP", "valid_from": "2026-11-28", "per_usd": "0.7912", "source": "Bank of England"}
    )

    assert answer.status_code == 302
    rate = ExchangeRate.objects.get()
    assert rate.entered_by == chief
    assert rate_on(date(2026, 11, 30)).per_usd == Decimal("0.7912")
    assert "entered by chief" in rate_on(date(2026, 11, 30)).source
    assert rate_on(date(2026, 11, 27)) is None
    # Never changed nor deleted: a wrong rate is corrected by a newer one.
    change = reverse("admin:ledger_exchangerate_change", args=[rate.pk])
    assert client.post(change, {"per_usd": "9"}).status_code == 403
    assert (
        client.post(reverse("admin:ledger_exchangerate_delete", args=[rate.pk]), {"post": "yes"}).status_code
        == 403
    )
    assert ExchangeRate.objects.get().per_usd == Decimal("0.7912")


def entered(client, **form) -> HttpResponse:
    """The admin's add page for exchange rates, posted as its form is sent."""
    return client.post(
        reverse("admin:ledger_exchangerate_add"), {"currency": "GBP", "source": "desk", **form}
    )


@pytest.mark.parametrize(
    ("per_usd", "valid_from", "field", "words"),
    [
        # Found by attacking issue 28: the form took both (the rate file refuses a rate ≥ 1,000,000).
        ("1e9", "2020-01-01", "per_usd", "must be a number above 0 and below 1,000,000"),
        ("0.7", "0001-01-01", "valid_from", "0001-01-01 is before 2000-01-01"),
        ("1000000", "2020-01-01", "per_usd", "below 1,000,000"),
        ("0", "2020-01-01", "per_usd", "above 0"),
        ("0.7", "1999-12-31", "valid_from", "1999-12-31 is before 2000-01-01"),
        ("0.7", "tomorrow", "valid_from", "is in the future"),
    ],
)
def test_an_admins_rate_is_held_to_the_rate_files_rule_and_a_bad_one_saves_nothing(
    client, chief, settings, per_usd, valid_from, field, words
):
    settings.BATCHDESK_CURRENCY, settings.BATCHDESK_FX_FILE = "GBP", ""
    if valid_from == "tomorrow":
        valid_from = (timezone.localdate() + timedelta(days=1)).isoformat()

    refused = entered(client, per_usd=per_usd, valid_from=valid_from)

    assert refused.status_code == 200  # the form again, with its errors
    errors = refused.context["adminform"].form.errors
    assert list(errors) == [field] and words in errors[field][0]
    assert words in refused.content.decode()
    assert not ExchangeRate.objects.exists()


def test_a_rate_the_file_would_refuse_is_refused_by_the_same_rule(tmp_path, settings):
    """One rule in one place: the file's loader says the admin form's words."""
    path = tmp_path / "rates.json"
    settings.BATCHDESK_CURRENCY, settings.BATCHDESK_FX_FILE = "GBP", str(path)
    tomorrow = (timezone.localdate() + timedelta(days=1)).isoformat()
    for per_usd, words in (
        ({"0001-01-01": "0.7"}, "0001-01-01 is before 2000-01-01"),
        ({tomorrow: "0.7"}, f"{tomorrow} is in the future"),
        ({"2020-01-01": "1e9"}, "must be a number above 0 and below 1,000,000"),
    ):
        path.write_text(json.dumps({"source": "bank", "per_usd": per_usd}))
        [error] = check_rate_file()
        assert error.id == "batchdesk.E003" and words in error.msg


def test_an_admins_rate_is_corrected_by_a_newer_entry_kept_beside_it_and_settled_costs_keep_theirs(
    client, chief, settings
):
    settings.BATCHDESK_CURRENCY, settings.BATCHDESK_FX_FILE = "GBP", ""
    quoted = (timezone.localdate() - timedelta(days=8)).isoformat()
    assert entered(client, per_usd="0.7912", valid_from=quoted, source="typed wrong").status_code == 302
    job = JobFactory()
    before = settle_unit(job, [add_version(ItemFactory(job=job, awaiting_review=True))], "before")
    assert (before.rate, before.rate_date.isoformat()) == (Decimal("0.7912"), quoted)

    assert entered(client, per_usd="0.8000", valid_from=quoted, source="corrected").status_code == 302

    original, correction = ExchangeRate.objects.order_by("pk")
    assert (original.per_usd, correction.per_usd) == (Decimal("0.7912"), Decimal("0.8"))
    assert original.valid_from == correction.valid_from and correction.entered_by == chief
    # Conversions from then on use the correction; the unit settled before keeps what it was settled at.
    assert rate_on(timezone.localdate()).per_usd == Decimal("0.8")
    assert in_business_currency(Decimal("10")).amount == Decimal("8")
    after = settle_unit(job, [add_version(ItemFactory(job=job, awaiting_review=True))], "after")
    assert after.rate == Decimal("0.8")
    kept = UnitCharge.objects.get(pk=before.pk)
    assert (kept.rate, kept.cost, kept.rate_source) == (before.rate, before.cost, before.rate_source)
    assert "typed wrong" in kept.rate_source
    # Both rows are listed, the first marked as corrected by the second.
    listing = client.get(reverse("admin:ledger_exchangerate_changelist")).content.decode()
    assert "0.79120000" in listing and "0.80000000" in listing
    assert f"no: corrected by entry {correction.pk}" in listing
    assert listing.count("no: corrected by entry") == 1
